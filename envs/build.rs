//! An rpath to libpython for the crate's own tests and examples (the embedded-python crate
//! found it).
fn main() {
    if let Ok(libdir) = std::env::var("DEP_TDMPC2_PYTHON_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
    }
}
