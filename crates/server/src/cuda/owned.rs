//! The driver objects a session makes and destroys by id (streams, events, graphs, executable
//! graphs, modules, libraries), held by owning wrappers as the OpenCL side holds its objects: a
//! raw handle only exists inside one, and dropping it destroys the object (at the latest when
//! the session ends, before its contexts), so no path forgets one or destroys one twice. Each
//! knows the context it was made in: destroying a context destroys its objects with it, so the
//! session then forgets theirs ([`Owned::forget`]) instead of destroying them again.

use std::sync::Arc;

use rgpu_cuda_api::cu_call;
use rgpu_cuda_api::native::Status;
use rgpu_cuda_api::sys::*;

use super::Backend;

/// An owned driver object, destroyed with the call of its kind.
pub(crate) trait Owned {
    /// Destroys it now, with the driver's status (dropping it destroys it too, silently).
    fn destroy(self) -> Status;
    /// The context it was made in (null for a library, which belongs to none).
    fn context(&self) -> CUcontext;
    /// Its context was destroyed, and the object with it: nothing left to destroy.
    fn forget(self);
}

macro_rules! owned {
    ($(#[$doc:meta])* $name:ident($raw:ty), $destroy:ident) => {
        $(#[$doc])*
        pub(crate) struct $name {
            raw: $raw,
            context: CUcontext,
            backend: Arc<Backend>,
        }

        impl $name {
            /// Takes ownership of `raw`, which the driver just made for this session in
            /// `context`.
            pub(crate) fn new(raw: $raw, context: CUcontext, backend: &Arc<Backend>) -> $name {
                $name {
                    raw,
                    context,
                    backend: backend.clone(),
                }
            }

            /// The handle, for a driver call; it stays owned here.
            #[allow(dead_code)]
            pub(crate) fn raw(&self) -> $raw {
                self.raw
            }

            fn destroy_raw(&self) -> Status {
                // SAFETY: `raw` was made by this driver for this session and is destroyed once:
                // here, from `destroy` (which then forgets the wrapper) or from `drop`.
                unsafe { cu_call!(self.backend.driver, $destroy(self.raw)) }
            }
        }

        impl Owned for $name {
            fn destroy(self) -> Status {
                let status = self.destroy_raw();
                std::mem::forget(self);
                status
            }

            fn context(&self) -> CUcontext {
                self.context
            }

            fn forget(self) {
                std::mem::forget(self);
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                let _ = self.destroy_raw();
            }
        }
    };
}

owned!(
    /// A stream of one of the session's contexts.
    Stream(CUstream),
    cuStreamDestroy_v2
);
owned!(
    /// An event of one of the session's contexts.
    Event(CUevent),
    cuEventDestroy_v2
);
owned!(
    /// A graph captured from one of the session's streams.
    Graph(CUgraph),
    cuGraphDestroy
);
owned!(
    /// An executable graph.
    GraphExec(CUgraphExec),
    cuGraphExecDestroy
);
owned!(
    /// A CUDA array.
    Array(CUarray),
    cuArrayDestroy
);
owned!(
    /// A mipmapped array (its level arrays belong to it).
    MipmappedArray(CUmipmappedArray),
    cuMipmappedArrayDestroy
);
owned!(
    /// A texture object (a value kernels receive, not a pointer).
    TexObject(CUtexObject),
    cuTexObjectDestroy
);
owned!(
    /// A surface object.
    SurfObject(CUsurfObject),
    cuSurfObjectDestroy
);
owned!(
    /// A memory pool the session made.
    MemPool(CUmemoryPool),
    cuMemPoolDestroy
);
owned!(
    /// A JIT link in progress.
    LinkState(CUlinkState),
    cuLinkDestroy
);
owned!(
    /// A module loaded in one of the session's contexts.
    Module(CUmodule),
    cuModuleUnload
);
owned!(
    /// A library (context-independent) loaded for the session.
    Library(CUlibrary),
    cuLibraryUnload
);
