//! Graphs by stream capture: the server records a capturing stream's work into a graph of its
//! own, instantiates and launches it.

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::{check, Status, INVALID_HANDLE, INVALID_VALUE};
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{serve, Answer, Id};

use super::owned;
use super::session::{code, Served};

impl serve::Graphs for Served<'_> {
    fn begin_capture(&mut self, ctx: Id, stream: Id, mode: u32) -> Status {
        let cuda = &mut *self.cuda;
        code(cuda.enter(ctx).and_then(|()| {
            let stream = cuda.stream(stream)?;
            let mode = capture_mode(mode).ok_or(INVALID_VALUE)?;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(cuda.backend.driver, cuStreamBeginCapture_v2(stream, mode)) })
        }))
    }

    fn end_capture(&mut self, ctx: Id, stream: Id, graph: Id) -> Status {
        let cuda = &mut *self.cuda;
        let made = cuda.create_in(ctx, |cuda, raw| {
            let stream = cuda.stream(stream)?;
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe { cu_call!(cuda.backend.driver, cuStreamEndCapture(stream, raw)) })
        });
        code(made.map(|raw| {
            cuda.graphs
                .insert(graph, owned::Graph::new(raw, cuda.current, &cuda.backend));
        }))
    }

    fn graph_instantiate(&mut self, ctx: Id, graph: Id, exec: Id, flags: u64) -> Status {
        let cuda = &mut *self.cuda;
        let made = cuda.create_in(ctx, |cuda, raw| {
            let graph = cuda.graphs.get(&graph).ok_or(INVALID_HANDLE)?.raw();
            // SAFETY: this session's live handles and local buffers; the driver checks addresses.
            check(unsafe {
                cu_call!(
                    cuda.backend.driver,
                    cuGraphInstantiateWithFlags(raw, graph, flags)
                )
            })
        });
        code(made.map(|raw| {
            cuda.graph_execs.insert(
                exec,
                owned::GraphExec::new(raw, cuda.current, &cuda.backend),
            );
        }))
    }

    fn graph_launch(&mut self, ctx: Id, exec: Id, stream: Id, upload: bool) -> Answer<()> {
        let cuda = &mut *self.cuda;
        cuda.enter(ctx).and_then(|()| {
            let stream = cuda.stream(stream)?;
            let exec = cuda.graph_execs.get(&exec).ok_or(INVALID_HANDLE)?.raw();
            let driver = &cuda.backend.driver;
            check(if upload {
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                unsafe { cu_call!(driver, cuGraphUpload(exec, stream)) }
            } else {
                // SAFETY: this session's live handles and local buffers; the driver checks addresses.
                unsafe { cu_call!(driver, cuGraphLaunch(exec, stream)) }
            })
        })
    }

    fn graph_destroy(&mut self, graph: Id) -> Answer<()> {
        let taken = self.cuda.graphs.remove(&graph);
        self.cuda.destroy(taken)
    }

    fn graph_exec_destroy(&mut self, exec: Id) -> Answer<()> {
        let taken = self.cuda.graph_execs.remove(&exec);
        self.cuda.destroy(taken)
    }
}

/// `CUstreamCaptureMode` from the wire.
fn capture_mode(mode: u32) -> Option<CUstreamCaptureMode> {
    use CUstreamCaptureMode_enum::*;
    Some(match mode {
        0 => CU_STREAM_CAPTURE_MODE_GLOBAL,
        1 => CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        2 => CU_STREAM_CAPTURE_MODE_RELAXED,
        _ => return None,
    })
}
