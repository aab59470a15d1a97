//! Environments for tdmpc2: native Rust tasks, gymnasium and dm_control through pyo3.
//!
//! [`make`] returns a fully wrapped environment whose actions live in `[-1, 1]^action_dim`.
pub mod bench;
pub mod dmc;
mod env;
mod error;
pub mod gym;
pub mod multitask;
pub mod native;
pub mod np_random;
mod registry;
pub mod vector;
pub mod wrappers;

pub use env::{
    ActionBox, BoxEnv, Env, EnvOptions, EnvSpec, Frame, ObsKind, Step, FRAME_SIZE, FRAME_STACK,
    VIDEO_SIZE,
};
pub use error::{Error, Result};
pub use multitask::{Padding, TaskMix};
pub use registry::{known_tasks, make, make_observed};
pub use vector::{serve_worker, Placement, ReplyLimit, VectorEnv, WorkerCommand};
