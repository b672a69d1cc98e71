//! Build script: exposes the target Python's version as cfg flags
//! (`Py_3_11`, `Py_3_12`, ...) so version-specific CPython details are gated
//! at compile time. libuv is compiled by the libuv-sys2 crate.
fn main() {
    pyo3_build_config::use_pyo3_cfgs();
    println!("cargo:rerun-if-changed=build.rs");
}
