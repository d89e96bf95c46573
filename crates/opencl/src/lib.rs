//! `librgpu_opencl.so`: an OpenCL ICD whose platform, `rgpu`, holds the devices of the servers
//! in `RGPU_SERVERS`. The ICD loader finds it through an `.icd` file (`rgpu run` sets that up);
//! it also exports the `cl*` symbols, so it can be linked directly where no loader is present.
//!
//! Layout: `api/` has the entry points by API group; `objects.rs` what each handle knows;
//! `handle.rs` how handles are made, checked and released; `runtime.rs` the process-wide
//! connections and platform; `spanning.rs` contexts over devices of several servers;
//! `generated_dispatch.rs` the dispatch table (generated).

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]
#![allow(clippy::too_many_arguments)]

pub mod api;
mod boundary;
mod generated_dispatch;
mod handle;
mod includes;
mod migration;
mod objects;
mod region;
mod runtime;
mod spanning;
mod unsupported;
mod util;
