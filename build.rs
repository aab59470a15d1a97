//! Lets the binary run from anywhere without LD_LIBRARY_PATH: rpaths to libpython and to the
//! venv's torch/lib (the libtorch that torch-sys linked against).
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import site, sysconfig; print(site.getsitepackages()[0]); print(sysconfig.get_config_var('LIBDIR'))";
    let out = Command::new(&python)
        .args(["-c", script])
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {python} (set PYO3_PYTHON to the venv's python): {e}")
        });
    assert!(
        out.status.success(),
        "{python} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let site = lines.next().expect("site-packages path");
    let libdir = lines.next().expect("libpython directory");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
    // Tests start the venv's tools (torchrun) beside the binary.
    let venv_bin = std::path::Path::new(&python)
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    println!("cargo:rustc-env=TDMPC2_TEST_VENV_BIN={venv_bin}");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{site}/torch/lib");
    // tch sees GPUs only once libtorch_cuda is loaded, and the linker's --as-needed would drop
    // it because no symbol of it is referenced directly.
    if std::path::Path::new(&format!("{site}/torch/lib/libtorch_cuda.so")).exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
