//! Bakes the Python that pyo3 builds against into the crate: its site-packages (so the
//! embedded interpreter finds the venv without activation) and its libpython directory, which
//! the crates depending on this one read (DEP_TDMPC2_PYTHON_SITE, DEP_TDMPC2_PYTHON_LIBDIR).
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    println!("cargo:rerun-if-env-changed=TDMPC2_VENV");
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
    println!("cargo:rustc-env=TDMPC2_SITE_PACKAGES={site}");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
    println!("cargo:libdir={libdir}");
    println!("cargo:site={site}");
}
