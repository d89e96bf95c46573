//! The library stands in for NCCL's `libnccl.so.2`: it carries that soname (so that a
//! program linked against NCCL, PyTorch's libtorch_cuda among them, binds to it when it is
//! preloaded), and its own calls to `nccl*` names bind to its own functions.
fn main() {
    println!("cargo:rustc-link-arg-cdylib=-Wl,-soname,libnccl.so.2");
    println!("cargo:rustc-link-arg-cdylib=-Wl,-Bsymbolic");
}
