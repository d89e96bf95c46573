//! The ICD exports the `cl*` names (so it can be linked directly), but inside the library those
//! names must bind to its own functions: without -Bsymbolic the dispatch table would resolve
//! them to the ICD loader's functions of the same names, which call back into the table.
fn main() {
    println!("cargo:rustc-link-arg-cdylib=-Wl,-Bsymbolic");
}
