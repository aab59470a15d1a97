//! Environment throughput measurement.
use std::time::Instant;

use crate::np_random::NpRandom;
use crate::{Env, Result};

/// Agent steps per second under uniform random actions, resetting whenever an episode ends.
/// Reset time is included; the initial reset is not.
pub fn steps_per_second(env: &mut dyn Env, steps: usize, seed: u64) -> Result<f64> {
    let mut rng = NpRandom::new(seed);
    let mut action = vec![0.0f32; env.spec().action_dim];
    env.reset(Some(seed))?;
    let start = Instant::now();
    for _ in 0..steps {
        for a in action.iter_mut() {
            *a = rng.uniform(-1.0, 1.0) as f32;
        }
        let step = env.step(&action)?;
        if step.terminated || step.truncated {
            env.reset(None)?;
        }
    }
    Ok(steps as f64 / start.elapsed().as_secs_f64().max(f64::MIN_POSITIVE))
}
