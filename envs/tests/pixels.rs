//! Pixel observations (`obs=rgb`): rendered frames stacked as the official wrapper does, the
//! same through worker processes as in-process. Every test here renders, so this binary loads
//! dm_control with a renderer (MUJOCO_GL=egl unless set).
mod common;

use envs::{Env, ObsKind, Placement, VectorEnv, WorkerCommand, FRAME_SIZE, FRAME_STACK};

const TASK: &str = "cartpole-swingup";
const FRAME: usize = 3 * FRAME_SIZE * FRAME_SIZE;

fn frames(obs: &[f32]) -> Vec<&[f32]> {
    assert_eq!(obs.len(), FRAME_STACK * FRAME);
    obs.chunks(FRAME).collect()
}

#[test]
fn dmc_pixels_stack_three_frames_repeating_the_first_at_reset() {
    let mut env = envs::make_observed(TASK, 1, ObsKind::Rgb).unwrap();
    assert_eq!(env.spec().obs_shape, vec![9, 64, 64]);
    assert_eq!(env.spec().episode_length, 500);
    let first = env.reset(Some(1)).unwrap();
    let stack = frames(&first);
    assert!(
        stack[0] == stack[1] && stack[1] == stack[2],
        "reset repeats its frame"
    );
    assert!(first
        .iter()
        .all(|&v| (0.0..=255.0).contains(&v) && v.fract() == 0.0));
    assert!(first.iter().any(|&v| v != first[0]), "a frame, not a blank");
    let mut previous = first;
    let mut moved = false;
    for action in common::actions(3, 6, 1) {
        let obs = env.step(&action).unwrap().obs;
        let (old, new) = (frames(&previous), frames(&obs));
        assert_eq!(new[0], old[1], "the stack shifts by one frame a step");
        assert_eq!(new[1], old[2]);
        moved |= new[2] != old[2];
        previous = obs;
    }
    assert!(moved, "the newest frame follows the cart");
}

#[test]
fn worker_processes_render_the_same_frames_as_in_process() {
    let worker = WorkerCommand::new(env!("CARGO_BIN_EXE_envs-worker"), &[]);
    let seeds = [4, 5];
    let mut local =
        VectorEnv::observed(TASK, ObsKind::Rgb, &seeds, Placement::InProcess, &worker).unwrap();
    let mut remote =
        VectorEnv::observed(TASK, ObsKind::Rgb, &seeds, Placement::Workers(2), &worker).unwrap();
    assert_eq!(remote.spec().obs_shape, vec![9, 64, 64]);
    for i in 0..2 {
        assert_eq!(
            local.reset(i, Some(9)).unwrap(),
            remote.reset(i, Some(9)).unwrap()
        );
    }
    for action in common::actions(5, 3, 1) {
        let actions = [action.clone(), action].concat();
        let ours = local.step(&[0, 1], &actions).unwrap();
        let theirs = remote.step(&[0, 1], &actions).unwrap();
        for (a, b) in ours.iter().zip(&theirs) {
            assert_eq!(
                a.obs, b.obs,
                "frames through shared memory are the frames rendered"
            );
        }
    }
}

#[test]
fn native_tasks_refuse_pixels_naming_the_setting() {
    let err = envs::make_observed("Pendulum-v1", 0, ObsKind::Rgb)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("obs=rgb") && err.contains("gym:Pendulum-v1"),
        "{err}"
    );
}

#[test]
fn gymnasium_frames_are_resampled_to_64_pixels() {
    let mut env = envs::make_observed("InvertedPendulum-v5", 0, ObsKind::Rgb).unwrap();
    assert_eq!(env.spec().obs_shape, vec![9, 64, 64]);
    let obs = env.reset(Some(0)).unwrap();
    let native = env.render(64).unwrap();
    assert!(
        native.height > 64,
        "gymnasium renders its own size: {}",
        native.height
    );
    let stack = frames(&obs);
    assert!(stack[0] == stack[2], "reset repeats its frame");
    assert!(obs.iter().any(|&v| v != obs[0]), "a frame, not a blank");
    let step = env.step(&[0.5]).unwrap();
    assert_eq!(frames(&step.obs)[1], stack[2]);
}
