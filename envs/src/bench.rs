//! Environment throughput measurement.
use std::time::Instant;

use crate::np_random::NpRandom;
use crate::{Env, Result, VectorEnv};

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

/// Agent steps per second of a vector env: every env steps under uniform random actions at
/// each vector step, and an env whose episode ends resets alone. `agent_steps` counts all
/// envs' steps (rounded up to whole vector steps); the initial resets are not timed.
pub fn vector_steps_per_second(venv: &mut VectorEnv, agent_steps: usize, seed: u64) -> Result<f64> {
    let n = venv.num_envs();
    let mut rng = NpRandom::new(seed);
    let mut actions = vec![0.0f32; n * venv.spec().action_dim];
    for i in 0..n {
        venv.reset(i, Some(seed + i as u64))?;
    }
    let all: Vec<usize> = (0..n).collect();
    let vector_steps = agent_steps.div_ceil(n).max(1);
    let start = Instant::now();
    for _ in 0..vector_steps {
        for a in actions.iter_mut() {
            *a = rng.uniform(-1.0, 1.0) as f32;
        }
        let steps = venv.step(&all, &actions)?;
        for (i, step) in steps.iter().enumerate() {
            if step.terminated || step.truncated {
                venv.reset(i, None)?;
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
    Ok((vector_steps * n) as f64 / elapsed)
}
