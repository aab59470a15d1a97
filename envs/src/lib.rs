//! Environments for tdmpc2: native Rust tasks; gymnasium, dm_control, Meta-World and MyoSuite
//! through pyo3 (the last two in worker processes with venvs of their own, see [`family`]).
//!
//! [`make`] returns a fully wrapped environment whose actions live in `[-1, 1]^action_dim`.
mod adapter;
pub mod bench;
pub mod deadline;
pub mod dmc;
mod env;
mod error;
pub mod family;
pub mod gym;
pub mod metaworld;
pub mod multitask;
pub mod myosuite;
pub mod native;
pub mod np_random;
mod registry;
pub mod renderer;
pub mod running_binary;
pub mod vector;
pub mod wrappers;

pub use env::{
    ActionBox, BoxEnv, Env, EnvOptions, EnvSpec, Frame, ObsKind, Step, FRAME_SIZE, FRAME_STACK,
    VIDEO_SIZE,
};
pub use error::{Error, Result};
pub use family::Family;
pub use multitask::{Padding, TaskMix};
pub use registry::{known_tasks, make, make_observed};
pub use vector::{
    serve_worker, set_default_worker, specs_in_worker, Placement, RemoteEnv, ReplyLimit, StopProbe,
    VectorEnv, WorkerCommand, STOP_PATIENCE,
};
