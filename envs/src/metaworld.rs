//! Meta-World's 50 tasks under the official names (`mw-reach` is `reach-v3-goal-observable`),
//! wrapped as the official TD-MPC2 code does: action repeat 2, 100 agent steps, success from
//! the environment, state observations. Its venv is its own (see [`crate::family`]).
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::adapter::{self, AdapterEnv};
use crate::wrappers::wrap_observed;
use crate::{Env, EnvOptions, Result};
use embedded_python as python;

/// The official Meta-World tasks, in the order of the official mt80 list.
pub const TASKS: [&str; 50] = [
    "mw-assembly",
    "mw-basketball",
    "mw-button-press-topdown",
    "mw-button-press-topdown-wall",
    "mw-button-press",
    "mw-button-press-wall",
    "mw-coffee-button",
    "mw-coffee-pull",
    "mw-coffee-push",
    "mw-dial-turn",
    "mw-disassemble",
    "mw-door-open",
    "mw-door-close",
    "mw-drawer-close",
    "mw-drawer-open",
    "mw-faucet-open",
    "mw-faucet-close",
    "mw-hammer",
    "mw-handle-press-side",
    "mw-handle-press",
    "mw-handle-pull-side",
    "mw-handle-pull",
    "mw-lever-pull",
    "mw-peg-insert-side",
    "mw-peg-unplug-side",
    "mw-pick-out-of-hole",
    "mw-pick-place",
    "mw-pick-place-wall",
    "mw-plate-slide",
    "mw-plate-slide-side",
    "mw-plate-slide-back",
    "mw-plate-slide-back-side",
    "mw-push-back",
    "mw-push",
    "mw-push-wall",
    "mw-reach",
    "mw-reach-wall",
    "mw-shelf-place",
    "mw-soccer",
    "mw-stick-push",
    "mw-stick-pull",
    "mw-sweep-into",
    "mw-sweep",
    "mw-window-open",
    "mw-window-close",
    "mw-bin-picking",
    "mw-box-close",
    "mw-door-lock",
    "mw-door-unlock",
    "mw-hand-insert",
];

pub const ACTION_REPEAT: usize = 2;
pub const EPISODE_LENGTH: usize = 100;

const SOURCE: &str = include_str!("py/metaworld_adapter.py");

pub fn is_task(name: &str) -> bool {
    TASKS.contains(&name)
}

/// `mw-reach` -> `reach-v3-goal-observable`.
pub fn env_id(task: &str) -> Option<String> {
    is_task(task).then(|| format!("{}-v3-goal-observable", &task["mw-".len()..]))
}

/// Fully wrapped Meta-World task. Only a process serving the family with its venv makes one
/// (see [`crate::make_observed`]).
pub fn make(task: &str, seed: u64, options: EnvOptions) -> Result<Box<dyn Env>> {
    let seed = adapter::check_seed(task, seed)?;
    let id = env_id(task).ok_or_else(|| crate::Error::UnknownTask {
        name: task.into(),
        suggestions: vec![],
    })?;
    let env = python::attach_exclusive(|py| {
        static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
        let module = adapter::load_once(&MODULE, py, SOURCE, "tdmpc2_metaworld_adapter")?;
        let simulator_steps = EPISODE_LENGTH * ACTION_REPEAT;
        AdapterEnv::new(
            module,
            "MetaWorldAdapter",
            (id.as_str(), seed, options.renders(), simulator_steps),
            task,
            u64::from(seed),
        )
    })?;
    let env = env.rendering_with_mujoco(true);
    wrap_observed(env, ACTION_REPEAT, EPISODE_LENGTH, options.obs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn official_names_map_to_goal_observable_v3_ids() {
        assert_eq!(
            env_id("mw-reach").as_deref(),
            Some("reach-v3-goal-observable")
        );
        assert_eq!(
            env_id("mw-button-press-topdown-wall").as_deref(),
            Some("button-press-topdown-wall-v3-goal-observable")
        );
        assert_eq!(env_id("reach"), None);
    }
}
