//! Fused CUDA kernels for the planner's and the update's small-kernel chains (a plan is about a
//! thousand kernels of a few microseconds each). Their CUDA C sources live beside this file and
//! are compiled at run time by NVRTC for the GPU at hand (the build needs no nvcc), then kept
//! per architecture in the user's cache (`kernels/` of [`crate::cache::user_cache`]). Every
//! source compiles in the test suite on the CPU, so a broken kernel fails CI; what they compute
//! is tested against the torch operations they replace (tests/fused_kernels.rs) on a GPU, and on
//! the CPU through their host build ([`host`]).
mod catalogue;
mod gather;
pub mod host;
mod kernels;
mod layer_norm;
mod module;

pub use catalogue::{cubin, Source, SOURCES};
pub use gather::{gather_members, gathers};
pub use kernels::{
    mppi_refit, mppi_sample, mppi_shared_bytes, policy_action, q_bootstrap, two_hot_soft_ce, Bins,
    MppiSettings, Refit,
};
pub use layer_norm::{layer_norm_mish, layer_norm_simnorm, Affine};

use std::sync::atomic::{AtomicBool, Ordering};

use tch::{Device, Kind, Tensor};

use super::nvrtc::NvrtcError;
use super::GraphError;

/// The `fused_kernels` setting: one switch for the process, as torch's own precision flags.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns the fused kernels on or off for work on CUDA (`fused_kernels`).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Compiles (or reads from the cache) and loads every kernel on `device`, so that a broken
/// installation is an error at start-up rather than in the middle of a plan.
pub fn prepare(device: Device) -> Result<(), FusedError> {
    module::kernel(device, SOURCES[0].kernels[0]).map(|_| ())
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether the kernels launch on `device`: a CUDA device, or the CPU once [`host::load`] has
/// built them for it.
pub fn launch_on(device: Device) -> bool {
    device.is_cuda() || (device == Device::Cpu && host::loaded())
}

/// Whether work on `device` takes the fused kernels: switched on, and they launch there.
pub fn runs_on(device: Device) -> bool {
    enabled() && launch_on(device)
}

/// Whether work on `x` takes a fused kernel that has no backward: as
/// [`applies_with_gradient`], and no gradient wanted.
pub fn applies_to(x: &Tensor) -> bool {
    applies_with_gradient(x) && !x.requires_grad()
}

/// Whether work on `x` takes a fused kernel that also gives its own gradient (the LayerNorms and
/// the two-hot cross-entropy): [`runs_on`] its device, float32, and not empty (torch's
/// operations take empty tensors in their stride).
pub fn applies_with_gradient(x: &Tensor) -> bool {
    runs_on(x.device()) && x.kind() == Kind::Float && x.numel() > 0
}

#[derive(Debug, thiserror::Error)]
pub enum FusedError {
    #[error("fused kernels are not built into this binary: {0}")]
    NotBuilt(&'static str),
    #[error("fused kernels run on a CUDA device, not {0:?}")]
    NotCuda(Device),
    #[error("no fused kernel is named {0}")]
    UnknownKernel(&'static str),
    #[error("fused kernel {kernel}: {message}")]
    Input {
        kernel: &'static str,
        message: String,
    },
    #[error("fused kernel {kernel} did not launch: {message}")]
    Launch {
        kernel: &'static str,
        message: String,
    },
    #[error("the fused kernels' host build: {0}")]
    Host(String),
    #[error(transparent)]
    Compiler(#[from] NvrtcError),
    #[error(transparent)]
    Cuda(#[from] GraphError),
}
