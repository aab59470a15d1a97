//! DeepMind Control Suite tasks, loaded and wrapped as the official TD-MPC2 code does.
use numpy::PyArray1;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyBytes;

use crate::wrappers::wrap;
use crate::{ActionBox, BoxEnv, Env, EnvSpec, Error, Result, Step};
use embedded_python as python;

/// The 28 standard TD-MPC2 DMControl tasks.
pub const TASKS: [&str; 28] = [
    "acrobot-swingup",
    "cartpole-balance",
    "cartpole-balance-sparse",
    "cartpole-swingup",
    "cartpole-swingup-sparse",
    "cheetah-run",
    "cup-catch",
    "dog-stand",
    "dog-walk",
    "dog-trot",
    "dog-run",
    "finger-spin",
    "finger-turn-easy",
    "finger-turn-hard",
    "fish-swim",
    "hopper-stand",
    "hopper-hop",
    "humanoid-stand",
    "humanoid-walk",
    "humanoid-run",
    "pendulum-swingup",
    "quadruped-walk",
    "quadruped-run",
    "reacher-easy",
    "reacher-hard",
    "walker-stand",
    "walker-walk",
    "walker-run",
];

pub const ACTION_REPEAT: usize = 2;
pub const EPISODE_LENGTH: usize = 500;

const SOURCE: &str = include_str!("py/dmc_adapter.py");

fn module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    MODULE
        .get_or_try_init(py, || {
            python::load_module(py, SOURCE, "tdmpc2_dmc_adapter").map(Bound::unbind)
        })
        .map(|m| m.bind(py))
}

/// `"cup-catch"` -> `("ball_in_cup", "catch")`: dashes become underscores, the domain is
/// everything before the first one.
pub fn domain_and_task(name: &str) -> Option<(String, String)> {
    let name = name.replace('-', "_");
    let (domain, task) = name.split_once('_')?;
    let domain = match domain {
        "cup" => "ball_in_cup",
        "pointmass" => "point_mass",
        other => other,
    };
    Some((domain.to_string(), task.to_string()))
}

/// dm_control seeds `numpy.random.RandomState`, which takes 32-bit seeds.
fn check_seed(task: &str, seed: u64) -> Result<u32> {
    u32::try_from(seed).map_err(|_| Error::InvalidSeed {
        task: task.into(),
        seed,
        reason: "dm_control seeds must be below 2^32".into(),
    })
}

/// A suite task, unwrapped: one physics-control step per `step`, never terminates.
pub struct DmcEnv {
    name: String,
    adapter: Py<PyAny>,
    spec: EnvSpec,
    bounds: ActionBox,
}

impl DmcEnv {
    pub fn new(name: &str, seed: u64) -> Result<Self> {
        let unknown = || Error::UnknownTask {
            name: name.into(),
            suggestions: vec![],
        };
        let (domain, task) = domain_and_task(name).ok_or_else(unknown)?;
        let seed = check_seed(name, seed)?;
        python::attach_exclusive(|py| {
            let adapter = module(py)?
                .getattr("DmcAdapter")?
                .call1((domain, task, seed))?;
            let obs_dim: usize = adapter.getattr("obs_dim")?.extract()?;
            let low: Vec<f64> = adapter.getattr("action_low")?.extract()?;
            let high: Vec<f64> = adapter.getattr("action_high")?.extract()?;
            Ok(Self {
                name: name.into(),
                spec: EnvSpec {
                    obs_shape: vec![obs_dim],
                    action_dim: low.len(),
                    episode_length: EPISODE_LENGTH * ACTION_REPEAT,
                },
                bounds: ActionBox { low, high },
                adapter: adapter.unbind(),
            })
        })
    }

    /// The current frame from `camera`, `size`×`size` RGB, row-major, 3 bytes a pixel. Needs
    /// a process started with `MUJOCO_GL` set to a renderer (`egl` headless).
    pub fn render(&self, size: usize, camera: usize) -> Result<Vec<u8>> {
        python::attach_exclusive(|py| {
            let frame = self
                .adapter
                .bind(py)
                .call_method1("render", (size, camera))?;
            let bytes = frame.cast::<PyBytes>().map_err(PyErr::from)?;
            Ok(bytes.as_bytes().to_vec())
        })
    }
}

impl Env for DmcEnv {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>> {
        let seed = seed.map(|s| check_seed(&self.name, s)).transpose()?;
        python::attach(|py| {
            python::f32_vec(
                &self
                    .adapter
                    .bind(py)
                    .call_method1(intern!(py, "reset"), (seed,))?,
            )
        })
    }

    fn step(&mut self, action: &[f32]) -> Result<Step> {
        self.spec.check_action(action)?;
        python::attach(|py| {
            let action = PyArray1::from_slice(py, action);
            let out = self
                .adapter
                .bind(py)
                .call_method1(intern!(py, "step"), (action,))?;
            let (obs, reward): (Bound<'_, PyAny>, f64) = out.extract()?;
            Ok(Step {
                obs: python::f32_vec::<Error>(&obs)?,
                reward,
                terminated: false,
                truncated: false,
                success: None,
            })
        })
    }
}

impl BoxEnv for DmcEnv {
    fn action_box(&self) -> &ActionBox {
        &self.bounds
    }
}

/// Fully wrapped task: actions in [-1, 1], action repeat 2, 500 agent steps per episode.
pub fn make(name: &str, seed: u64) -> Result<Box<dyn Env>> {
    wrap(DmcEnv::new(name, seed)?, ACTION_REPEAT, EPISODE_LENGTH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_suite_domains() {
        let pair = |d: &str, t: &str| Some((d.to_string(), t.to_string()));
        assert_eq!(domain_and_task("cup-catch"), pair("ball_in_cup", "catch"));
        assert_eq!(
            domain_and_task("cartpole-swingup-sparse"),
            pair("cartpole", "swingup_sparse")
        );
        assert_eq!(
            domain_and_task("finger-turn-easy"),
            pair("finger", "turn_easy")
        );
        assert_eq!(
            domain_and_task("pointmass-easy"),
            pair("point_mass", "easy")
        );
        assert_eq!(domain_and_task("walker"), None);
    }
}
