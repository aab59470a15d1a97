//! Any gymnasium env with a Box action space, driven through pyo3.
use numpy::PyArray1;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use pyo3::types::PyBytes;

use crate::wrappers::wrap_observed;
use crate::{ActionBox, BoxEnv, Env, EnvOptions, EnvSpec, Error, Frame, Result, Step};
use embedded_python as python;

/// Prefix that forces the gymnasium implementation of a task that also exists natively.
pub const PREFIX: &str = "gym:";

const SOURCE: &str = include_str!("py/gym_adapter.py");

fn module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    MODULE
        .get_or_try_init(py, || {
            python::load_module(py, SOURCE, "tdmpc2_gym_adapter").map(Bound::unbind)
        })
        .map(|m| m.bind(py))
}

/// All ids in gymnasium's registry.
pub fn registered_ids() -> Result<Vec<String>> {
    python::attach_exclusive(|py| Ok(module(py)?.call_method0("registered_ids")?.extract()?))
}

/// A gymnasium env, unwrapped: actions in its own Box, observations flattened to f32.
pub struct GymEnv {
    adapter: Py<PyAny>,
    spec: EnvSpec,
    bounds: ActionBox,
    /// Seed for the first `reset(None)`, so `make(task, seed)` is reproducible.
    pending_seed: Option<u64>,
}

impl GymEnv {
    /// `renders`: made with `render_mode="rgb_array"` (pixel observations, videos).
    pub fn new(id: &str, seed: u64, renders: bool) -> Result<Self> {
        python::attach_exclusive(|py| {
            let module = module(py)?;
            let adapter = module
                .getattr("GymAdapter")?
                .call1((id, renders))
                .map_err(|err| {
                    if module
                        .getattr("Unsupported")
                        .is_ok_and(|t| err.is_instance(py, &t))
                    {
                        Error::Unsupported {
                            task: id.into(),
                            reason: err.value(py).to_string(),
                        }
                    } else {
                        Error::from(err)
                    }
                })?;
            let obs_shape: Vec<usize> = adapter.getattr("obs_shape")?.extract()?;
            let low: Vec<f64> = adapter.getattr("action_low")?.extract()?;
            let high: Vec<f64> = adapter.getattr("action_high")?.extract()?;
            let episode_length: usize = adapter.getattr("episode_length")?.extract()?;
            Ok(Self {
                spec: EnvSpec {
                    obs_shape,
                    action_dim: low.len(),
                    episode_length,
                },
                bounds: ActionBox { low, high },
                adapter: adapter.unbind(),
                pending_seed: Some(seed),
            })
        })
    }
}

impl Env for GymEnv {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>> {
        let seed = seed.or(self.pending_seed.take());
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
            let (obs, reward, terminated, truncated, success): (
                Bound<'_, PyAny>,
                f64,
                bool,
                bool,
                Option<f64>,
            ) = out.extract()?;
            Ok(Step {
                obs: python::f32_vec::<Error>(&obs)?,
                reward,
                terminated,
                truncated,
                success,
            })
        })
    }

    /// The env's own `rgb_array` frame, whatever its size (`size` is not the env's to choose).
    fn render(&mut self, _size: usize) -> Result<Frame> {
        python::attach_exclusive(|py| {
            let out = self.adapter.bind(py).call_method0(intern!(py, "render"))?;
            let (bytes, height, width): (Bound<'_, PyBytes>, usize, usize) = out.extract()?;
            Ok(Frame {
                height,
                width,
                rgb: bytes.as_bytes().to_vec(),
            })
        })
    }
}

impl BoxEnv for GymEnv {
    fn action_box(&self) -> &ActionBox {
        &self.bounds
    }
}

impl Drop for GymEnv {
    fn drop(&mut self) {
        // Closing releases renderers and simulator handles; errors at teardown are moot.
        let _: Result<()> =
            python::attach(|py| Ok(self.adapter.bind(py).call_method0("close").map(drop)?));
    }
}

/// Fully wrapped gymnasium env (no action repeat; the env's own episode length).
pub fn make(id: &str, seed: u64, options: EnvOptions) -> Result<Box<dyn Env>> {
    let env = GymEnv::new(id, seed, options.renders())?;
    let episode_length = env.spec.episode_length;
    wrap_observed(env, 1, episode_length, options.obs)
}
