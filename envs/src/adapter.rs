//! An environment behind a Python adapter object: the per-step glue that the gymnasium,
//! Meta-World and MyoSuite families share.
//!
//! An adapter has `obs_shape`, `action_low`, `action_high` and `episode_length`, and the
//! methods `reset(seed)` (a float32 observation), `step(action)` (`(obs, reward, terminated,
//! truncated, success or None)`), `render()` (`(bytes, height, width)`) and `close()`. Its
//! module defines `Unsupported`, raised for an environment that exists but cannot be used.
use numpy::PyArray1;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyBytes;

use crate::{ActionBox, BoxEnv, Env, EnvOptions, EnvSpec, Error, Frame, ObsKind, Result, Step};
use embedded_python as python;

/// An adapter module embedded in the binary, loaded once per process into `cell`.
pub(crate) fn load_once<'py>(
    cell: &'static PyOnceLock<Py<PyModule>>,
    py: Python<'py>,
    source: &str,
    name: &str,
) -> PyResult<&'py Bound<'py, PyModule>> {
    cell.get_or_try_init(py, || {
        python::load_module(py, source, name).map(Bound::unbind)
    })
    .map(|m| m.bind(py))
}

/// Refuses pixel observations for a family that, as in the official code, observes state
/// only (its videos still render).
pub(crate) fn state_only(task: &str, family: &str, options: EnvOptions) -> Result<()> {
    match options.obs {
        ObsKind::State => Ok(()),
        ObsKind::Rgb => Err(Error::Unsupported {
            task: task.into(),
            reason: format!(
                "{family} tasks observe state only (obs=state), as in the official code"
            ),
        }),
    }
}

/// Seeds the family's simulators take: numpy's legacy generator needs them below 2^32.
pub(crate) fn check_seed(task: &str, seed: u64) -> Result<u32> {
    u32::try_from(seed).map_err(|_| Error::InvalidSeed {
        task: task.into(),
        seed,
        reason: "this simulator takes seeds below 2^32".into(),
    })
}

/// A Python environment, unwrapped: actions in its own Box, observations flattened to f32.
pub struct AdapterEnv {
    adapter: Py<PyAny>,
    spec: EnvSpec,
    bounds: ActionBox,
    /// Seed for the first `reset(None)`, so that making an env with a seed is reproducible.
    pending_seed: Option<u64>,
    /// Whether it renders through MuJoCo (whose backend `MUJOCO_GL` chooses).
    mujoco: bool,
}

impl AdapterEnv {
    /// `module.class(*args)`, for `task` (named in its errors); the first reset uses `seed`.
    pub fn new<'py>(
        module: &Bound<'py, PyModule>,
        class: &str,
        args: impl pyo3::call::PyCallArgs<'py>,
        task: &str,
        seed: u64,
    ) -> Result<Self> {
        let py = module.py();
        let adapter = module.getattr(class)?.call1(args).map_err(|err| {
            if module
                .getattr("Unsupported")
                .is_ok_and(|t| err.is_instance(py, &t))
            {
                Error::Unsupported {
                    task: task.into(),
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
            mujoco: false,
        })
    }

    /// Marks the env as one that renders through MuJoCo: a failure to render then names the
    /// backend and what this machine has (see [`crate::renderer`]).
    pub fn rendering_with_mujoco(mut self, mujoco: bool) -> Self {
        self.mujoco = mujoco;
        self
    }
}

impl Env for AdapterEnv {
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
        self.step_with(action)
    }

    /// The env's own `rgb_array` frame, whatever its size (`size` is not the env's to choose).
    fn render(&mut self, _size: usize) -> Result<Frame> {
        python::attach_exclusive(|py| {
            let out = self
                .adapter
                .bind(py)
                .call_method0(intern!(py, "render"))
                .map_err(|e| match self.mujoco {
                    true => crate::renderer::failure(e.into()),
                    false => Error::from(e),
                })?;
            let (bytes, height, width): (Bound<'_, PyBytes>, usize, usize) = out.extract()?;
            Ok(Frame {
                height,
                width,
                rgb: bytes.as_bytes().to_vec(),
            })
        })
    }
}

impl AdapterEnv {
    /// A step with the action in float32 or, rescaled, float64 (the adapter casts it to the
    /// environment's own type).
    fn step_with<T: numpy::Element>(&mut self, action: &[T]) -> Result<Step> {
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
}

impl BoxEnv for AdapterEnv {
    fn action_box(&self) -> &ActionBox {
        &self.bounds
    }

    fn step_in_box(&mut self, action: &[f64]) -> Result<Step> {
        self.step_with(action)
    }
}

impl Drop for AdapterEnv {
    fn drop(&mut self) {
        // Closing releases renderers and simulator handles; errors at teardown are moot.
        let _: Result<()> =
            python::attach(|py| Ok(self.adapter.bind(py).call_method0("close").map(drop)?));
    }
}
