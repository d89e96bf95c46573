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
}

pub fn run(args: MigrateArgs) -> Result<ExitCode, String> {
    let from = Endpoint::parse(&args.from).map_err(|e| format!("--from {}: {e}", args.from))?;
    Endpoint::parse(&args.to).map_err(|e| format!("--to {}: {e}", args.to))?;
    let config = ClientConfig::from_env()?;
    let conn = Connection::connect(&from, &config).map_err(|e| e.to_string())?;
    match conn.session().move_sessions(args.to.clone()) {
        Ok(Ok(told)) => {
            println!(
                "told {told} session(s) on {from} to move to {}; each program moves what it can \
                 and logs what it could not (its sessions on {from} end once moved)",
                args.to
            );
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
