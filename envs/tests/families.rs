//! The task families with venvs of their own (Meta-World, MyoSuite) and the official gymnasium
//! names: rollouts recorded with the official wrapper logic on the same packages
//! (scripts/record_families.py) replayed through `envs::make`, every official name made, and
//! a multitask slot that spans families. Meta-World and MyoSuite step in this crate's
//! `envs-worker` processes with their venvs (`scripts/setup.sh --family all` makes them).
mod common;

use std::collections::BTreeMap;

use envs::{Env, EnvOptions, Family, Padding, RemoteEnv, TaskMix, WorkerCommand};

#[derive(serde::Deserialize)]
struct Fixture {
    rollouts: BTreeMap<String, Rollout>,
}

#[derive(serde::Deserialize)]
struct Rollout {
    seed: u64,
    episodes: Vec<Episode>,
}

#[derive(serde::Deserialize)]
struct Episode {
    reset_seed: u64,
    reset_obs: Vec<f32>,
    actions: Vec<Vec<f32>>,
    obs: Vec<Vec<f32>>,
    rewards: Vec<f64>,
    success: Vec<Option<f64>>,
}

/// Environments of another family's venv step in this crate's worker binary.
fn register_worker() {
    envs::set_default_worker(WorkerCommand::new(env!("CARGO_BIN_EXE_envs-worker"), &[]));
}

/// A reward the simulator's Python computes, against the recorded one: numpy and the C math
/// library pick their kernels by the CPU's features, so on another machine a reward may come
/// back a unit or two in the last place off (seen: up to 3.8e-16 relative on a machine without
/// AVX-512, the same packages otherwise); observations, from MuJoCo, stay exact.
fn assert_same_reward(ours: f64, recorded: f64, what: &str) {
    assert!(
        (ours - recorded).abs() <= 1e-12 * ours.abs().max(recorded.abs()),
        "{what}: reward {ours}, recorded {recorded}"
    );
}

/// Replays every rollout of a family's fixture: the first episode from the make seed, the
/// next from a seeded reset; observations bit for bit, rewards within rounding (see
/// [`assert_same_reward`]), success as recorded.
fn replay(fixture: &str) {
    register_worker();
    let fixture: Fixture = serde_json::from_str(fixture).unwrap();
    for (task, rollout) in &fixture.rollouts {
        let mut env = envs::make(task, rollout.seed).unwrap();
        for (e, episode) in rollout.episodes.iter().enumerate() {
            let seed = (e > 0).then_some(episode.reset_seed);
            let obs = env.reset(seed).unwrap();
            assert_eq!(obs, episode.reset_obs, "{task} episode {e}: reset");
            for (k, action) in episode.actions.iter().enumerate() {
                let step = env.step(action).unwrap();
                assert_eq!(step.obs, episode.obs[k], "{task} episode {e} step {k}");
                assert_same_reward(
                    step.reward,
                    episode.rewards[k],
                    &format!("{task} episode {e} step {k}"),
                );
                assert_eq!(
                    step.success, episode.success[k],
                    "{task} episode {e} step {k}"
                );
                assert!(!step.terminated && !step.truncated);
            }
        }
    }
}

#[test]
fn metaworld_replays_the_official_wrapper() {
    replay(include_str!("../../tests/data/families/metaworld.json"));
}

#[test]
fn myosuite_replays_the_official_wrapper() {
    replay(include_str!("../../tests/data/families/myosuite.json"));
}

#[test]
fn the_official_gymnasium_names_replay_the_official_wrapper() {
    replay(include_str!("../../tests/data/families/gymnasium.json"));
}

/// Each family's tasks, made by one worker: their shapes and episode lengths.
fn specs(tasks: &[&str]) -> Vec<envs::EnvSpec> {
    register_worker();
    let tasks: Vec<String> = tasks.iter().map(|t| t.to_string()).collect();
    envs::specs_in_worker(&tasks, 1, EnvOptions::default()).unwrap()
}

#[test]
fn every_official_metaworld_task_is_made() {
    let specs = specs(&envs::metaworld::TASKS);
    assert_eq!(specs.len(), 50);
    for spec in specs {
        assert_eq!(
            (spec.obs_shape, spec.action_dim, spec.episode_length),
            (vec![39], 4, 100)
        );
    }
}

