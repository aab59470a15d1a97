//! Any gymnasium env with a Box action space, and the four gymnasium tasks the official code
//! names itself (its `envs/mujoco.py`), driven through pyo3.
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::adapter::{self, AdapterEnv};
use crate::wrappers::wrap_observed;
use crate::{Env, EnvOptions, Result};
use embedded_python as python;

/// Prefix that forces the gymnasium implementation of a task that also exists natively.
pub const PREFIX: &str = "gym:";

/// A task the official code names itself, on the current gymnasium version of its env.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Official {
    pub name: &'static str,
    /// The gymnasium id: the official one, but LunarLander-v3 (gymnasium 1.x removed v2). The
    /// MuJoCo ids stay at v4, deprecated but registered: Walker2d-v5 gives its right foot the
    /// left's friction (0.9 to 1.9), other dynamics than the official results come from.
    pub id: &'static str,
    /// The official time limit, in agent steps (no action repeat).
    pub episode_length: usize,
    /// `LunarLander` made with `continuous=True`.
    pub continuous: bool,
    /// Success: the episode's return so far is above this (LunarLander: 200).
    pub success_above: Option<f64>,
    /// Whether the env ends episodes early (falls, crashes): such a task trains with
    /// `episodic=true`, as the official code requires.
    pub terminates: bool,
}

/// The official gymnasium tasks. The official code also sets `discount_max=0.99` and
/// `rho=0.7` for them (the config applies that, see `tdmpc2::config`).
pub const OFFICIAL: [Official; 4] = [
    Official {
        name: "mujoco-walker",
        id: "Walker2d-v4",
        episode_length: 1000,
        continuous: false,
        success_above: None,
        terminates: true,
    },
    Official {
        name: "mujoco-halfcheetah",
        id: "HalfCheetah-v4",
        episode_length: 1000,
        continuous: false,
        success_above: None,
        terminates: false,
    },
    Official {
        name: "bipedal-walker",
        id: "BipedalWalker-v3",
        episode_length: 1600,
        continuous: false,
        success_above: None,
        terminates: true,
    },
    Official {
        name: "lunarlander-continuous",
        id: "LunarLander-v3",
        episode_length: 500,
        continuous: true,
        success_above: Some(200.0),
        terminates: true,
    },
];

/// The official task of this name.
pub fn official(name: &str) -> Option<&'static Official> {
    OFFICIAL.iter().find(|task| task.name == name)
}

const SOURCE: &str = include_str!("py/gym_adapter.py");

fn module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    adapter::load_once(&MODULE, py, SOURCE, "tdmpc2_gym_adapter")
}

/// All ids in gymnasium's registry.
pub fn registered_ids() -> Result<Vec<String>> {
    python::attach_exclusive(|py| Ok(module(py)?.call_method0("registered_ids")?.extract()?))
}

/// A gymnasium env, unwrapped. `renders`: made with `render_mode="rgb_array"` (pixel
/// observations, videos); `official`: made as that official task is.
fn adapter_env(
    id: &str,
    seed: u64,
    renders: bool,
    official: Option<&Official>,
) -> Result<AdapterEnv> {
    let continuous = official.is_some_and(|o| o.continuous);
    let success_above = official.and_then(|o| o.success_above);
    let mujoco = is_mujoco(id);
    python::attach_exclusive(|py| {
        AdapterEnv::new(
            module(py)?,
            "GymAdapter",
            (id, renders, continuous, success_above, official.is_some()),
            id,
            seed,
        )
    })
    .map(|env| env.rendering_with_mujoco(mujoco))
}

/// Whether gymnasium's env `id` is one of its MuJoCo environments (which render through
/// MuJoCo); false where gymnasium cannot say.
pub fn is_mujoco(id: &str) -> bool {
    python::attach_exclusive(|py| -> Result<bool> {
        Ok(module(py)?.getattr("MUJOCO_IDS")?.contains(id)?)
    })
    .unwrap_or(false)
}

/// Fully wrapped gymnasium env (no action repeat; the env's own episode length).
pub fn make(id: &str, seed: u64, options: EnvOptions) -> Result<Box<dyn Env>> {
    let env = adapter_env(id, seed, options.renders(), None)?;
    let episode_length = env.spec().episode_length;
    wrap_observed(env, 1, episode_length, options.obs)
}

/// Fully wrapped official gymnasium task: its env, its time limit, no action repeat.
pub fn make_official(task: &Official, seed: u64, options: EnvOptions) -> Result<Box<dyn Env>> {
    let env = adapter_env(task.id, seed, options.renders(), Some(task))?;
    wrap_observed(env, 1, task.episode_length, options.obs)
}
