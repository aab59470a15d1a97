//! The TD-MPC2 agent: world model, losses and optimisers, and the MPPI planner.
//!
//! Behaviour follows the official implementation (nicklashansen/tdmpc2) and is checked against
//! vectors recorded from it (`tests/parity.rs`). Parameters live in flat buffers (one per
//! optimiser) so that optimiser steps, gradient clipping and gradient all-reduce are a handful of
//! tensor operations; every parameter is a view into its buffer, named with the official
//! state-dict key.

pub mod adam;
pub mod bench;
pub mod config;
pub mod encoder;
pub mod kernels;
pub mod layers;
pub mod math;
pub mod noise;
pub mod official_checkpoint;
pub mod op_count;
pub mod params;
pub mod planner;
#[cfg(test)]
mod planner_reference;
pub mod scale;
pub mod task;
pub mod update;
mod update_stats;
pub mod world_model;

use tch::Tensor;

pub use adam::{clip_grad_norm, Adam, AdamState};
pub use config::AgentConfig;
pub use noise::{
    HostNoise, Noise, NoiseKind, PreparedPermutations, RecordingNoise, ReplayNoise, TorchNoise,
};
pub use official_checkpoint::{export_official, import_official, python_tensors};
pub use planner::{LatentModel, PlanInputs, Planner, TaskModel};
pub use scale::RunningScale;
pub use update::{PolicyPass, UpdateInfo, UpdateStats, Updater, WorldModelPass};
pub use world_model::{PolicyOutput, QParams, WorldModel};

/// Errors of the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("invalid agent config: {0}")]
    Config(String),
    #[error("{what}: expected shape {expected:?}, got {got:?}")]
    Shape {
        what: String,
        expected: Vec<i64>,
        got: Vec<i64>,
    },
    #[error("noise replay: {0}")]
    Replay(String),
    #[error("random draws: {0}")]
    Draw(String),
    /// A call through the C++ shim (src/cuda/shim.cpp) failed.
    #[error(transparent)]
    Shim(#[from] crate::cuda::GraphError),
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: String, message: String },
    #[error("embedded Python: {0}")]
    Python(String),
}

impl From<embedded_python::Error> for Error {
    fn from(e: embedded_python::Error) -> Self {
        Self::Python(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Checks a tensor's shape, naming it in the error.
pub(crate) fn expect_shape(what: &str, tensor: &Tensor, expected: &[i64]) -> Result<()> {
    let got = tensor.size();
    if got != expected {
        return Err(Error::Shape {
            what: what.to_string(),
            expected: expected.to_vec(),
            got,
        });
    }
    Ok(())
}
