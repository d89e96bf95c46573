//! `rgpu migrate --from X --to Y`: the operator of server X moves every program's sessions on
//! it to server Y while the programs run (docs/migration.md). Run on X's host as the user X
//! runs as, or root; the token and TLS settings are a client's (RGPU_TOKEN_FILE, RGPU_TLS_*).

use std::process::ExitCode;

use rgpu_client::{ClientConfig, Connection, Endpoint};
use rgpu_protocol::session::SessionClient;

#[derive(clap::Args, Debug)]
#[command(about = "Move the running programs' sessions from one server to another")]
pub struct MigrateArgs {
    /// The server whose sessions move (on this host; as clients name it, e.g. 127.0.0.1:7070).
    #[arg(long, value_name = "SERVER")]
    from: String,
    /// The server they move to, as the programs will reach it.
    #[arg(long, value_name = "SERVER")]
    to: String,
    /// How long to wait for the sessions to have left the first server (each program drains
    /// its queued work first, then moves).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    wait: u32,
}

/// Below the client's reply timeout (RGPU_TIMEOUT, 600 s by default).
const MAX_WAIT_SECONDS: u32 = 500;

pub fn run(args: MigrateArgs) -> Result<ExitCode, String> {
    let from = Endpoint::parse(&args.from).map_err(|e| format!("--from {}: {e}", args.from))?;
    Endpoint::parse(&args.to).map_err(|e| format!("--to {}: {e}", args.to))?;
    let config = ClientConfig::from_env()?;
    let conn = Connection::connect(&from, &config).map_err(|e| e.to_string())?;
    let wait_ms = args.wait.min(MAX_WAIT_SECONDS) * 1000;
    let start = std::time::Instant::now();
    match conn.session().move_sessions(args.to.clone(), wait_ms) {
        Ok(Ok((told, moved))) => {
            println!(
                "{moved} of {told} session(s) on {from} moved to {} ({:.2} s)",
                args.to,
                start.elapsed().as_secs_f64()
            );
            if moved < told {
                println!(
                    "the others stay on {from}: their programs log why (RGPU_LOG=warn), or \
                     they are still draining their work"
                );
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
        Ok(Err(1)) => Err(format!(
            "{from} takes move orders only from its operator: a process on its host running \
             as the server's user or root"
        )),
        Ok(Err(code)) => Err(format!("{from} did not pass the order on (status {code})")),
        Err(e) => Err(e.to_string()),
    }
}
