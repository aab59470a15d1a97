//! gymnasium envs through pyo3: spaces, flattening, seeding and errors.
mod common;

use std::sync::Once;

use envs::{Env, Error};
use pyo3::prelude::*;

/// Small envs registered in gymnasium's registry for these tests only.
const TEST_ENVS: &str = r#"
import gymnasium
import numpy as np
from gymnasium import spaces


class DictObs(gymnasium.Env):
    """Observation {"b": last raw action, "a": step count}; flattens as [a, b0, b1]."""

    def __init__(self):
        self.observation_space = spaces.Dict(
            {"b": spaces.Box(-3.0, 3.0, (2,), np.float64), "a": spaces.Box(0.0, 10.0, (1,), np.float32)}
        )
        self.action_space = spaces.Box(np.array([0.0, -3.0], np.float32), np.array([1.0, 3.0], np.float32))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {"b": np.array([0.5, -0.5]), "a": np.zeros(1, np.float32)}, {}

    def step(self, action):
        self.t += 1
        obs = {"b": np.asarray(action, np.float64), "a": np.array([self.t], np.float32)}
        return obs, float(np.sum(action)), self.t >= 3, False, {"is_success": self.t >= 2}


class RaisesInInit(DictObs):
    def __init__(self):
        raise ValueError("this env cannot be built: its constructor says why")


class DiscreteActions(DictObs):
    def __init__(self):
        super().__init__()
        self.action_space = spaces.Discrete(3)


def register():
    gymnasium.register("TdmpcDictObs-v0", entry_point=DictObs, max_episode_steps=5)
    gymnasium.register("TdmpcDiscrete-v0", entry_point=DiscreteActions, max_episode_steps=5)
    gymnasium.register("TdmpcNoLimit-v0", entry_point=DictObs)
    gymnasium.register("TdmpcRaises-v0", entry_point=RaisesInInit, max_episode_steps=5)


def first_obs(env_id, seed):
    obs, _ = gymnasium.make(env_id).reset(seed=seed)
    return [float(x) for x in np.asarray(obs, np.float32)]
"#;

fn register_test_envs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        common::with_module(TEST_ENVS, "gym_test_envs", |m| {
            m.getattr("register")?.call0().map(drop)
        })
    });
}

#[test]
fn dict_observations_flatten_in_gymnasium_order() {
    register_test_envs();
    let mut env = envs::make("TdmpcDictObs-v0", 0).unwrap();
    assert_eq!(
        env.spec(),
        &envs::EnvSpec {
            obs_shape: vec![3],
            action_dim: 2,
            episode_length: 5
        }
    );
    assert_eq!(env.reset(None).unwrap(), [0.0, 0.5, -0.5]);
    let s = env.step(&[-1.0, 1.0]).unwrap();
    assert_eq!(
        (s.obs, s.reward, s.success, s.terminated),
        (vec![1.0, 0.0, 3.0], 3.0, Some(0.0), false)
    );
    let s = env.step(&[1.0, -1.0]).unwrap();
    assert_eq!(
        (s.obs, s.reward, s.success),
        (vec![2.0, 1.0, -3.0], -2.0, Some(1.0))
    );
    let s = env.step(&[0.0, 0.0]).unwrap();
    assert_eq!(
        (s.obs, s.terminated, s.truncated),
        (vec![3.0, 0.5, 0.0], true, false)
    );
    assert!(matches!(env.step(&[0.0, 0.0]), Err(Error::NeedsReset)));
    assert!(matches!(env.step(&[0.0]), Err(Error::NeedsReset)));
    env.reset(None).unwrap();
    assert!(matches!(
        env.step(&[0.0]),
        Err(Error::ActionLength {
            expected: 2,
            got: 1
        })
    ));
}

#[test]
fn unusable_envs_are_reported() {
    register_test_envs();
    for id in ["TdmpcDiscrete-v0", "TdmpcNoLimit-v0"] {
        match envs::make(id, 0) {
            Err(Error::Unsupported { task, reason }) => assert_eq!(task, id, "{reason}"),
            other => panic!("{id}: expected Unsupported, got {:?}", other.err()),
        }
    }
}

#[test]
fn mujoco_env_is_seeded_like_gymnasium() {
    // Needs the gymnasium[mujoco] extra, which requirements.txt installs.
    let mut env = envs::make("HalfCheetah-v5", 3).unwrap();
    assert_eq!(
        env.spec(),
        &envs::EnvSpec {
            obs_shape: vec![17],
            action_dim: 6,
            episode_length: 1000
        }
    );
    let first = env.reset(None).unwrap();
    let expected: Vec<f32> = common::with_module(TEST_ENVS, "gym_test_envs_ref", |m| {
        m.getattr("first_obs")?
            .call1(("HalfCheetah-v5", 3))?
            .extract()
    });
    assert_eq!(first, expected);

    let actions = common::actions(1, 20, 6);
    let rollout = |env: &mut dyn Env, seed| {
        let mut out = env.reset(Some(seed)).unwrap();
        for a in &actions {
            let s = env.step(a).unwrap();
            out.extend(s.obs);
            out.push(s.reward as f32);
        }
        out
    };
    let mut twin = envs::make("HalfCheetah-v5", 99).unwrap();
    assert_eq!(rollout(env.as_mut(), 8), rollout(twin.as_mut(), 8));
    assert_ne!(rollout(env.as_mut(), 8), rollout(twin.as_mut(), 9));
    assert!(matches!(
        env.step(&[0.0; 5]),
        Err(Error::ActionLength {
            expected: 6,
            got: 5
        })
    ));
}

#[test]
fn unknown_gym_ids_suggest_registered_ones() {
    let first_suggestion = |task: &str| match envs::make(task, 0) {
        Err(e @ Error::UnknownTask { .. }) => {
            let Error::UnknownTask { suggestions, .. } = &e else {
                unreachable!()
            };
            assert!(e.to_string().contains(&suggestions[0]), "{e}");
            suggestions[0].clone()
        }
        other => panic!("{task}: expected UnknownTask, got {:?}", other.err()),
    };
    assert_eq!(first_suggestion("HalfCheetah-v9"), "HalfCheetah-v5");
    assert_eq!(first_suggestion("halfcheetah-v5"), "HalfCheetah-v5");
    assert_eq!(first_suggestion("gym:Pendulum-v9"), "gym:Pendulum-v1");
}

#[test]
fn python_exceptions_carry_their_message() {
    register_test_envs();
    match envs::make("TdmpcRaises-v0", 0) {
        Err(Error::Python(msg)) => assert!(
            msg.contains("ValueError: this env cannot be built: its constructor says why"),
            "{msg}"
        ),
        Ok(_) => panic!("TdmpcRaises-v0 was made"),
        Err(other) => panic!("expected a Python error, got {other}"),
    }
    // gymnasium registers its Jax environments whether or not Jax is installed (the project's
    // venv has none): ids that cannot be made here are unknown tasks, never a traceback.
    match envs::make("phys2d/CartPole-v1", 0) {
        Err(Error::UnknownTask { .. }) => {}
        Ok(_) => panic!("phys2d/CartPole-v1 was made: jax is in the venv"),
        Err(other) => panic!("expected an unknown task, got {other}"),
    }
}
