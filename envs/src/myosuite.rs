//! MyoSuite's ten hand tasks under the official names (`myo-reach` is `myoHandReachFixed-v0`,
//! `myo-reach-hard` its Random variant), wrapped as the official TD-MPC2 code does: no action
//! repeat, 100 agent steps, success from `solved`, state observations. Its venv is its own
//! (see [`crate::family`]).
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::adapter::{self, AdapterEnv};
use crate::wrappers::wrap_observed;
use crate::{Env, EnvOptions, Error, Result};
use embedded_python as python;

/// The official MyoSuite tasks and their MyoSuite ids.
pub const TASKS: [(&str, &str); 10] = [
    ("myo-reach", "myoHandReachFixed-v0"),
    ("myo-reach-hard", "myoHandReachRandom-v0"),
    ("myo-pose", "myoHandPoseFixed-v0"),
    ("myo-pose-hard", "myoHandPoseRandom-v0"),
    ("myo-obj-hold", "myoHandObjHoldFixed-v0"),
    ("myo-obj-hold-hard", "myoHandObjHoldRandom-v0"),
    ("myo-key-turn", "myoHandKeyTurnFixed-v0"),
    ("myo-key-turn-hard", "myoHandKeyTurnRandom-v0"),
    ("myo-pen-twirl", "myoHandPenTwirlFixed-v0"),
    ("myo-pen-twirl-hard", "myoHandPenTwirlRandom-v0"),
];

pub const EPISODE_LENGTH: usize = 100;

const SOURCE: &str = include_str!("py/myosuite_adapter.py");

/// The official names.
pub fn tasks() -> impl Iterator<Item = &'static str> {
    TASKS.iter().map(|(name, _)| *name)
}

pub fn is_task(name: &str) -> bool {
    env_id(name).is_some()
}

/// `myo-reach` -> `myoHandReachFixed-v0`.
pub fn env_id(task: &str) -> Option<&'static str> {
    TASKS
        .iter()
        .find(|(name, _)| *name == task)
        .map(|(_, id)| *id)
}

/// Fully wrapped MyoSuite task. Only a process serving the family with its venv makes one
/// (see [`crate::make_observed`]).
pub fn make(task: &str, seed: u64, options: EnvOptions) -> Result<Box<dyn Env>> {
    let seed = adapter::check_seed(task, seed)?;
    let id = env_id(task).ok_or_else(|| Error::UnknownTask {
        name: task.into(),
        suggestions: vec![],
    })?;
    let env = python::attach_exclusive(|py| {
        static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
        let module = adapter::load_once(&MODULE, py, SOURCE, "tdmpc2_myosuite_adapter")?;
        AdapterEnv::new(
            module,
            "MyoSuiteAdapter",
            (id, options.renders(), EPISODE_LENGTH),
            task,
            u64::from(seed),
        )
    })?;
    let env = env.rendering_with_mujoco(true);
    wrap_observed(env, 1, EPISODE_LENGTH, options.obs)
}
