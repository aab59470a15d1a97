//! gymnasium 1.4 `MountainCarContinuous-v0` (classic_control/continuous_mountain_car.py).
//!
//! gymnasium mixes numpy float32/float64 scalars and Python floats in this env (the state is
//! float64 after reset and float32 after every step; clipping assigns Python floats), and
//! numpy's promotion rules (NEP 50) decide the precision of each operation. [`Num`] tracks
//! which of the three a value is so every operation rounds as it does in gymnasium.
use crate::np_random::NpRandom;
use crate::{ActionBox, BoxEnv, Env, EnvSpec, Error, Result, Step};

pub const ID: &str = "MountainCarContinuous-v0";
pub const EPISODE_LENGTH: usize = 999;

const MIN_ACTION: f64 = -1.0;
const MAX_ACTION: f64 = 1.0;
const MIN_POSITION: f64 = -1.2;
const MAX_POSITION: f64 = 0.6;
const MAX_SPEED: f64 = 0.07;
const GOAL_POSITION: f64 = 0.45;
const GOAL_VELOCITY: f64 = 0.0;
const POWER: f64 = 0.0015;

/// A scalar as gymnasium holds it: numpy float32, numpy float64, or a Python float.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    F32(f32),
    F64(f64),
    Py(f64),
}

impl Num {
    fn value(self) -> f64 {
        match self {
            Num::F32(x) => f64::from(x),
            Num::F64(x) | Num::Py(x) => x,
        }
    }

    fn as_f32(self) -> f32 {
        match self {
            Num::F32(x) => x,
            Num::F64(x) | Num::Py(x) => x as f32,
        }
    }

    /// NEP 50: float64 wins; float32 with a Python float stays float32.
    fn binary(self, other: Num, op32: fn(f32, f32) -> f32, op64: fn(f64, f64) -> f64) -> Num {
        match (self, other) {
            (Num::F64(_), _) | (_, Num::F64(_)) => Num::F64(op64(self.value(), other.value())),
            (Num::Py(a), Num::Py(b)) => Num::Py(op64(a, b)),
            _ => Num::F32(op32(self.as_f32(), other.as_f32())),
        }
    }

    fn add(self, other: Num) -> Num {
        self.binary(other, |a, b| a + b, |a, b| a + b)
    }

    fn sub(self, other: Num) -> Num {
        self.binary(other, |a, b| a - b, |a, b| a - b)
    }

    fn mul(self, other: Num) -> Num {
        self.binary(other, |a, b| a * b, |a, b| a * b)
    }

    /// Compares with a Python float literal, which a float32 compares against as float32.
    fn cmp(self, literal: f64) -> Option<std::cmp::Ordering> {
        match self {
            Num::F32(x) => x.partial_cmp(&(literal as f32)),
            Num::F64(x) | Num::Py(x) => x.partial_cmp(&literal),
        }
    }

    fn gt(self, literal: f64) -> bool {
        self.cmp(literal) == Some(std::cmp::Ordering::Greater)
    }

    fn lt(self, literal: f64) -> bool {
        self.cmp(literal) == Some(std::cmp::Ordering::Less)
    }

    fn eq(self, literal: f64) -> bool {
        self.cmp(literal) == Some(std::cmp::Ordering::Equal)
    }

    fn ge(self, literal: f64) -> bool {
        matches!(
            self.cmp(literal),
            Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)
        )
    }
}

pub struct MountainCarContinuous {
    spec: EnvSpec,
    bounds: ActionBox,
    rng: NpRandom,
    /// (position, velocity); None before the first reset.
    state: Option<(Num, Num)>,
}

impl MountainCarContinuous {
    /// The first `reset(None)` draws from the stream seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            spec: EnvSpec {
                obs_shape: vec![2],
                action_dim: 1,
                episode_length: EPISODE_LENGTH,
            },
            bounds: ActionBox {
                low: vec![MIN_ACTION],
                high: vec![MAX_ACTION],
            },
            rng: NpRandom::new(seed),
            state: None,
        }
    }
}

impl Env for MountainCarContinuous {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>> {
        if let Some(seed) = seed {
            self.rng = NpRandom::new(seed);
        }
        let position = self.rng.uniform(-0.6, -0.4);
        self.state = Some((Num::F64(position), Num::F64(0.0)));
        Ok(vec![position as f32, 0.0])
    }

    fn step(&mut self, action: &[f32]) -> Result<Step> {
        self.spec.check_action(action)?;
        let (mut position, mut velocity) = self.state.ok_or(Error::NeedsReset)?;
        let a = action[0];
        // min(max(a, -1.0), 1.0) keeps the numpy scalar unless a bound replaces it.
        let force = if f64::from(a) < MIN_ACTION {
            Num::Py(MIN_ACTION)
        } else if f64::from(a) > MAX_ACTION {
            Num::Py(MAX_ACTION)
        } else {
            Num::F32(a)
        };
        let slope = Num::Py(0.0025 * Num::Py(3.0).mul(position).value().cos());
        velocity = velocity.add(force.mul(Num::Py(POWER)).sub(slope));
        if velocity.gt(MAX_SPEED) {
            velocity = Num::Py(MAX_SPEED);
        }
        if velocity.lt(-MAX_SPEED) {
            velocity = Num::Py(-MAX_SPEED);
        }
        position = position.add(velocity);
        if position.gt(MAX_POSITION) {
            position = Num::Py(MAX_POSITION);
        }
        if position.lt(MIN_POSITION) {
            position = Num::Py(MIN_POSITION);
        }
        if position.eq(MIN_POSITION) && velocity.lt(0.0) {
            velocity = Num::Py(0.0);
        }
        let terminated = position.ge(GOAL_POSITION) && velocity.ge(GOAL_VELOCITY);
        let bonus = if terminated { 100.0 } else { 0.0 };
        let reward = bonus - f64::from(a) * f64::from(a) * 0.1;
        let obs = vec![position.as_f32(), velocity.as_f32()];
        self.state = Some((Num::F32(obs[0]), Num::F32(obs[1])));
        Ok(Step {
            obs,
            reward,
            terminated,
            truncated: false,
            success: None,
        })
    }
}

impl BoxEnv for MountainCarContinuous {
    fn action_box(&self) -> &ActionBox {
        &self.bounds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_follows_nep50() {
        assert_eq!(Num::F32(1.0).mul(Num::Py(0.1)), Num::F32(0.1));
        assert_eq!(Num::F32(1.0).add(Num::F64(0.1)), Num::F64(1.1));
        assert_eq!(Num::Py(1.0).sub(Num::Py(0.5)), Num::Py(0.5));
        // numpy: np.float32(0.07) > 0.07 is False, np.float32(0.45) >= 0.45 is True.
        assert!(!Num::F32(0.07).gt(0.07));
        assert!(Num::F32(0.45).ge(0.45));
        assert!(!Num::F64(f64::from(0.45f32)).ge(0.45));
    }

    #[test]
    fn full_throttle_reaches_the_goal_eventually() {
        let mut env = MountainCarContinuous::new(3);
        env.reset(None).unwrap();
        // Bang-bang control on the sign of the velocity pumps energy into the car.
        let mut push = 1.0f32;
        let reached = (0..EPISODE_LENGTH).any(|_| {
            let step = env.step(&[push]).unwrap();
            push = if step.obs[1] >= 0.0 { 1.0 } else { -1.0 };
            step.terminated
        });
        assert!(reached);
    }
}
