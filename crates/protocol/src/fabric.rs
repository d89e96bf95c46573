//! The server-to-server fabric's link messages. A *link* is a persistent connection from a
//! puller (a server's worker, or a client pulling into host memory) to the worker of an
//! exporting session, opened once and reused for every transfer between the two: it presents
//! itself as a data lane of the exporting session with index [`LINK_LANE`] and, as its key,
//! a live ticket of that session (proof that the session granted it something); after that
//! every request on it names the ticket of the export it wants (one use each).
//!
//! Frames as on a session's connection (a header, a postcard body, bulk bytes): the puller
//! sends a [`LinkRequest`], the exporter answers with [`LinkReply`] frames. A large pull is
//! striped by the puller over several links, each asking for its part of the range.

use serde::{Deserialize, Serialize};

use crate::LaneKey;

/// The `LaneAttach::index` of a fabric link (its key: a live ticket of the session).
pub const LINK_LANE: u32 = u32::MAX;

/// Puller to exporter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkRequest {
    /// Bytes `[offset, offset + len)` of the export `ticket` names, once it is ready. The
    /// export is used up once every byte of it has been pulled.
    Pull {
        ticket: LaneKey,
        offset: u64,
        len: u64,
    },
    /// After [`LinkRequest::Handle`], once the export is ready: the puller, a server on the
    /// exporter's machine that mapped the allocation, copies device to device. Answered with a
    /// [`LinkReply::Handle`] whose handle is empty (the handle goes out once, to `Handle`).
    Share { ticket: LaneKey },
    /// After [`LinkReply::Handle`]: whether the puller copied the whole export through it (the
    /// export is used up), or could not and will pull the bytes.
    Shared { copied: bool },
    /// The CUDA IPC handle of the exported allocation *now*, ready or not: a puller on the
    /// same machine maps the allocation when the pull is requested, to order its device
    /// copy in the pulling stream; it then asks [`LinkRequest::Share`] to wait for the export
    /// to be ready. Answered with [`LinkReply::Handle`] once per export (one use, like its
    /// bytes), or [`LinkReply::HandleReady`] (no `Share` needed), else [`LinkReply::Refused`].
    Handle { ticket: LaneKey },
    /// The puller is done with the export: its bytes are in the puller's device memory now
    /// (after pulling all of them), or the pull failed (the puller reports that itself). An
    /// export whose stream waits for its delivery lets the stream go on. No answer.
    Delivered { ticket: LaneKey },
    /// The pusher could not copy into the landing `ticket` (`LandRange`) through its IPC
    /// handle: the landing's server pulls the pusher's export of the bytes itself. No answer.
    PullInstead { ticket: LaneKey },
}

/// Exporter to puller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkReply {
    /// The export is not ready yet (not made yet, or its device work still runs): sent every
    /// few seconds while the puller waits, so that only a dead exporter times out.
    Waiting,
    /// The range's bytes: the frame's bulk.
    Bytes,
    /// The CUDA IPC handle of the range's allocation and the range's offset in it.
    Handle { handle: Vec<u8>, offset: u64 },
    /// No such export, no handle to share, or the export cannot be read; the link stays
    /// usable.
    Refused { reason: String },
    /// The answer to a [`LinkRequest::Handle`] for an export that is ready and that nothing
    /// waits on (an MPI send's): the handle and offset as in [`LinkReply::Handle`], and the
    /// export is used up; the puller copies without asking [`LinkRequest::Share`].
    HandleReady { handle: Vec<u8>, offset: u64 },
}

sample_enum!(LinkRequest {
    Pull { ticket, offset, len },
    Share { ticket },
    Shared { copied },
    Handle { ticket },
    Delivered { ticket },
    PullInstead { ticket },
});
sample_enum!(LinkReply {
    Waiting,
    Bytes,
    Handle { handle, offset },
    Refused { reason },
    HandleReady { handle, offset },
});
