//! DeepMind Control Suite tasks, loaded and wrapped as the official TD-MPC2 code does.
use numpy::PyArray1;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyBytes;

use crate::wrappers::wrap_observed;
use crate::{ActionBox, BoxEnv, Env, EnvOptions, EnvSpec, Error, Frame, Result, Step};
use embedded_python as python;

/// The 28 standard TD-MPC2 DMControl tasks.
pub const STANDARD_TASKS: [&str; 28] = [
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

/// The official custom tasks (defined in `py/dmc_custom.py`): the 11 of the mt30 set, then
/// 17 more.
pub const CUSTOM_TASKS: [&str; 28] = [
    "walker-walk-backwards",
    "walker-run-backwards",
    "cheetah-run-backwards",
    "cheetah-run-front",
    "cheetah-run-back",
    "cheetah-jump",
    "hopper-hop-backwards",
    "reacher-three-easy",
    "reacher-three-hard",
    "cup-spin",
    "pendulum-spin",
    "walker-arabesque",
    "walker-lie-down",
    "walker-legs-up",
    "walker-headstand",
    "walker-flip",
    "walker-backflip",
    "cheetah-stand-front",
    "cheetah-stand-back",
    "cheetah-lie-down",
    "cheetah-legs-up",
    "cheetah-flip",
    "cheetah-flip-backwards",
    "hopper-flip",
    "hopper-flip-backwards",
    "reacher-four-easy",
    "reacher-four-hard",
    "fish-obstacles",
];

/// dm_control's other suite tasks, outside the TD-MPC2 benchmark, which the official code
/// loads by the same names. Not `humanoid_CMU`'s, which no such name reaches (its domain has an
/// underscore), nor `lqr`'s, whose actions dm_control leaves unbounded (±1e10: rescaled from
/// [-1, 1], they would throw the system out of its stable range at once), nor
/// `quadruped-escape`, whose every reset needs an OpenGL context, pixels or not.
pub const OTHER_SUITE_TASKS: [&str; 17] = [
    "acrobot-swingup-sparse",
    "cartpole-two-poles",
    "cartpole-three-poles",
    "dog-fetch",
    "fish-upright",
    "humanoid-run-pure-state",
    "manipulator-bring-ball",
    "manipulator-bring-peg",
    "manipulator-insert-ball",
    "manipulator-insert-peg",
    "pointmass-easy",
    "pointmass-hard",
    "quadruped-fetch",
    "stacker-stack-2",
    "stacker-stack-4",
    "swimmer-swimmer6",
    "swimmer-swimmer15",
];

/// Every DMControl task: the standard ones, dm_control's others, then the custom ones.
pub fn tasks() -> impl Iterator<Item = &'static str> {
    STANDARD_TASKS
        .iter()
        .chain(&OTHER_SUITE_TASKS)
        .chain(&CUSTOM_TASKS)
        .copied()
}

pub fn is_task(name: &str) -> bool {
    tasks().any(|task| task == name)
}

pub const ACTION_REPEAT: usize = 2;
pub const EPISODE_LENGTH: usize = 500;

const SOURCE: &str = include_str!("py/dmc_adapter.py");
/// The custom tasks, which the adapter imports as `tdmpc2_dmc_custom`.
const CUSTOM_SOURCE: &str = include_str!("py/dmc_custom.py");

/// The adapter module. The first load imports dm_control, which fixes its renderer for the
/// process from `MUJOCO_GL`: when the user set none, EGL (headless) if `renders`, else none
/// (state observations need no OpenGL; without one dm_control probes GLFW and warns
/// headless). That default is taken back from the environment after the import, so that
/// processes started later (environment workers) choose their own. A call that needs
/// rendering in a process loaded without a renderer is an error.
fn module(py: Python<'_>, renders: bool) -> Result<&Bound<'_, PyModule>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    let module = MODULE
        .get_or_try_init(py, || {
            let environ = py.import("os")?.getattr("environ")?;
            let chosen = environ.call_method1("get", ("MUJOCO_GL",))?;
            if chosen.is_none() {
                let default = if renders { "egl" } else { "disable" };
                environ.set_item("MUJOCO_GL", default)?;
            }
            // Loading a module registers it in `sys.modules`, where the adapter's import
            // finds the custom tasks.
            let module = python::load_module(py, CUSTOM_SOURCE, "tdmpc2_dmc_custom")
                .and_then(|_| python::load_module(py, SOURCE, "tdmpc2_dmc_adapter"));
            if chosen.is_none() {
                environ.del_item("MUJOCO_GL")?;
            }
            module.map(Bound::unbind)
        })?
        .bind(py);
    if renders {
        let backend = py.import("dm_control._render")?.getattr("BACKEND")?;
        let backend: Option<String> = backend.extract()?;
        if backend.as_deref() == Some("disable") {
            return Err(Error::Unsupported {
                task: "rendering".into(),
                reason: "dm_control was loaded in this process without a renderer \
                         (MUJOCO_GL=disable); set MUJOCO_GL=egl (or glfw, osmesa) to render"
                    .into(),
            });
        }
    }
    Ok(module)
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
    /// The official camera: 2 for quadruped, else 0.
    camera: usize,
}

impl DmcEnv {
    /// A task whose state is observed; `renders` loads dm_control with a renderer (pixel
    /// observations, videos).
    pub fn new(name: &str, seed: u64, renders: bool) -> Result<Self> {
        let unknown = || Error::UnknownTask {
            name: name.into(),
            suggestions: vec![],
        };
        let (domain, task) = domain_and_task(name).ok_or_else(unknown)?;
        let seed = check_seed(name, seed)?;
        let camera = if domain == "quadruped" { 2 } else { 0 };
        python::attach_exclusive(|py| {
            // With a renderer, loading dm_control starts the OpenGL backend.
            let module = module(py, renders).map_err(|e| match renders {
                true => crate::renderer::failure(e),
                false => e,
            })?;
            let adapter = module.getattr("DmcAdapter")?.call1((domain, task, seed))?;
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
                camera,
            })
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
        self.step_with(action)
    }

    /// The frame from the task's camera. Needs dm_control loaded with a renderer (see
    /// [`DmcEnv::new`]'s `renders`).
    fn render(&mut self, size: usize) -> Result<Frame> {
        python::attach_exclusive(|py| {
            let frame = self
                .adapter
                .bind(py)
                .call_method1(intern!(py, "render"), (size, self.camera))
                .map_err(|e| crate::renderer::failure(e.into()))?;
            let bytes = frame.cast::<PyBytes>().map_err(PyErr::from)?;
            Ok(Frame {
                height: size,
                width: size,
                rgb: bytes.as_bytes().to_vec(),
            })
        })
    }
}

impl DmcEnv {
    /// A step with the action in float32 or, rescaled, float64 (which dm_control takes).
    fn step_with<T: numpy::Element>(&mut self, action: &[T]) -> Result<Step> {
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

    fn step_in_box(&mut self, action: &[f64]) -> Result<Step> {
        self.step_with(action)
    }
}

impl Drop for DmcEnv {
    fn drop(&mut self) {
        // Errors at teardown are moot; the contexts are gone with the process anyway.
        let _: Result<()> =
            python::attach(|py| Ok(self.adapter.bind(py).call_method0("close").map(drop)?));
    }
}

/// Fully wrapped task: actions in [-1, 1], action repeat 2, 500 agent steps per episode.
pub fn make(name: &str, seed: u64, options: EnvOptions) -> Result<Box<dyn Env>> {
    let env = DmcEnv::new(name, seed, options.renders())?;
    wrap_observed(env, ACTION_REPEAT, EPISODE_LENGTH, options.obs)
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
