//! The TD-MPC2 agent: world model, losses and optimisers, and the MPPI planner.
//!
//! Behaviour follows the official implementation (nicklashansen/tdmpc2) and is checked against
//! vectors recorded from it (`tests/parity.rs`). Parameters live in flat buffers (one per
//! optimiser) so that optimiser steps, gradient clipping and gradient all-reduce are a handful of
//! tensor operations; every parameter is a view into its buffer, named with the official
//! state-dict key.

pub mod adam;
pub mod config;
pub mod encoder;
pub mod ensemble;
mod error;
pub mod kernels;
pub mod layers;
pub mod math;
pub mod noise;
pub mod official_checkpoint;
pub mod params;
pub mod planner;
#[cfg(test)]
mod planner_reference;
pub mod scale;
pub mod state_dict_check;
pub mod task;
pub mod update;
mod update_stats;
pub mod world_model;

pub use adam::{clip_grad_norm, Adam, AdamState};
pub use config::AgentConfig;
pub use error::{Error, Result};
pub use noise::{
    HostNoise, Noise, NoiseKind, PreparedPermutations, RecordingNoise, ReplayNoise, TorchNoise,
};
pub use official_checkpoint::{export_official, import_official, python_tensors};
pub use planner::{LatentModel, PlanInputs, Planner, TaskModel};
pub use scale::RunningScale;
pub use update::{PolicyPass, UpdateInfo, UpdateStats, Updater, WorldModelPass};
pub use world_model::{PolicyOutput, QParams, WorldModel};
