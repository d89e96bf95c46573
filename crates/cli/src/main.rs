//! `rgpu`: serve this machine's OpenCL devices, or use remote ones.
//!
//! Each subcommand lives in `commands/`; `rgpu_env` sets up the environment that makes the
//! `rgpu` OpenCL platform appear (used by run, devices and bench).

mod commands;
mod model;
mod rgpu_env;
mod slurm;

use std::process::ExitCode;

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "rgpu",
    version,
    about = "Remote GPU virtualization: use OpenCL devices of other machines as if they were local",
    long_about = "Remote GPU virtualization: an unmodified OpenCL program on this machine uses \
                  OpenCL devices served by `rgpu server` on other machines (or this one), through \
                  an OpenCL platform named `rgpu` that appears beside the local ones.\n\n\
                  Logging: -v (info), -vv (debug), -vvv (trace), or RGPU_LOG=<env_logger filter>."
)]
struct Cli {
    /// More log output (repeat for more).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Server(Box<commands::server::ServerArgs>),
    Run(commands::run::RunArgs),
    Devices(commands::devices::DevicesArgs),
    ClusterStatus(commands::cluster_status::ClusterStatusArgs),
    Bench(rgpu_bench::BenchArgs),
    Token(commands::token::TokenArgs),
    Trace(commands::trace::TraceArgs),
    Model(commands::model::ModelArgs),
    Top(commands::top::TopArgs),
    Migrate(commands::migrate::MigrateArgs),
    /// One session's worker process (started by `rgpu server`, not by hand).
    #[command(name = "server-worker", hide = true)]
    ServerWorker,
}

/// `rgpu --version`: the release and the wire protocol it speaks (a client and a server must
/// speak the same one; a mismatch is refused at connect with both numbers).
fn version() -> String {
    format!(
        "{} (protocol {})",
        env!("CARGO_PKG_VERSION"),
        rgpu_protocol::PROTOCOL_VERSION
    )
}

fn init_logging(verbose: u8, quiet_default: &str) {
    let default = match verbose {
        0 => quiet_default,
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    rgpu_client::log_builder(default, verbose >= 2).init();
}

fn main() -> ExitCode {
    // The matches, not only the parsed values: the server asks them which settings the command
    // line or the environment gave, so that its config file fills in only the others.
    let matches = Cli::command().version(version()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // A server's connection log is its main output; the client commands stay quiet unless
    // something goes wrong.
    let quiet_default = match cli.command {
        Command::Server(_) | Command::ServerWorker => "info",
        _ => "warn",
    };
    init_logging(cli.verbose, quiet_default);

    let result = match cli.command {
        Command::Server(args) => match matches.subcommand_matches("server") {
            Some(server_matches) => commands::server::run(*args, server_matches),
            None => Err("internal: no matches for `server`".to_string()),
        },
        Command::Run(args) => commands::run::run(args),
        Command::Devices(args) => commands::devices::run(args),
        Command::ClusterStatus(args) => commands::cluster_status::run(args),
        Command::Bench(args) => rgpu_bench::run(args, &commands::BenchSetup::default()),
        Command::Token(args) => commands::token::run(args),
        Command::Trace(args) => commands::trace::run(args),
        Command::Model(args) => commands::model::run(args),
        Command::Top(args) => commands::top::run(args),
        Command::Migrate(args) => commands::migrate::run(args),
        Command::ServerWorker => commands::server::run_worker(),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("rgpu: error: {message}");
            ExitCode::FAILURE
        }
    }
}