#[test]
fn every_official_myosuite_and_gymnasium_task_is_made_and_maniskill2_refused() {
    let myo: Vec<&str> = envs::myosuite::tasks().collect();
    let specs = specs(&myo);
    let obs: Vec<usize> = specs.iter().map(envs::EnvSpec::obs_dim).collect();
    // Fixed and Random variants share their shapes.
    assert_eq!(obs, [115, 115, 108, 108, 91, 91, 93, 93, 83, 83]);
    assert!(specs
        .iter()
        .all(|s| (s.action_dim, s.episode_length) == (39, 100)));
    let lengths: Vec<usize> = envs::gym::OFFICIAL
        .iter()
        .map(|task| envs::make(task.name, 1).unwrap().spec().episode_length)
        .collect();
    assert_eq!(lengths, [1000, 1000, 1600, 500]);
    for task in envs::family::MANISKILL2_TASKS {
        let err = envs::make(task, 1).err().unwrap().to_string();
        assert!(err.contains("SAPIEN 2.2"), "{task}: {err}");
    }
}

#[test]
fn a_family_task_steps_in_a_worker_with_its_venv_and_observes_state_only() {
    register_worker();
    let mut env = RemoteEnv::new(&TaskMix::single("mw-reach"), 5, EnvOptions::default()).unwrap();
    let pid = env.pid().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(environ.contains("TDMPC2_ENV_FAMILY=metaworld"), "{environ}");
    let site = Family::MetaWorld.site_packages().unwrap();
    assert!(environ.contains(&format!("TDMPC2_SITE_PACKAGES={}", site.display())));
    let mut here = envs::make("mw-reach", 5).unwrap();
    assert_eq!(env.reset(None).unwrap(), here.reset(None).unwrap());
    // Refused before a worker starts: the input's error, not a worker's failure.
    for task in ["mw-reach", "myo-reach"] {
        let err = envs::make_observed(task, 5, envs::ObsKind::Rgb)
            .err()
            .unwrap();
        assert!(
            matches!(err, envs::Error::Unsupported { .. }),
            "{task}: {err:?}"
        );
        assert!(err.to_string().contains("observe state only"), "{err}");
    }
}

#[test]
fn a_slot_that_spans_families_holds_one_worker_per_family_and_pads_every_task() {
    register_worker();
    let tasks = ["Pendulum-v1", "mw-reach", "myo-reach", "mw-push"];
    let mix = TaskMix {
        tasks: tasks.iter().map(|t| t.to_string()).collect(),
        padding: Some(Padding {
            obs_dim: 115,
            action_dim: 39,
        }),
    };
    let groups: Vec<(Option<Family>, Vec<usize>)> = mix.groups();
    assert_eq!(
        groups,
        [
            (None, vec![0]),
            (Some(Family::MetaWorld), vec![1, 3]),
            (Some(Family::MyoSuite), vec![2])
        ]
    );
    let mut slot = mix.make(7, EnvOptions::default()).unwrap();
    assert_eq!(slot.spec().obs_shape, vec![115]);
    assert_eq!(slot.spec().episode_length, 200, "Pendulum's 200 steps");
    for (task, name) in tasks.iter().enumerate() {
        slot.switch_task(task).unwrap();
        let obs = slot.reset(Some(11)).unwrap();
        let mut plain = envs::make(name, 7).unwrap();
        let own = plain.reset(Some(11)).unwrap();
        assert_eq!(obs[..own.len()], own[..], "{name}");
        assert!(obs[own.len()..].iter().all(|&v| v == 0.0), "{name}: padded");
        let action = common::actions(task as u64, 1, 39).remove(0);
        let own_dim = plain.spec().action_dim;
        let step = slot.step(&action).unwrap();
        let expected = plain.step(&action[..own_dim]).unwrap();
        assert_eq!(step.obs[..own.len()], expected.obs[..], "{name}");
        assert_eq!(step.reward, expected.reward, "{name}");
    }
}

#[test]
fn videos_film_the_official_cameras_at_the_official_size() {
    register_worker();
    let videos = EnvOptions {
        obs: envs::ObsKind::State,
        videos: true,
    };
    for task in ["mw-reach", "myo-reach"] {
        let mut env = envs::make_observed(task, 2, videos).unwrap();
        env.reset(None).unwrap();
        let frame = env.render(envs::VIDEO_SIZE).unwrap();
        assert_eq!((frame.height, frame.width), (384, 384), "{task}");
        let first = &frame.rgb[..3];
        assert!(
            frame.rgb.chunks(3).any(|pixel| pixel != first),
            "{task}: a picture, not a blank"
        );
    }
}
