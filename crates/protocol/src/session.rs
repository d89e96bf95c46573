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

    /// Data lanes in the server-to-client direction, and the shared-memory rings.
    group Lanes {
        /// From now on the data of a read of [`crate::STRIPE_MIN`] bytes or more may come
        /// striped over the first `lanes` data lanes (0: never), announced by one `Data`
        /// frame whose header names the lanes. The client opened them before.
        post ReadLanes read_lanes(lanes: u32);
        /// A client on the server's host attaches a shared-memory region for bulk data: two
        /// rings of `ring_len` bytes (`rgpu_transport::shared_ring`). The region's descriptor
        /// comes with this frame (SCM_RIGHTS, so only over a Unix socket). From the reply on,
        /// frames whose header says [`crate::IN_RING`] have their bulk in the ring.
        call AttachShared attach_shared(ring_len: u64) -> Result<(), Status>;
        /// Page-locked host memory of a client on the server's host (`cuMemHostAlloc`): a
        /// sealed memfd of `len` bytes, its descriptor with this frame, named `segment` from
        /// now on. Copies name bytes in it ([`crate::IN_SEGMENT`], [`crate::INTO_SEGMENT`])
        /// and the GPU's DMA reads and writes them in place.
        call AttachHostMemory attach_host_memory(segment: u64, len: u64) -> Result<(), Status>;
        /// The program freed the segment: the server lets it go once its copies are done.
        post DetachHostMemory detach_host_memory(segment: u64);
    }
    /// The client's call trace.
    group Tracing {
        /// From now on (`on`) each reply comes after a `Timing` frame saying how long the
        /// server spent on its request.
        post TimeReplies time_replies(on: bool);
        /// The server's counters of this session so far (the client's trace ends with them).
        call GetCounters get_counters() -> Result<SessionCounters, Status>;
    }
    /// A client that reached the server over TCP from the server's own host.
    group SameHost {
        /// The abstract Unix socket (`@name`, in the server's network namespace) on which the
        /// server takes the same sessions: a client that can connect to it is on this host
        /// and may use shared memory there. Fails (1) where the server has none.
        call LocalRoute local_route() -> Result<String, Status>;
    }
    /// Asked by the server's operator (`rgpu migrate`): a client on the server's host whose
    /// user is root or the server's own.
    group Operation {
        /// Tells every other session's client to move to the server at `to` (`MoveTo`), then
        /// waits up to `wait_ms` for those sessions to end here (their clients moved): the
        /// sessions told, and those that ended. 1: not the server's operator.
        call MoveSessions move_sessions(to: String, wait_ms: u32) -> Result<(u32, u32), Status>;
    }
}

/// A session's counters as its server keeps them (`GetCounters`): what it received, served and
/// sent, and what it holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionCounters {
    /// Requests taken off the connection, and replies sent (the client's round trips).
    pub requests: u64,
    pub replies: u64,
    /// Bulk bytes received and sent, and of those the part that crossed data lanes.
    pub bulk_received: u64,
    pub bulk_sent: u64,
    pub lane_received: u64,
    pub lane_sent: u64,
    /// Of the bulk bytes, those that went through the shared-memory rings.
    pub shared_received: u64,
    pub shared_sent: u64,
    /// µs spent serving requests.
    pub busy_us: u64,
    /// Failures reported to the client.
    pub errors: u64,
    /// Device memory (bytes) and objects held now, as the session's quotas count them.
    pub memory: u64,
    pub objects: u64,
}

sample_struct!(SessionCounters {
    requests,
    replies,
    bulk_received,
    bulk_sent,
    lane_received,
    lane_sent,
    shared_received,
    shared_sent,
    busy_us,
    errors,
    memory,
    objects
});
