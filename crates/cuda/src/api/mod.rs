//! The driver API entry points rgpu implements, by API group. Every `pub unsafe fn cu*` here is
//! the implementation of the driver function of that name: tools/gen_cuda_api.py finds them and
//! generates its exported symbol (generated_exports.rs) with the parameters the driver declares,
//! so a signature that differs does not compile, running it through the C boundary
//! (boundary.rs); every other driver symbol gets a NOT_SUPPORTED stub.

pub mod arrays;
pub mod context;
pub mod copy;
pub mod device;
pub mod event;
pub mod graph;
pub mod graph_host_work;
pub mod graph_legacy;
pub mod graph_nodes;
pub mod graph_params;
pub mod host_mirror;
pub mod init;
pub mod ipc;
pub mod jit;
pub mod launch;
pub mod loader;
pub mod managed;
pub mod memory;
pub mod module;
pub mod pools;
pub mod shareable;
pub mod stream;
pub mod tensor_map;
pub mod vmm;

pub use arrays::*;
pub use context::*;
pub use copy::*;
pub use device::*;
pub use event::*;
pub use graph::*;
pub use graph_legacy::*;
pub use graph_nodes::*;
pub use graph_params::*;
pub use init::*;
pub use ipc::*;
pub use jit::*;
pub use launch::*;
pub use loader::*;
pub use managed::*;
pub use memory::*;
pub use module::*;
pub use pools::*;
pub use shareable::*;
pub use stream::*;
pub use tensor_map::*;
pub use vmm::*;

pub(crate) use crate::results::{from_remote, status, write_out, Outcome};

/// Whether servers on one machine may copy device to device through CUDA IPC handles
/// (`RGPU_FABRIC_IPC=0`: always over the network, to measure that path on one machine).
/// Read at each copy, so that `rgpu bench fabric` measures both paths in one process.
pub(crate) fn fabric_ipc() -> bool {
    !std::env::var_os("RGPU_FABRIC_IPC").is_some_and(|v| v == "0")
}

/// Whether a copy between servers of one machine, ordered on the source's stream, is pushed
/// by the source's server into the destination's allocation (as native peer copies are) rather
/// than pulled by the destination's; `RGPU_FABRIC_PUSH=0` pulls (to compare the two). Read at
/// each copy, as `fabric_ipc`.
pub(crate) fn fabric_push() -> bool {
    !std::env::var_os("RGPU_FABRIC_PUSH").is_some_and(|v| v == "0")
}
