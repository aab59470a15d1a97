//! Pixel observations end to end (`obs=rgb` on cartpole-swingup, rendered headless through
//! EGL): exact resume with the frame-once buffer in the checkpoint, two ranks with two
//! environments each (filming evaluations through the environment workers), and `eval` of a
//! pixel checkpoint.
mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{checkpoint, tensors};

/// Small planning and batches; 500-step episodes, so seeding takes one episode an env.
const PIXELS: &[&str] = &[
    "task=cartpole-swingup",
    "obs=rgb",
    "model_size=1",
    "batch_size=16",
    "num_samples=32",
    "num_elites=4",
    "num_pi_trajs=2",
    "iterations=1",
    "eval_episodes=1",
    "enable_tensorboard=false",
];

fn tdmpc2(command: &str, run_dir: &Path, extra: &[impl AsRef<std::ffi::OsStr>]) -> Output {
    let out = Command::new(common::tdmpc2_bin())
        .arg(command)
        .args(PIXELS)
        .args(extra)
        .arg(format!("run_dir={}", run_dir.display()))
        .output()
        .expect("the tdmpc2 binary runs");
    assert!(
        out.status.success(),
        "{command} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn a_resumed_pixel_run_makes_exactly_the_same_updates() {
    let settings = [
        "seed_steps=500",
        "save_freq=1000",
        "eval_freq=100000",
        "save_buffer=true",
        "buffer_size=1000",
        "num_threads=1",
    ];
    let with = |steps: &'static str, extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = settings.iter().map(|s| s.to_string()).collect();
        args.push(steps.into());
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let whole = tempfile::tempdir().unwrap();
    tdmpc2("train", whole.path(), &with("steps=1020", &[]));
    // The same run, resumed from its step-1000 checkpoint (after 500 pretraining updates and
    // 500 more, two episodes in a buffer that holds 1000 rows).
    let resumed = tempfile::tempdir().unwrap();
    let resume = format!("resume={}", checkpoint(whole.path(), 1000).display());
    let out = tdmpc2("train", resumed.path(), &with("steps=1020", &[&resume]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Resumed from"));

    let (a, b) = (
        checkpoint(whole.path(), 1020),
        checkpoint(resumed.path(), 1020),
    );
    for file in ["model.safetensors", "state.safetensors"] {
        let (a, b) = (tensors(&a.join(file)), tensors(&b.join(file)));
        assert_eq!(a.len(), b.len(), "{file}");
        for ((name, ta), (_, tb)) in a.iter().zip(&b) {
            assert!(ta.equal(tb), "{file}: {name} differs after the resume");
        }
    }
    // The checkpointed buffer keeps one frame a row, as bytes, and resumes exactly too.
    let buffer = |run_dir: &Path| {
        tensors(
            &run_dir
                .join("buffers/rank0")
                .join(format!("step_{:012}", 1020))
                .join("buffer.safetensors"),
        )
    };
    let (saved, resumed) = (buffer(whole.path()), buffer(resumed.path()));
    let obs = saved
        .iter()
        .find(|(name, _)| name == "obs")
        .map(|(_, t)| t)
        .expect("the buffer's observations are saved");
    assert_eq!(obs.kind(), tch::Kind::Uint8);
    assert_eq!(obs.size(), [1000, 3 * 64 * 64]);
    // Row 0 of an episode has NaN action, reward and flag (never sampled): NaN ≠ NaN.
    let same = |a: &tch::Tensor, b: &tch::Tensor| {
        if !a.is_floating_point() {
            return a.equal(b);
        }
        a.isnan().equal(&b.isnan())
            && a.nan_to_num(0.0, None, None)
                .equal(&b.nan_to_num(0.0, None, None))
    };
    for ((name, a), (_, b)) in saved.iter().zip(&resumed) {
        assert!(same(a, b), "buffer {name} differs after the resume");
    }
}

/// Pipelined, each step's acting runs on a thread of its own, where a renderer made current on
/// another thread cannot render (dm_control's EGL refused it at the first step): a single
/// pixel environment then steps in a worker process, through training and evaluation.
#[test]
fn a_pipelined_pixel_run_trains_and_evaluates() {
    let dir = tempfile::tempdir().unwrap();
    let out = tdmpc2(
        "train",
        dir.path(),
        &[
            "pipeline=true",
            "seed_steps=500",
            "steps=520",
            "eval_freq=520",
            "buffer_size=1000",
            "num_threads=1",
        ],
    );
    let evals = common::metrics(dir.path())
        .into_iter()
        .filter(|r| r["phase"] == "eval")
        .count();
    assert_eq!(evals, 2, "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn two_ranks_with_two_environments_each_train_on_pixels_and_eval_loads_it() {
    let dir = tempfile::tempdir().unwrap();
    let settings = [
        "world_size=2",
        "num_envs=2",
        "seed_steps=1000",
        // One update every two steps: 500 pretraining updates a rank, then 10 more.
        "steps_per_update=2",
        "steps=2040",
        "eval_freq=100000",
        "num_threads=1",
        "save_video=true",
    ];
    let port = format!("master_port={}", common::free_port());
    let settings: Vec<&str> = settings.into_iter().chain([port.as_str()]).collect();
    tdmpc2("train", dir.path(), &settings);
    // Rank 0's environment 0 lives in a worker process, which renders the video's frames.
    let video = tdmpc2::logging::video_path(dir.path(), 0);
    assert_eq!(
        common::gif_frames(&video),
        (501, 384, 384),
        "500 steps and the reset"
    );
    let meta = checkpoint(dir.path(), 2040).join("meta.json");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(meta).unwrap()).unwrap();
    assert_eq!(meta["world_size"], 2);
    assert!(meta["model_optim_step"].as_u64().unwrap() >= 510, "{meta}");
    let checksums = meta["rank_checksums"].as_array().unwrap();
    assert_eq!(
        checksums[0], checksums[1],
        "both ranks hold the same learner state"
    );
    let eval = Command::new(common::tdmpc2_bin())
        .arg("eval")
        .args(PIXELS)
        .arg(format!("checkpoint={}", dir.path().display()))
        .output()
        .unwrap();
    assert!(
        eval.status.success(),
        "{}",
        String::from_utf8_lossy(&eval.stderr)
    );
    let stdout = String::from_utf8_lossy(&eval.stdout);
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let mean = json["mean"].as_f64().unwrap();
    assert!((0.0..=500.0).contains(&mean), "a cartpole return: {stdout}");
}

/// `tdmpc2 train` with `settings` and the variables `env` (a `None` value removed from it): its
/// exit code and stderr.
fn train_with(env: &[(&str, Option<&str>)], settings: &[&str]) -> (Option<i32>, String) {
    let mut command = Command::new(common::tdmpc2_bin());
    command.arg("train").args(settings);
    for (key, value) in env {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    let out = command.output().expect("the tdmpc2 binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The one error line of `stderr`, which holds no traceback.
fn one_error_line(stderr: &str) -> &str {
    assert!(!stderr.contains("Traceback"), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    errors[0]
}

/// A renderer that cannot work here is one line naming it, what failed and the renderers this
/// machine has (exit 2), never a traceback: a backend whose display is missing, one MuJoCo does
/// not know (which fails state runs too: MuJoCo's packages load it with themselves), and one
/// that fails as it starts (an EGL device that does not exist), in the rank and in a worker.
#[test]
fn an_unusable_renderer_is_one_line_naming_what_this_machine_has() {
    let job = ["task=cartpole-swingup", "obs=rgb", "--cfg", "job"];
    let headless = [
        ("MUJOCO_GL", Some("glfw")),
        ("DISPLAY", None),
        ("WAYLAND_DISPLAY", None),
    ];
    let (code, stderr) = train_with(&headless, &job);
    let line = one_error_line(&stderr);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        line.contains("MUJOCO_GL=glfw cannot render: there is no display")
            && line.contains("this machine has"),
        "{line}"
    );

    let (code, stderr) = train_with(
        &[("MUJOCO_GL", Some("bogus"))],
        &["task=cartpole-swingup", "--cfg", "job"],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(one_error_line(&stderr).contains("not a backend MuJoCo knows (egl, osmesa, glfw)"));

    let no_device = [
        ("MUJOCO_GL", Some("egl")),
        ("MUJOCO_EGL_DEVICE_ID", Some("99")),
    ];
    let (code, stderr) = train_with(&no_device, &job);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        one_error_line(&stderr).contains("MUJOCO_GL=egl cannot render"),
        "{stderr}"
    );

    // The evaluation at step 0 films in the Meta-World worker, which fails to start EGL there.
    let dir = tempfile::tempdir().unwrap();
    let run_dir = format!("run_dir={}", dir.path().display());
    let mut settings = vec!["task=mw-reach", "save_video=true", "steps=1000", &run_dir];
    settings.extend(&PIXELS[2..]);
    let (code, stderr) = train_with(&no_device, &settings);
    let line = one_error_line(&stderr);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(
        line.contains("failed in its worker process")
            && line.contains("MUJOCO_GL=egl cannot render"),
        "{stderr}"
    );
}
