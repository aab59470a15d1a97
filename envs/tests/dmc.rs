//! DMControl tasks through dm_control's suite, wrapped as in TD-MPC2.
mod common;

use envs::{Env, EnvSpec, Error};
use pyo3::prelude::*;

/// Plays one full episode with fixed random actions; checks the 500-step horizon.
fn full_episode(task: &str, obs_dim: usize, action_dim: usize) {
    let mut env = envs::make(task, 1).unwrap();
    assert_eq!(
        env.spec(),
        &EnvSpec {
            obs_shape: vec![obs_dim],
            action_dim,
            episode_length: 500
        }
    );
    let obs = env.reset(None).unwrap();
    assert_eq!(obs.len(), obs_dim);
    let actions = common::actions(2, 500, action_dim);
    for (t, action) in actions.iter().enumerate() {
        let step = env.step(action).unwrap();
        assert_eq!(step.obs.len(), obs_dim);
        assert!(step.obs.iter().all(|x| x.is_finite()) && step.reward.is_finite());
        assert!(!step.terminated, "{task}: terminated at agent step {t}");
        assert_eq!(
            step.truncated,
            t == 499,
            "{task}: truncated flag at agent step {t}"
        );
    }
    assert!(matches!(env.step(&actions[0]), Err(Error::NeedsReset)));
}

#[test]
fn walker_run_dims_and_horizon() {
    full_episode("walker-run", 24, 6);
}

#[test]
fn humanoid_walk_dims_and_horizon() {
    full_episode("humanoid-walk", 67, 21);
}

#[test]
fn dog_run_dims_and_horizon() {
    full_episode("dog-run", 223, 38);
}

/// dm_control driven directly, with action repeat 2 done by hand.
const REFERENCE: &str = r#"
import numpy as np
from dm_control import suite

def rollout(domain, task, seed, actions):
    env = suite.load(domain, task, task_kwargs={"random": seed}, visualize_reward=False)
    flat = lambda ts: [float(x) for v in ts.observation.values() for x in np.asarray(v, np.float32).ravel()]
    out = flat(env.reset())
    for a in actions:
        reward = 0.0
        for _ in range(2):
            ts = env.step(np.asarray(a, np.float64))
            reward += ts.reward
        out += flat(ts) + [reward]
    return out
"#;

fn rollout(env: &mut dyn Env, seed: Option<u64>, actions: &[Vec<f32>]) -> Vec<f64> {
    let mut out: Vec<f64> = env
        .reset(seed)
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect();
    for a in actions {
        let step = env.step(a).unwrap();
        out.extend(step.obs.into_iter().map(f64::from));
        out.push(step.reward);
    }
    out
}

#[test]
fn matches_dm_control_and_is_reproducible() {
    let actions = common::actions(4, 10, 1);
    // cartpole's action bounds are [-1, 1], so the rescaled action is the action itself.
    let expected: Vec<f64> = common::with_module(REFERENCE, "dmc_reference", |m| {
        m.getattr("rollout")?
            .call1(("cartpole", "swingup", 3, actions.clone()))?
            .extract()
    });
    let mut env = envs::make("cartpole-swingup", 3).unwrap();
    let ours = rollout(env.as_mut(), None, &actions);
    assert_eq!(ours.len(), expected.len());
    let worst = ours
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(worst < 1e-6, "deviation {worst}");

    // reset(Some(seed)) reseeds the task: same as a fresh env made with that seed.
    let mut other = envs::make("cartpole-swingup", 7).unwrap();
    assert_eq!(rollout(other.as_mut(), Some(3), &actions), ours);
    assert_eq!(
        rollout(other.as_mut(), Some(3), &actions),
        rollout(env.as_mut(), Some(3), &actions)
    );
    assert_ne!(
        rollout(other.as_mut(), Some(4), &actions)[..5],
        rollout(env.as_mut(), Some(3), &actions)[..5]
    );
}

