//! The library stands in for NVIDIA's `libcuda.so.1`: it carries that soname, and its own
//! calls to `cu*` names bind to its own functions (-Bsymbolic) whatever else the process loads.
fn main() {
    println!("cargo:rustc-link-arg-cdylib=-Wl,-soname,libcuda.so.1");
    println!("cargo:rustc-link-arg-cdylib=-Wl,-Bsymbolic");
}
