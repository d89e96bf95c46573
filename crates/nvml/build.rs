//! The library stands in for NVIDIA's `libnvidia-ml.so.1`: it carries that soname, and its own
//! calls to `nvml*` names bind to its own functions (-Bsymbolic) whatever else the process loads.
fn main() {
    println!("cargo:rustc-link-arg-cdylib=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rustc-link-arg-cdylib=-Wl,-Bsymbolic");
}