/// A task whose action box is not [-1, 1] (quadruped's) takes the official rescaled action
/// bit for bit: dm_control's `action_scale` wrapper, in float64, as the official wrapper applies
/// it, never rounded to float32 on the way.
#[test]
fn rescaled_actions_are_the_official_ones_bit_for_bit() {
    const OFFICIAL: &str = r#"
import numpy as np
from dm_control import suite
from dm_control.suite.wrappers import action_scale

def rollout(domain, task, seed, actions):
    env = suite.load(domain, task, task_kwargs={"random": seed}, visualize_reward=False)
    env = action_scale.Wrapper(env, minimum=-1., maximum=1.)
    dtype = env.action_spec().dtype
    flat = lambda ts: [float(x) for v in ts.observation.values() for x in np.asarray(v, np.float32).ravel()]
    out = flat(env.reset())
    for a in actions:
        a = np.asarray(a, np.float32).astype(dtype)
        reward = 0.0
        for _ in range(2):
            ts = env.step(a)
            reward += ts.reward
        out += flat(ts) + [reward]
    return out
"#;
    let mut env = envs::make("quadruped-walk", 9).unwrap();
    let actions = common::actions(8, 200, env.spec().action_dim);
    let expected: Vec<f64> = common::with_module(OFFICIAL, "dmc_official_scale", |m| {
        m.getattr("rollout")?
            .call1(("quadruped", "walk", 9, actions.clone()))?
            .extract()
    });
    let ours = rollout(env.as_mut(), None, &actions);
    let differ = ours.iter().zip(&expected).filter(|(a, b)| a != b).count();
    assert_eq!(ours.len(), expected.len());
    assert_eq!(differ, 0, "{differ} of {} numbers differ", ours.len());
}

/// dm_control's other suite tasks are made as its own: same observation and action sizes,
/// and the same rollout with the action rescaled from [-1, 1] to the task's bounds.
#[test]
fn other_suite_tasks_match_dm_control() {
    const RESCALED: &str = r#"
import numpy as np
from dm_control import suite

def rollout(domain, task, seed, actions):
    env = suite.load(domain, task, task_kwargs={"random": seed}, visualize_reward=False)
    spec = env.action_spec()
    low = np.broadcast_to(spec.minimum, spec.shape).astype(np.float64)
    high = np.broadcast_to(spec.maximum, spec.shape).astype(np.float64)
    flat = lambda ts: [float(x) for v in ts.observation.values() for x in np.asarray(v, np.float32).ravel()]
    out = flat(env.reset())
    for a in actions:
        a = np.clip(np.asarray(a, np.float32), -1, 1).astype(np.float64)
        scaled = low + (a + 1) * (0.5 * (high - low))
        reward = 0.0
        for _ in range(2):
            ts = env.step(scaled)
            reward += ts.reward
        out += flat(ts) + [reward]
    return out
"#;
    for task in envs::dmc::OTHER_SUITE_TASKS {
        let (domain, name) = envs::dmc::domain_and_task(task).unwrap();
        let mut env = envs::make(task, 5).unwrap();
        let action_dim = env.spec().action_dim;
        assert_eq!(env.spec().episode_length, 500, "{task}");
        let actions = common::actions(6, 5, action_dim);
        let expected: Vec<f64> = common::with_module(RESCALED, "dmc_rescaled", |m| {
            m.getattr("rollout")?
                .call1((domain.as_str(), name.as_str(), 5, actions.clone()))?
                .extract()
        });
        let ours = rollout(env.as_mut(), None, &actions);
        assert_eq!(ours.len(), expected.len(), "{task}: observation size");
        let worst = ours
            .iter()
            .zip(&expected)
            .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
            .fold(0.0, f64::max);
        assert!(worst < 1e-6, "{task}: deviation {worst}");
    }
}

#[test]
fn seeding_walker() {
    let actions = common::actions(5, 30, 6);
    let mut a = envs::make("walker-run", 11).unwrap();
    let mut b = envs::make("walker-run", 11).unwrap();
    let mut c = envs::make("walker-run", 12).unwrap();
    let first = rollout(a.as_mut(), None, &actions);
    assert_eq!(first, rollout(b.as_mut(), None, &actions));
    let other = rollout(c.as_mut(), None, &actions);
    assert_ne!(
        first[..24],
        other[..24],
        "different seeds give different first observations"
    );
    // Continuing the stream gives a new initial state, reseeding restores it.
    let next = rollout(a.as_mut(), None, &actions);
    assert_ne!(first[..24], next[..24]);
    assert_eq!(rollout(c.as_mut(), Some(11), &actions), first);
}

