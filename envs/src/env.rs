//! The environment interface shared by native, gymnasium and dm_control tasks.
use crate::{Error, Result};

/// Shapes and horizon of an environment as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvSpec {
    pub obs_shape: Vec<usize>,
    pub action_dim: usize,
    /// Steps after which the episode is truncated.
    pub episode_length: usize,
}

impl EnvSpec {
    /// Number of floats in one observation.
    pub fn obs_dim(&self) -> usize {
        self.obs_shape.iter().product()
    }

    /// Errors unless `action` has exactly `action_dim` components.
    pub fn check_action(&self, action: &[f32]) -> Result<()> {
        if action.len() == self.action_dim {
            Ok(())
        } else {
            Err(Error::ActionLength {
                expected: self.action_dim,
                got: action.len(),
            })
        }
    }
}

/// The outcome of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub obs: Vec<f32>,
    pub reward: f64,
    pub terminated: bool,
    pub truncated: bool,
    pub success: Option<f64>,
}

pub trait Env: Send {
    fn spec(&self) -> &EnvSpec;
    /// Some(seed) reseeds the env's random stream (gymnasium semantics); None continues it.
    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>>;
    /// action in [-1, 1]^action_dim (after the RescaleAction wrapper); wrong length -> Error, not panic.
    fn step(&mut self, action: &[f32]) -> Result<Step>;
}

impl<E: Env + ?Sized> Env for Box<E> {
    fn spec(&self) -> &EnvSpec {
        (**self).spec()
    }
    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>> {
        (**self).reset(seed)
    }
    fn step(&mut self, action: &[f32]) -> Result<Step> {
        (**self).step(action)
    }
}

/// Per-component bounds of a continuous (Box) action space.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionBox {
    pub low: Vec<f64>,
    pub high: Vec<f64>,
}

/// An unwrapped environment that takes actions in its own [`ActionBox`].
pub trait BoxEnv: Env {
    fn action_box(&self) -> &ActionBox;
}
