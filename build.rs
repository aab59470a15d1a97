//! Lets the binary run from anywhere without LD_LIBRARY_PATH: rpaths to libpython and to the
//! venv's torch/lib (the libtorch that torch-sys linked against). With a CUDA torch wheel it
//! also builds the C++ shim (src/cuda/shim.cpp): CUDA graphs and torch generators of our own.
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    // What the embedded-python crate found out about the venv's Python.
    let dep = |key: &str| {
        std::env::var(format!("DEP_TDMPC2_PYTHON_{key}"))
            .unwrap_or_else(|_| panic!("embedded-python reports its {key}"))
    };
    let (site, libdir) = (dep("SITE"), dep("LIBDIR"));
    let site = site.as_str();
    println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
    // Tests start the venv's tools (torchrun) beside the binary.
    let venv_bin = Path::new(&python)
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    println!("cargo:rustc-env=TDMPC2_TEST_VENV_BIN={venv_bin}");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{site}/torch/lib");
    // tch sees GPUs only once libtorch_cuda is loaded, and the linker's --as-needed would drop
    // it because no symbol of it is referenced directly.
    let cuda_wheel = Path::new(&format!("{site}/torch/lib/libtorch_cuda.so")).exists();
    if cuda_wheel {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
    println!(
        "cargo:rustc-env=TDMPC2_TORCH_CUDA_WHEEL={}",
        u8::from(cuda_wheel)
    );
    shim(&python, Path::new(site), cuda_wheel);
    let nvrtc_dirs: Vec<String> = nvidia_dirs(Path::new(site))
        .into_iter()
        .map(|dir| dir.join("lib"))
        .filter(|lib| has_library(lib, "libnvrtc.so."))
        .map(|lib| lib.display().to_string())
        .collect();
    // Where src/cuda/nvrtc.rs looks for CUDA's run-time compiler if torch's CUDA runtime is not
    // loaded (a CPU-only process still compiles kernels).
    println!("cargo:rustc-env=TDMPC2_NVRTC_DIRS={}", nvrtc_dirs.join(":"));
}

fn has_library(dir: &Path, prefix: &str) -> bool {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(prefix))
        })
        .unwrap_or(false)
}

fn run_python(python: &str, script: &str) -> String {
    let out = Command::new(python)
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
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Compiles the shim and sets `cfg(tdmpc2_cuda_graphs)`, or leaves it out with a
/// warning; src/cuda/graph.rs then reports the reason (TDMPC2_CUDA_GRAPHS_MISSING) at run time.
fn shim(python: &str, site: &Path, cuda_wheel: bool) {
    const SOURCE: &str = "src/cuda/shim.cpp";
    println!("cargo::rustc-check-cfg=cfg(tdmpc2_cuda_graphs)");
    println!("cargo:rerun-if-changed={SOURCE}");
    println!(
        "cargo:rerun-if-changed={}",
        site.join("torch/lib").display()
    );
    let left_out = |reason: &str| {
        println!("cargo:warning=CUDA graphs left out: {reason}");
        println!("cargo:rustc-env=TDMPC2_CUDA_GRAPHS_MISSING={reason}");
    };
    let inputs = match ShimInputs::find(site, cuda_wheel) {
        Ok(inputs) => inputs,
        Err(reason) => return left_out(&reason),
    };
    let abi = run_python(
        python,
        "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))",
    );
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .pic(true)
        .define("_GLIBCXX_USE_CXX11_ABI", abi.trim());
    // -isystem: warnings stay on for the shim but not for torch's and CUDA's headers.
    for dir in &inputs.includes {
        build.flag("-isystem").flag(dir.display().to_string());
    }
    // A wheel whose headers do not compile costs the graphs, not the build.
    if let Err(e) = build.file(SOURCE).try_compile("tdmpc2_shim") {
        let first_line = e.to_string().lines().next().unwrap_or_default().to_string();
        return left_out(&format!("{SOURCE} did not compile: {first_line}"));
    }

    let torch_lib = site.join("torch/lib");
    let cudart_dir = inputs.cudart.parent().expect("cudart has a directory");
    let cudart_name = inputs.cudart.file_name().expect("cudart has a name");
    println!("cargo:rustc-link-search=native={}", torch_lib.display());
    println!("cargo:rustc-link-search=native={}", cudart_dir.display());
    // Forced like torch_cuda above, so that the binary records them even when nothing in it
    // calls the shim yet.
    println!(
        "cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,-lc10_cuda,-l:{},--as-needed",
        cudart_name.to_string_lossy()
    );
    println!("cargo:rustc-link-lib=dylib=torch_cuda");
    println!("cargo:rustc-link-lib=dylib=c10_cuda");
    println!(
        "cargo:rustc-link-lib=dylib:+verbatim={}",
        cudart_name.to_string_lossy()
    );
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", cudart_dir.display());
    println!("cargo:rustc-cfg=tdmpc2_cuda_graphs");
}

/// Where the shim's headers and the CUDA runtime library are in the venv's wheels.
struct ShimInputs {
    includes: Vec<PathBuf>,
    cudart: PathBuf,
}

impl ShimInputs {
    fn find(site: &Path, cuda_wheel: bool) -> Result<ShimInputs, String> {
        let torch = site.join("torch");
        if !cuda_wheel {
            return Err(format!(
                "the torch wheel is CPU-only (no libtorch_cuda.so in {})",
                torch.join("lib").display()
            ));
        }
        let torch_include = torch.join("include");
        if !torch_include.join("ATen/cuda/CUDAGraph.h").exists() {
            return Err(format!(
                "no ATen/cuda/CUDAGraph.h under {}",
                torch_include.display()
            ));
        }
        // The CUDA runtime wheel: nvidia/cu13 (CUDA 13 wheels) or nvidia/cuda_runtime (12).
        let cuda = nvidia_dirs(site)
            .into_iter()
            .find(|dir| dir.join("include/cuda_runtime_api.h").exists())
            .ok_or_else(|| {
                format!(
                    "no CUDA runtime headers (include/cuda_runtime_api.h) under {}",
                    site.join("nvidia").display()
                )
            })?;
        let cudart = cudart_library(&cuda.join("lib"))
            .ok_or_else(|| format!("no libcudart.so.<N> in {}", cuda.join("lib").display()))?;
        let mut includes = vec![
            torch_include.clone(),
            torch_include.join("torch/csrc/api/include"),
            cuda.join("include"),
        ];
        // The runtime wheel lacks crt/host_config.h; the nvidia-cuda-crt wheel or triton (a torch
        // dependency) ships it. Searched last, so only crt/ is taken from there.
        if !cuda.join("include/crt/host_config.h").exists() {
            let crt = nvidia_dirs(site)
                .into_iter()
                .map(|dir| dir.join("include"))
                .chain([site.join("triton/backends/nvidia/include")])
                .find(|dir| dir.join("crt/host_config.h").exists())
                .ok_or_else(|| {
                    format!(
                        "no crt/host_config.h in {} or triton (pip install nvidia-cuda-crt)",
                        cuda.join("include").display()
                    )
                })?;
            includes.push(crt);
        }
        Ok(ShimInputs { includes, cudart })
    }
}

fn nvidia_dirs(site: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(site.join("nvidia"))
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// `libcudart.so.<major>`, the name the runtime wheel ships (no unversioned link).
fn cudart_library(lib: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(lib)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .and_then(|name| name.strip_prefix("libcudart.so."))
                .is_some_and(|major| major.chars().all(|c| c.is_ascii_digit()))
        })
        .collect();
    found.sort();
    found.pop()
}