#[test]
fn errors_are_typed() {
    let mut env = envs::make("cup-catch", 0).unwrap();
    assert_eq!(env.spec().action_dim, 2);
    assert!(matches!(env.step(&[0.0, 0.0]), Err(Error::NeedsReset)));
    env.reset(None).unwrap();
    assert!(matches!(
        env.step(&[0.0; 3]),
        Err(Error::ActionLength {
            expected: 2,
            got: 3
        })
    ));
    assert!(matches!(
        env.step(&[0.0, f32::NAN]),
        Err(Error::NonFiniteAction { index: 1, .. })
    ));
    assert!(matches!(
        env.reset(Some(1 << 32)),
        Err(Error::InvalidSeed { .. })
    ));
    assert!(matches!(
        envs::make("cup-catch", 1 << 40),
        Err(Error::InvalidSeed { .. })
    ));

    match envs::make("walker-runn", 0) {
        Err(e @ Error::UnknownTask { .. }) => {
            let Error::UnknownTask { suggestions, .. } = &e else {
                unreachable!()
            };
            assert_eq!(suggestions[0], "walker-run");
            assert!(e.to_string().contains("walker-run"), "{e}");
        }
        other => panic!("expected UnknownTask, got {:?}", other.err()),
    }
}

/// Rollouts of the official TD-MPC2 definitions of the custom tasks, recorded by
/// scripts/record_custom_dmc.py as `envs::make(task, seed)` steps them.
const CUSTOM_FIXTURE: &str = include_str!("../../tests/data/custom_dmc.json");

#[derive(serde::Deserialize)]
struct CustomFixture {
    seed: u64,
    steps: usize,
    tasks: std::collections::BTreeMap<String, CustomRollout>,
}

#[derive(serde::Deserialize)]
struct CustomRollout {
    obs_dim: usize,
    action_dim: usize,
    reset_obs: Vec<f32>,
    /// The actions below, as the recording script computed them.
    actions: Vec<Vec<f32>>,
    rewards: Vec<f64>,
    obs: Vec<Vec<f32>>,
}

/// The fixture's action for agent step `k`: a_k[j] = sin(0.37 k + 1.3 j), the argument in
/// f32, the sine taken in f64 and rounded to f32 (as the script does; a f32 sine depends on
/// the libm, which need not round it correctly).
fn custom_action(k: usize, dim: usize) -> Vec<f32> {
    (0..dim)
        .map(|j| {
            let x = 0.37f32 * k as f32 + 1.3f32 * j as f32;
            f64::from(x).sin() as f32
        })
        .collect()
}

#[test]
fn custom_tasks_match_the_official_definitions() {
    let fixture: CustomFixture = serde_json::from_str(CUSTOM_FIXTURE).unwrap();
    let tasks: Vec<&str> = envs::dmc::tasks().collect();
    assert_eq!(
        tasks[tasks.len() - envs::dmc::CUSTOM_TASKS.len()..],
        envs::dmc::CUSTOM_TASKS,
        "last among the tasks"
    );
    assert_eq!(
        fixture.tasks.keys().map(String::as_str).collect::<Vec<_>>(),
        {
            let mut names = envs::dmc::CUSTOM_TASKS.to_vec();
            names.sort_unstable();
            names
        },
        "the fixture covers the custom tasks"
    );

    for (task, expected) in &fixture.tasks {
        let mut env = envs::make(task, fixture.seed).unwrap();
        assert_eq!(
            env.spec(),
            &EnvSpec {
                obs_shape: vec![expected.obs_dim],
                action_dim: expected.action_dim,
                episode_length: 500
            },
            "{task}: spec"
        );
        assert_eq!(
            expected.rewards.len(),
            fixture.steps,
            "{task}: fixture rewards"
        );
        assert_eq!(
            expected.obs.len(),
            fixture.steps,
            "{task}: fixture observations"
        );

        let obs = env.reset(None).unwrap();
        assert_eq!(
            obs.len(),
            expected.obs_dim,
            "{task}: reset observation size"
        );
        let worst = common::max_abs_diff(&obs, &expected.reset_obs);
        assert!(
            worst < 1e-5,
            "{task}: reset observation deviates by {worst}"
        );

        for k in 0..fixture.steps {
            let action = custom_action(k, expected.action_dim);
            assert_eq!(action, expected.actions[k], "{task}: action of step {k}");
            let step = env.step(&action).unwrap();
            assert!(
                !step.terminated && !step.truncated,
                "{task}: episode ended at step {k}"
            );
            let error = (step.reward - expected.rewards[k]).abs();
            assert!(
                error < 1e-6,
                "{task}: reward of step {k} is {}, official {} (off by {error})",
                step.reward,
                expected.rewards[k]
            );
            assert_eq!(
                step.obs.len(),
                expected.obs_dim,
                "{task}: observation size at step {k}"
            );
            let worst = common::max_abs_diff(&step.obs, &expected.obs[k]);
            assert!(
                worst < 1e-5,
                "{task}: observation of step {k} deviates by {worst}"
            );
        }
    }
}
