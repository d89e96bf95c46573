//! A local `rgpu server` child process for `rgpu bench` when no servers are given.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

use rgpu_server::{CERTIFICATE_PREFIX, LISTENING_PREFIX};

/// How long the server gets to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The running server; stopped when dropped.
pub struct LocalServer {
    child: Child,
    endpoint: String,
    /// Its TLS certificate's fingerprint, from its log.
    fingerprint: Option<String>,
}

impl LocalServer {
    /// The servers to benchmark against: `given`, else a local server started for the run
    /// (returned too, so that it lives as long as the measurements).
    pub fn unless_given(given: Option<&str>) -> Result<(String, Option<LocalServer>), String> {
        match given {
            Some(list) => Ok((list.to_string(), None)),
            None => {
                eprintln!("starting a local rgpu server...");
                let server = LocalServer::start()?;
                // Its own child: trusted, so its certificate is pinned for RGPU_TLS=on runs
                // (no thread has started yet to read the environment meanwhile).
                if let Some(fingerprint) = &server.fingerprint {
                    if std::env::var_os("RGPU_TLS_FINGERPRINT").is_none() {
                        std::env::set_var("RGPU_TLS_FINGERPRINT", fingerprint);
                    }
                }
                Ok((server.endpoint().to_string(), Some(server)))
            }
        }
    }

    /// Starts `rgpu server` (this same executable) on a free loopback port and waits for its
    /// "listening" line. It inherits this process's environment, so call this before
    /// [`crate::ClientSetup::apply`]: the server must see the machine's
    /// platforms, not the rgpu one.
    pub fn start() -> Result<LocalServer, String> {
        LocalServer::start_with(&[])
    }

    /// [`LocalServer::start`] with more environment for the server (which GPUs it sees).
    pub fn start_with(env: &[(&str, &str)]) -> Result<LocalServer, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot locate rgpu: {e}"))?;
        let mut child = Command::new(exe)
            .args(["server", "--listen", "127.0.0.1:0"])
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start a local rgpu server: {e}"))?;
        let stderr = child.stderr.take().expect("stderr is piped");
        // Read on this thread: no other thread exists yet when the caller then changes the
        // environment. A server that fails to start exits, which ends the read.
        let mut lines = BufReader::new(stderr);
        let mut before_listening = Vec::new();
        let mut fingerprint = None;
        let endpoint = loop {
            let mut line = String::new();
            match lines.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = child.wait();
                    return Err(format!(
                        "the local rgpu server did not start:\n{}",
                        before_listening.join("")
                    ));
                }
                Ok(_) => {}
            }
            if let Some(endpoint) = line.trim_end().strip_prefix(LISTENING_PREFIX) {
                break endpoint.to_string();
            }
            if let Some(found) = line.trim_end().strip_prefix(CERTIFICATE_PREFIX) {
                fingerprint = Some(found.to_string());
            }
            before_listening.push(line);
        };
        let server = LocalServer {
            child,
            endpoint,
            fingerprint,
        };
        server.drain_log(lines);
        Ok(server)
    }

    /// Keeps reading the server's log so it never blocks on a full pipe; shown with -vv.
    fn drain_log(&self, lines: BufReader<ChildStderr>) {
        let spawned = std::thread::Builder::new()
            .name("rgpu-bench-server-log".into())
            .spawn(move || {
                for line in lines.lines().map_while(Result::ok) {
                    log::debug!("local server: {line}");
                }
            });
        if let Err(e) = spawned {
            log::warn!("cannot read the local server's log: {e}");
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        // SAFETY: kill() has no memory-safety preconditions; the pid is our unreaped child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        log::warn!("the local rgpu server ignored SIGTERM; killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
