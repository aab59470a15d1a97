//! gymnasium 1.4 `Pendulum-v1` (classic_control/pendulum.py).
//!
//! The state is float64 as in gymnasium, but the torque is the float32 action: under numpy's
//! promotion rules `3.0 * u` and `0.001 * u**2` are float32 products, reproduced here.
use std::f64::consts::PI;

use crate::np_random::NpRandom;
use crate::{ActionBox, BoxEnv, Env, EnvSpec, Error, Result, Step};

pub const ID: &str = "Pendulum-v1";
pub const EPISODE_LENGTH: usize = 200;

const MAX_SPEED: f64 = 8.0;
const MAX_TORQUE: f32 = 2.0;
const DT: f64 = 0.05;
const G: f64 = 10.0;
const INIT_ANGLE: f64 = PI;
const INIT_SPEED: f64 = 1.0;

pub struct Pendulum {
    spec: EnvSpec,
    bounds: ActionBox,
    rng: NpRandom,
    /// (theta, theta_dot); None before the first reset.
    state: Option<(f64, f64)>,
}

impl Pendulum {
    /// The first `reset(None)` draws from the stream seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            spec: EnvSpec {
                obs_shape: vec![3],
                action_dim: 1,
                episode_length: EPISODE_LENGTH,
            },
            bounds: ActionBox {
                low: vec![-f64::from(MAX_TORQUE)],
                high: vec![f64::from(MAX_TORQUE)],
            },
            rng: NpRandom::new(seed),
            state: None,
        }
    }

    fn observe(theta: f64, theta_dot: f64) -> Vec<f32> {
        vec![theta.cos() as f32, theta.sin() as f32, theta_dot as f32]
    }
}

/// Python's float `%`: the result takes the sign of the divisor.
fn py_mod(a: f64, b: f64) -> f64 {
    let r = a % b;
    if r != 0.0 && (r < 0.0) != (b < 0.0) {
        r + b
    } else if r == 0.0 {
        0.0f64.copysign(b)
    } else {
        r
    }
}

fn angle_normalize(x: f64) -> f64 {
    py_mod(x + PI, 2.0 * PI) - PI
}

impl Env for Pendulum {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>> {
        if let Some(seed) = seed {
            self.rng = NpRandom::new(seed);
        }
        let theta = self.rng.uniform(-INIT_ANGLE, INIT_ANGLE);
        let theta_dot = self.rng.uniform(-INIT_SPEED, INIT_SPEED);
        self.state = Some((theta, theta_dot));
        Ok(Self::observe(theta, theta_dot))
    }

    fn step(&mut self, action: &[f32]) -> Result<Step> {
        self.spec.check_action(action)?;
        let (th, thdot) = self.state.ok_or(Error::NeedsReset)?;
        let u = action[0].clamp(-MAX_TORQUE, MAX_TORQUE);
        let costs =
            angle_normalize(th).powi(2) + 0.1 * (thdot * thdot) + f64::from(0.001f32 * (u * u));
        let accel = 3.0 * G / 2.0 * th.sin() + f64::from(3.0f32 * u);
        let new_thdot = (thdot + accel * DT).clamp(-MAX_SPEED, MAX_SPEED);
        let new_th = th + new_thdot * DT;
        self.state = Some((new_th, new_thdot));
        Ok(Step {
            obs: Self::observe(new_th, new_thdot),
            reward: -costs,
            terminated: false,
            truncated: false,
            success: None,
        })
    }
}

impl BoxEnv for Pendulum {
    fn action_box(&self) -> &ActionBox {
        &self.bounds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_modulo_semantics() {
        assert_eq!(py_mod(-1.0, 3.0), 2.0);
        assert_eq!(py_mod(4.0, 3.0), 1.0);
        assert!(angle_normalize(3.0 * PI).abs() - PI < 1e-12);
    }

    #[test]
    fn step_before_reset_is_an_error() {
        let mut env = Pendulum::new(0);
        assert!(matches!(env.step(&[0.0]), Err(Error::NeedsReset)));
        env.reset(None).unwrap();
        assert!(matches!(
            env.step(&[0.0, 1.0]),
            Err(Error::ActionLength {
                expected: 1,
                got: 2
            })
        ));
    }
}
