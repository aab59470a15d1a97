//! Native Pendulum-v1 / MountainCarContinuous-v0 against gymnasium's own implementation.
mod common;

use envs::{Env, Step};
use pyo3::prelude::*;

const TOLERANCE: f64 = 1e-5;

/// gymnasium's env behind gymnasium's own RescaleAction, stepped with float32 actions.
const REFERENCE: &str = r#"
import gymnasium
import numpy as np

class Reference:
    def __init__(self, env_id):
        self.env = gymnasium.wrappers.RescaleAction(
            gymnasium.make(env_id), np.float32(-1.0), np.float32(1.0)
        )

    def reset(self, seed):
        obs, _ = self.env.reset(seed=seed)
        return [float(x) for x in obs]

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.env.step(np.array(action, dtype=np.float32))
        return [float(x) for x in obs], float(reward), bool(terminated), bool(truncated)
"#;

struct Reference(Py<PyAny>);

impl Reference {
    fn new(id: &str) -> Self {
        Self(common::with_module(
            REFERENCE,
            "native_parity_reference",
            |m| Ok(m.getattr("Reference")?.call1((id,))?.unbind()),
        ))
    }

    fn reset(&self, seed: Option<u64>) -> Vec<f32> {
        Python::attach(|py| {
            self.0
                .bind(py)
                .call_method1("reset", (seed,))
                .unwrap()
                .extract()
                .unwrap()
        })
    }

    fn step(&self, action: &[f32]) -> Step {
        Python::attach(|py| {
            let (obs, reward, terminated, truncated): (Vec<f32>, f64, bool, bool) = self
                .0
                .bind(py)
                .call_method1("step", (action.to_vec(),))
                .unwrap()
                .extract()
                .unwrap();
            Step {
                obs,
                reward,
                terminated,
                truncated,
                success: None,
            }
        })
    }
}

/// Runs both envs side by side from `reset(seed)`; `policy` picks the next action from the
/// last observation and step index. Returns the largest deviation seen.
fn compare(
    ours: &mut dyn Env,
    reference: &Reference,
    seed: Option<u64>,
    steps: usize,
    policy: &mut dyn FnMut(&[f32], usize) -> Vec<f32>,
) -> (f64, usize) {
    let mut obs = ours.reset(seed).unwrap();
    let expected = reference.reset(seed);
    let mut worst = common::max_abs_diff(&obs, &expected);
    assert!(
        worst <= TOLERANCE,
        "reset({seed:?}): {obs:?} vs {expected:?}"
    );
    for t in 0..steps {
        let action = policy(&obs, t);
        let got = ours.step(&action).unwrap();
        let want = reference.step(&action);
        let diff = common::max_abs_diff(&got.obs, &want.obs).max((got.reward - want.reward).abs());
        assert!(
            diff <= TOLERANCE,
            "seed {seed:?} step {t}: {got:?} vs {want:?}"
        );
        assert_eq!(
            (got.terminated, got.truncated),
            (want.terminated, want.truncated),
            "seed {seed:?} step {t}"
        );
        worst = worst.max(diff);
        obs = got.obs;
        if got.terminated || got.truncated {
            return (worst, t + 1);
        }
    }
    (worst, steps)
}

fn replay(actions: Vec<Vec<f32>>) -> impl FnMut(&[f32], usize) -> Vec<f32> {
    move |_, t| actions[t].clone()
}

#[test]
fn pendulum_matches_gymnasium() {
    let reference = Reference::new("Pendulum-v1");
    for seed in [0u64, 1, 42, 123_456_789, (1 << 40) + 3] {
        let mut ours = envs::make("Pendulum-v1", seed).unwrap();
        assert_eq!(ours.spec().episode_length, 200);
        let mut actions = common::actions(seed, 400, 1);
        // Saturated torques exercise the clip at the box bounds.
        actions[10] = vec![1.0];
        actions[11] = vec![-1.0];
        let (first, n) = compare(
            ours.as_mut(),
            &reference,
            Some(seed),
            200,
            &mut replay(actions[..200].to_vec()),
        );
        assert_eq!(n, 200, "truncated at the 200th step");
        // reset(None) continues the seeded stream on both sides.
        let (second, _) = compare(
            ours.as_mut(),
            &reference,
            None,
            200,
            &mut replay(actions[200..].to_vec()),
        );
        eprintln!(
            "Pendulum seed {seed}: max deviation {:.3e}",
            first.max(second)
        );
    }
}

#[test]
fn pendulum_through_gymnasium_matches_native() {
    let mut native = envs::make("Pendulum-v1", 7).unwrap();
    let mut gym = envs::make("gym:Pendulum-v1", 7).unwrap();
    assert_eq!(native.spec(), gym.spec());
    for seed in [None, Some(3), None] {
        let first = native.reset(seed).unwrap();
        assert!(common::max_abs_diff(&first, &gym.reset(seed).unwrap()) <= TOLERANCE);
        for action in common::actions(11, 200, 1) {
            let (a, b) = (native.step(&action).unwrap(), gym.step(&action).unwrap());
            assert!(
                common::max_abs_diff(&a.obs, &b.obs) <= TOLERANCE
                    && (a.reward - b.reward).abs() <= TOLERANCE
            );
            assert_eq!((a.terminated, a.truncated), (b.terminated, b.truncated));
        }
    }
}

#[test]
fn mountain_car_matches_gymnasium() {
    let reference = Reference::new("MountainCarContinuous-v0");
    let mut reached_goal = false;
    for seed in [0u64, 5, 2024] {
        let mut ours = envs::make("MountainCarContinuous-v0", seed).unwrap();
        assert_eq!(ours.spec().episode_length, 999);
        let noise = common::actions(seed, 999, 1);
        // Random actions first, then noisy pumping along the velocity, which reaches the flag.
        let mut policy = |obs: &[f32], t: usize| {
            if t < 100 {
                noise[t].clone()
            } else {
                let push = if obs[1] >= 0.0 { 1.0 } else { -1.0 };
                vec![(push * 0.8 + 0.2 * noise[t][0]).clamp(-1.0, 1.0)]
            }
        };
        let (worst, n) = compare(ours.as_mut(), &reference, Some(seed), 999, &mut policy);
        reached_goal |= n < 999;
        let (again, _) = compare(
            ours.as_mut(),
            &reference,
            None,
            300,
            &mut replay(noise.clone()),
        );
        eprintln!(
            "MountainCar seed {seed}: {n} steps, max deviation {:.3e}",
            worst.max(again)
        );
    }
    assert!(reached_goal, "no episode terminated at the goal");
}
