//! The wire APIs' typed client methods on a connection: `conn.cuda().mem_alloc(ctx, size)`,
//! `conn.opencl().finish(queue)`. The methods themselves come from the protocol's tables
//! ([`CudaClient`], [`OpenClClient`]); this gives them their transport.

use rgpu_protocol::cuda::{CuReply, CuRequest, CudaClient};
use rgpu_protocol::opencl::{ClReply, ClRequest, OpenClClient};
use rgpu_protocol::table::UnexpectedReply;
use rgpu_protocol::{ClientMsg, ServerMsg};

use crate::connection::{Connection, ReadSink};
use crate::ClientError;

impl From<UnexpectedReply> for ClientError {
    fn from(e: UnexpectedReply) -> ClientError {
        ClientError::Protocol(e.to_string())
    }
}

/// The CUDA API on a connection.
#[derive(Clone, Copy)]
pub struct Cuda<'a>(&'a Connection);

/// The OpenCL API on a connection.
#[derive(Clone, Copy)]
pub struct OpenCl<'a>(&'a Connection);

impl Connection {
    pub fn cuda(&self) -> Cuda<'_> {
        Cuda(self)
    }

    pub fn opencl(&self) -> OpenCl<'_> {
        OpenCl(self)
    }
}

fn not_an_answer(reply: ServerMsg) -> ClientError {
    ClientError::Protocol(format!("unexpected reply {reply:?}"))
}

impl CudaClient for Cuda<'_> {
    type Error = ClientError;
    type Sink = ReadSink;

    fn send_call(&self, request: CuRequest, bulk: &[u8]) -> Result<CuReply, ClientError> {
        match self.0.call(&ClientMsg::Cu(request), bulk)? {
            ServerMsg::Cu(reply) => Ok(reply),
            other => Err(not_an_answer(other)),
        }
    }

    fn send_post(&self, request: CuRequest, bulk: &[u8]) -> Result<(), ClientError> {
        self.0.post(&ClientMsg::Cu(request), bulk)
    }

    fn send_read(&self, request: CuRequest, sink: ReadSink) -> Result<(), ClientError> {
        self.0.start_read(&ClientMsg::Cu(request), sink)
    }
}

impl OpenClClient for OpenCl<'_> {
    type Error = ClientError;
    type Sink = ReadSink;

    fn send_call(&self, request: ClRequest, bulk: &[u8]) -> Result<ClReply, ClientError> {
        match self.0.call(&ClientMsg::Cl(request), bulk)? {
            ServerMsg::Cl(reply) => Ok(reply),
            other => Err(not_an_answer(other)),
        }
    }

    fn send_post(&self, request: ClRequest, bulk: &[u8]) -> Result<(), ClientError> {
        self.0.post(&ClientMsg::Cl(request), bulk)
    }

    fn send_read(&self, request: ClRequest, sink: ReadSink) -> Result<(), ClientError> {
        self.0.start_read(&ClientMsg::Cl(request), sink)
    }
}
