//! The kernel sources, and their compiled cubins for one GPU architecture (compiled once, then
//! read from the cache).
use std::path::Path;

use crate::cuda::nvrtc::{nvrtc, Arch, NvrtcError};

/// Helpers every source starts with.
const COMMON: &str = include_str!("common.cuh");

/// One compilation unit and the kernels it defines.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    pub name: &'static str,
    text: &'static str,
    pub kernels: &'static [&'static str],
}

impl Source {
    #[cfg(test)]
    pub(super) const fn new(
        name: &'static str,
        text: &'static str,
        kernels: &'static [&'static str],
    ) -> Self {
        Self {
            name,
            text,
            kernels,
        }
    }

    /// The text NVRTC compiles: the shared helpers, then the source's own.
    pub fn full_text(&self) -> String {
        format!("{COMMON}\n#line 1 \"{}\"\n{}", self.name, self.text)
    }
}

pub const SOURCES: [Source; 6] = [
    Source {
        name: "layer_norm_act.cu",
        text: include_str!("layer_norm_act.cu"),
        kernels: &[
            "layer_norm_mish",
            "layer_norm_simnorm",
            "layer_norm_mish_backward",
            "layer_norm_simnorm_backward",
        ],
    },
    Source {
        name: "mppi.cu",
        text: include_str!("mppi.cu"),
        kernels: &["mppi_sample", "mppi_refit"],
    },
    Source {
        name: "policy_action.cu",
        text: include_str!("policy_action.cu"),
        kernels: &["policy_action"],
    },
    Source {
        name: "q_bootstrap.cu",
        text: include_str!("q_bootstrap.cu"),
        kernels: &["q_bootstrap"],
    },
    Source {
        name: "gather.cu",
        text: include_str!("gather.cu"),
        kernels: &["gather_members"],
    },
    Source {
        name: "two_hot_ce.cu",
        text: include_str!("two_hot_ce.cu"),
        kernels: &["two_hot_soft_ce"],
    },
];

/// The cubin of `source` for `arch`: from the cache where an earlier run compiled the same
/// text with the same NVRTC, else compiled now and cached (a cache that cannot be written is
/// skipped: the kernels are then compiled in every process).
pub fn cubin(source: &Source, arch: Arch) -> Result<Vec<u8>, NvrtcError> {
    let compiler = nvrtc()?;
    let text = source.full_text();
    let cached = crate::cache::user_cache().map(|cache| {
        let (major, minor) = compiler.version;
        cache
            .join("kernels")
            .join(format!("nvrtc-{major}.{minor}"))
            .join(arch.to_string())
            .join(format!(
                "{}-{:016x}.cubin",
                source.name,
                fnv1a(text.as_bytes())
            ))
    });
    if let Some(bytes) = cached.as_deref().and_then(|p| std::fs::read(p).ok()) {
        return Ok(bytes);
    }
    let bytes = compiler.compile(source.name, &text, arch)?;
    if let Some(path) = cached {
        // Best effort: another process may write the same file; the rename makes either whole.
        let _ = write_atomically(&path, &bytes);
    }
    Ok(bytes)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    crate::whole_file::write(path, bytes)
}

/// 64-bit FNV-1a: a cache key that changes with every edit of a source.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The architectures we compile for in CI: A100, H100/H200, B200.
    const ARCHES: [Arch; 3] = [
        Arch { major: 8, minor: 0 },
        Arch { major: 9, minor: 0 },
        Arch {
            major: 10,
            minor: 0,
        },
    ];

    fn compiler_or_skip() -> Option<&'static crate::cuda::nvrtc::Nvrtc> {
        match nvrtc() {
            Ok(compiler) => Some(compiler),
            Err(e) if env!("TDMPC2_TORCH_CUDA_WHEEL") == "0" => {
                errln!("SKIPPED: the torch wheel is CPU-only and brings no NVRTC: {e}");
                None
            }
            Err(e) => panic!("the CUDA torch wheel's NVRTC must load: {e}"),
        }
    }

    /// Every kernel source compiles (through ptxas: a cubin, not only PTX) for every
    /// architecture we support, and defines the kernels it lists, unmangled.
    #[test]
    fn every_kernel_source_compiles_for_every_supported_gpu() {
        let Some(compiler) = compiler_or_skip() else {
            return;
        };
        errln!("NVRTC {:?} from {}", compiler.version, compiler.library);
        for source in &SOURCES {
            for arch in ARCHES {
                let bytes = compiler
                    .compile(source.name, &source.full_text(), arch)
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(
                    &bytes[..4],
                    b"\x7fELF",
                    "{} for {arch}: not a cubin",
                    source.name
                );
                for kernel in source.kernels {
                    let found = bytes
                        .windows(kernel.len() + 1)
                        .any(|w| &w[..kernel.len()] == kernel.as_bytes() && w[kernel.len()] == 0);
                    assert!(found, "{} for {arch} does not define {kernel}", source.name);
                }
            }
        }
    }

    #[test]
    fn a_broken_source_is_an_error_carrying_the_compilers_log() {
        let Some(compiler) = compiler_or_skip() else {
            return;
        };
        let broken = "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }";
        let e = compiler
            .compile("broken.cu", broken, ARCHES[1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("broken.cu") && e.contains("sm_90"), "{e}");
        assert!(e.contains("undefined_name"), "the log is missing: {e}");
    }

    /// A second request reads the cache; a changed source gets a key of its own.
    #[test]
    fn compiled_kernels_are_cached_per_source_and_architecture() {
        if compiler_or_skip().is_none() {
            return;
        }
        let source = &SOURCES[2];
        let first = cubin(source, ARCHES[1]).unwrap();
        assert_eq!(cubin(source, ARCHES[1]).unwrap(), first);
        assert_ne!(fnv1a(b"a"), fnv1a(b"b"));
        assert_ne!(cubin(source, ARCHES[0]).unwrap(), first);
    }
}
