//! The session's own messages (after the handshake): what is neither OpenCL nor CUDA. The
//! handshake itself (`Challenge`, `Authenticate`, `Welcome`, `Fatal`) is a fixed exchange before
//! any request, declared with the envelopes in the crate root; events and read data the server
//! sends unasked are envelope variants too (`EventStatus`, `Data`, `ReadDone`).

/// A status of a session message (the server logs a failed posted one).
pub type Status = u32;

wire_api! {
    request: SessionRequest,
    reply: SessionReply,
    status: Status,
    client: SessionClient;

    /// Keeping the session alive and measuring it.
    group Control {
        /// Answered at once: measures a round trip (and shows the session is served).
        call Ping ping() -> ();
    }

    /// Data lanes in the server-to-client direction.
    group Lanes {
        /// From now on the data of a read of [`crate::STRIPE_MIN`] bytes or more may come
        /// striped over the first `lanes` data lanes (0: never), announced by one `Data`
        /// frame whose header names the lanes. The client opened them before.
        post ReadLanes read_lanes(lanes: u32);
    }
    /// The client's call trace.
    group Tracing {
        /// From now on (`on`) each reply comes after a `Timing` frame saying how long the
        /// server spent on its request.
        post TimeReplies time_replies(on: bool);
    }
}
