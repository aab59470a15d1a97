//! Evaluation videos (`save_video=true`) from a state run: rank 0 films each evaluation's
//! first episode into `eval_video/`, one frame at the reset and one a step, and `eval` films
//! its first episode too. (Pixel runs with environment workers: tests/pixels.rs.)
mod common;

use std::process::Command;

/// A gymnasium MuJoCo task whose untrained episodes end after a few dozen steps: short
/// videos, and episodes of different lengths.
const SETTINGS: &[&str] = &[
    "task=InvertedPendulum-v5",
    "episodic=true",
    "model_size=1",
    "batch_size=16",
    "num_samples=32",
    "num_elites=4",
    "num_pi_trajs=2",
    "iterations=1",
    "seed_steps=1000",
    "steps=1200",
    "eval_freq=600",
    "eval_episodes=1",
    "num_threads=2",
    "save_video=true",
    "enable_tensorboard=true",
];

#[test]
fn a_state_run_films_each_evaluation_and_eval_films_its_first_episode() {
    let dir = tempfile::tempdir().unwrap();
    common::succeeds(
        Command::new(common::tdmpc2_bin())
            .arg("train")
            .args(SETTINGS)
            .arg(format!("run_dir={}", dir.path().display())),
    );
    let evaluations: Vec<(u64, f64)> = common::metrics(dir.path())
        .iter()
        .filter(|r| r["phase"] == "eval")
        .map(|r| {
            (
                r["step"].as_u64().unwrap(),
                r["episode_length"].as_f64().unwrap(),
            )
        })
        .collect();
    // Evaluations wait for an episode boundary: 0, then the first one after step 600.
    assert!(
        evaluations.len() >= 2 && evaluations[0].0 == 0,
        "{evaluations:?}"
    );
    let mut files: Vec<String> = std::fs::read_dir(dir.path().join("eval_video"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let expected: Vec<String> = evaluations
        .iter()
        .map(|(step, _)| format!("step_{step:010}.gif"))
        .collect();
    assert_eq!(files, expected);
    for (step, length) in &evaluations {
        let path = tdmpc2::logging::video_path(dir.path(), *step);
        let (frames, width, height) = common::gif_frames(&path);
        assert_eq!((width, height), (480, 480), "gymnasium's own render size");
        assert_eq!(
            frames as f64,
            length + 1.0,
            "the reset frame and one a step"
        );
    }
    let events = std::fs::read_dir(dir.path().join("tb"))
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .next()
        .unwrap();
    let tag = tdmpc2::logging::VIDEO_TAG.as_bytes();
    let tagged = events.windows(tag.len()).filter(|w| *w == tag).count();
    assert_eq!(tagged, evaluations.len(), "one TensorBoard image a video");

    let eval = common::succeeds(
        Command::new(common::tdmpc2_bin())
            .current_dir(dir.path())
            .arg("eval")
            .args(SETTINGS)
            .arg(format!("checkpoint={}", dir.path().display())),
    );
    let stdout = String::from_utf8_lossy(&eval.stdout);
    let path = dir.path().join("eval_video/InvertedPendulum-v5-1.gif");
    assert!(
        stdout.contains("eval_video/InvertedPendulum-v5-1.gif"),
        "{stdout}"
    );
    assert!(common::gif_frames(&path).0 >= 2);

    // A second evaluation keeps the first one's video and films under a name of its own.
    let first = std::fs::read(&path).unwrap();
    let eval = |cwd: &std::path::Path| {
        Command::new(common::tdmpc2_bin())
            .current_dir(cwd)
            .arg("eval")
            .args(SETTINGS)
            .arg(format!("checkpoint={}", dir.path().display()))
            .output()
            .unwrap()
    };
    let again = eval(dir.path());
    assert!(again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("eval_video/InvertedPendulum-v5-1-2.gif")
    );
    assert_eq!(std::fs::read(&path).unwrap(), first);
    // Where its folder cannot be made, it is refused before any episode is played.
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(elsewhere.path().join("eval_video"), "a file").unwrap();
    let refused = eval(elsewhere.path());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("save_video=true: eval writes its video into ./eval_video/"));
    assert!(!String::from_utf8_lossy(&refused.stdout).contains("return"));
}

#[test]
fn a_native_task_cannot_be_filmed() {
    let out = Command::new(common::tdmpc2_bin())
        .args([
            "train",
            "--cfg",
            "job",
            "task=Pendulum-v1",
            "save_video=true",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("save_video=true") && stderr.contains("gym:Pendulum-v1"),
        "{stderr}"
    );
}

/// A task gymnasium draws with pygame renders off screen: SDL looks for no display, so no
/// error line about one reaches the user.
#[test]
fn a_pygame_task_films_without_a_word_about_a_display() {
    let out = Command::new(common::tdmpc2_bin())
        .args([
            "bench",
            "--cases",
            "video",
            "--video-task",
            "gym:Pendulum-v1",
            "--video-frames",
            "3",
        ])
        .env_remove("SDL_VIDEODRIVER")
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"what\":\"encode gif\""),
        "{stderr}"
    );
    assert!(!stderr.to_lowercase().contains("error"), "{stderr}");
}

/// An empty `MUJOCO_GL` is none chosen (the default backend), as everywhere else: MuJoCo's
/// own packages refused it at the first frame, with a traceback.
#[test]
fn an_empty_mujoco_gl_renders_with_the_default_backend() {
    let out = Command::new(common::tdmpc2_bin())
        .args([
            "bench",
            "--cases",
            "video",
            "--video-task",
            "cartpole-swingup",
            "--video-frames",
            "2",
        ])
        .env("MUJOCO_GL", "")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("Traceback"), "{stderr}");
}
