//! A program's connection to a server, as every object of the client libraries holds it: the
//! [`ServerSession`] behind it can be replaced, so that the session moves to another server
//! (live migration, docs/migration.md) while every handle the program holds stays valid.
//!
//! The objects keep their ids across the move: ids are the client's choice, and the new
//! session is given every live object again under the same id before the switch. What a
//! connection is asked (its server, its session, its calls) is always the current session's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rgpu_protocol::opencl::Id;
use rgpu_protocol::{ClientMsg, ServerMsg};
use rgpu_transport::Endpoint;

use crate::connection::{ReadSink, ServerSession};
use crate::{ClientConfig, ClientError};

type EventListener = Arc<dyn Fn(Id, i32) + Send + Sync>;
type MoveListener = Arc<dyn Fn(String) + Send + Sync>;

pub struct Connection {
    current: ArcSwap<ServerSession>,
    /// What the program set up on the session, set up again on a session that replaces it.
    event_listener: std::sync::OnceLock<EventListener>,
    move_listener: std::sync::OnceLock<MoveListener>,
    flushes_in_background: AtomicBool,
}

impl Connection {
    /// Connects, checks the protocol version and authenticates (see [`ServerSession::open`]).
    pub fn connect(
        endpoint: &Endpoint,
        config: &ClientConfig,
    ) -> Result<Arc<Connection>, ClientError> {
        let session = ServerSession::connect(endpoint, config)?;
        Ok(Arc::new(Connection {
            current: ArcSwap::new(session),
            event_listener: std::sync::OnceLock::new(),
            move_listener: std::sync::OnceLock::new(),
            flushes_in_background: AtomicBool::new(false),
        }))
    }

    /// The session every call goes to now.
    pub fn current(&self) -> Arc<ServerSession> {
        self.current.load_full()
    }

    /// The session every call goes to now, borrowed for one call (cheaper than an `Arc`: no
    /// shared count is touched, which is what every posted launch pays).
    pub(crate) fn now(&self) -> arc_swap::Guard<Arc<ServerSession>> {
        self.current.load()
    }

    /// Makes `to`'s session this connection's, once every live object of this connection
    /// was made there under its id: from now on every call goes there. `to` is only the
    /// session's carrier and should be dropped (its listeners are not carried over). The old
    /// session ends when the last call still on it returns.
    pub fn take_session_of(&self, to: &Connection) {
        let session = to.current();
        if let Some(listener) = self.event_listener.get() {
            let listener = listener.clone();
            session.set_event_listener(move |id, status| listener(id, status));
        }
        if let Some(listener) = self.move_listener.get() {
            let listener = listener.clone();
            session.set_move_listener(move |to| listener(to));
        }
        if self.flushes_in_background.load(Ordering::Acquire) {
            session.flush_in_background();
        }
        self.current.store(session);
    }

    /// Makes this connection's next ids follow `other`'s, so that objects made here do not
    /// take the ids of `other`'s (a session that will replace `other`'s).
    pub fn continue_ids_of(&self, other: &Connection) {
        self.current()
            .continue_ids_from(other.current().peek_next_id());
    }

    pub fn endpoint(&self) -> Endpoint {
        self.now().endpoint().clone()
    }

    pub fn server_name(&self) -> String {
        self.now().server_name().to_string()
    }

    pub fn session_id(&self) -> u64 {
        self.now().session_id()
    }

    /// A fresh id for an object this client creates on the server.
    pub fn new_id(&self) -> Id {
        self.now().new_id()
    }

    /// Installs the function that receives `EventStatus` notifications (once per connection).
    pub fn set_event_listener(&self, listener: impl Fn(Id, i32) + Send + Sync + 'static) {
        let listener: EventListener = Arc::new(listener);
        if self.event_listener.set(listener.clone()).is_ok() {
            self.current()
                .set_event_listener(move |id, status| listener(id, status));
        }
    }

    /// Installs what runs when the server asks the client to move (`MoveTo`; once per
    /// connection). It is called on the reader thread: it must hand the move to another.
    pub fn set_move_listener(&self, listener: impl Fn(String) + Send + Sync + 'static) {
        let listener: MoveListener = Arc::new(listener);
        if self.move_listener.set(listener.clone()).is_ok() {
            self.now().set_move_listener(move |to| listener(to));
        }
    }

    /// See [`ServerSession::flush_in_background`].
    pub fn flush_in_background(&self) {
        self.flushes_in_background.store(true, Ordering::Release);
        self.current().flush_in_background();
    }

    pub fn post(&self, msg: &ClientMsg, bulk: &[u8]) -> Result<(), ClientError> {
        self.now().post(msg, bulk)
    }

    pub fn flush(&self) -> Result<(), ClientError> {
        self.now().flush()
    }

    pub fn call(&self, msg: &ClientMsg, bulk: &[u8]) -> Result<ServerMsg, ClientError> {
        self.now().call(msg, bulk)
    }

    pub fn start_read(&self, req: &ClientMsg, sink: ReadSink) -> Result<(), ClientError> {
        self.now().start_read(req, sink)
    }

    pub fn open_lanes(&self, want: usize) -> usize {
        self.now().open_lanes(want)
    }

    pub fn ping(&self) -> Result<Duration, ClientError> {
        self.now().ping()
    }

    pub fn share_host_memory(&self, len: usize) -> Option<*mut u8> {
        self.now().share_host_memory(len)
    }

    pub fn unshare_host_memory(&self, base: *mut u8) -> bool {
        self.now().unshare_host_memory(base)
    }

    /// Whether host memory is shared with the server (it stays on that server's host).
    pub fn shares_host_memory(&self) -> bool {
        self.now().shares_host_memory()
    }

    pub fn post_in_place(&self, msg: &ClientMsg, bulk: &[u8]) -> Result<(), ClientError> {
        self.now().post_in_place(msg, bulk)
    }

    pub fn call_in_place(&self, msg: &ClientMsg, bulk: &[u8]) -> Result<ServerMsg, ClientError> {
        self.now().call_in_place(msg, bulk)
    }

    pub fn start_read_in_place(&self, req: &ClientMsg, sink: ReadSink) -> Result<(), ClientError> {
        self.now().start_read_in_place(req, sink)
    }

    /// Whether the connection still works.
    pub fn is_alive(&self) -> bool {
        self.now().is_alive()
    }
}
