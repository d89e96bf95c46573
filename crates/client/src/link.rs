//! A server of `RGPU_SERVERS` and the session the program has on it, renewed after a loss.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{ClientConfig, Connection, Endpoint};

/// How often a lost server is tried again, at most.
const RECONNECT_INTERVAL: Duration = Duration::from_secs(1);

/// Checks a new session before it replaces a lost one: that the server still serves what the
/// program knows (the same devices), and prepares it (listeners, background flushing). Its
/// error says why the server is not taken back.
pub type Resume = dyn Fn(&Arc<Connection>) -> Result<(), String> + Send + Sync;

/// One server and the program's session on it. When that session is lost (the server
/// restarted, its worker crashed, the network failed), the objects made in it keep failing
/// with the API's device-lost errors, but a new context (OpenCL), or a primary context after a
/// reset or a new context (CUDA), asks for a new session: if the server answers again and
/// still serves the same devices, the new context lives there.
pub struct ServerLink {
    /// The server; another one once the session moved there (live migration).
    endpoint: Mutex<Endpoint>,
    config: ClientConfig,
    resume: Box<Resume>,
    /// The current connection, and when reconnecting last failed.
    current: Mutex<(Arc<Connection>, Option<Instant>)>,
}

impl ServerLink {
    /// A link whose session is `conn` (already checked and prepared).
    pub fn new(
        endpoint: &Endpoint,
        config: &ClientConfig,
        conn: Arc<Connection>,
        resume: impl Fn(&Arc<Connection>) -> Result<(), String> + Send + Sync + 'static,
    ) -> Arc<ServerLink> {
        Arc::new(ServerLink {
            endpoint: Mutex::new(endpoint.clone()),
            config: config.clone(),
            resume: Box::new(resume),
            current: Mutex::new((conn, None)),
        })
    }

    pub fn endpoint(&self) -> Endpoint {
        self.endpoint
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The session moved to `endpoint` (live migration): a lost session is renewed there.
    pub fn moved_to(&self, endpoint: &Endpoint) {
        *self.endpoint.lock().unwrap_or_else(|e| e.into_inner()) = endpoint.clone();
    }

    /// The current connection, alive or not (no reconnection is tried).
    pub fn current(&self) -> Arc<Connection> {
        self.lock().0.clone()
    }

    /// The connection new objects use: the current one, or a new session if it was lost and
    /// the server is back (tried at most once a second).
    pub fn connection(&self) -> Arc<Connection> {
        let mut current = self.lock();
        let (conn, failed_at) = &mut *current;
        if conn.is_alive() || failed_at.is_some_and(|t| t.elapsed() < RECONNECT_INTERVAL) {
            return conn.clone();
        }
        match self.reconnect() {
            Ok(fresh) => {
                log::warn!(
                    "rgpu: server {} is back: new contexts use a new session",
                    self.endpoint()
                );
                *conn = fresh;
                *failed_at = None;
            }
            Err(e) => {
                log::warn!("rgpu: server {} is still lost: {e}", self.endpoint());
                *failed_at = Some(Instant::now());
            }
        }
        conn.clone()
    }

    fn reconnect(&self) -> Result<Arc<Connection>, String> {
        let conn =
            Connection::connect(&self.endpoint(), &self.config).map_err(|e| e.to_string())?;
        (self.resume)(&conn)?;
        Ok(conn)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Arc<Connection>, Option<Instant>)> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}
