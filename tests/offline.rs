//! Offline multitask training through the real binary: `tdmpc2 collect` writes a dataset of
//! three tasks in the official format (checked by loading it as the official trainer does),
//! and two ranks train on it, each sampling from every file, evaluate each task, checkpoint and resume bit
//! for bit.
mod common;

use std::path::Path;
use std::process::Command;

use common::{free_port, metrics, succeeds, TINY};

const TASKS: &str = "[Pendulum-v1,reacher-easy,cartpole-swingup]";

fn collect(out: &Path) -> String {
    let output = succeeds(
        Command::new(common::tdmpc2_bin())
            .args([
                "collect",
                "--episodes",
                "6",
                "--episodes-per-file",
                "2",
                "--out",
            ])
            .arg(out)
            .arg(format!("task={TASKS}"))
            .arg("model_size=1"),
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn train(data: &Path, run_dir: &Path, extra: &[String]) -> String {
    let out = succeeds(
        Command::new(common::tdmpc2_bin())
            .arg("train")
            .args(TINY)
            .args([
                format!("task={TASKS}"),
                format!("data_dir={}", data.display()),
                "world_size=2".into(),
                "eval_episodes=1".into(),
                "num_threads=1".into(),
                "eval_freq=20".into(),
                "save_freq=20".into(),
                format!("master_port={}", free_port()),
                format!("run_dir={}", run_dir.display()),
            ])
            .args(extra),
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The files load as the official trainer loads them: TensorDicts of [episodes, T] with the
/// official keys and types, NaN fillers in row 0, one task id per episode.
fn check_official_format(data: &Path) {
    let script = format!(
        r#"
import glob, torch
from tensordict import TensorDict
seen = set()
for path in sorted(glob.glob("{}/*.pt")):
    td = torch.load(path, weights_only=False)
    assert isinstance(td, TensorDict), type(td)
    e, t = td.shape
    assert t in (201, 501), t
    assert td["obs"].shape == (e, t, 6) and td["obs"].dtype == torch.float32
    assert td["action"].shape == (e, t, 2) and td["action"].dtype == torch.float32
    assert td["reward"].shape == (e, t) and td["task"].dtype == torch.int64
    assert torch.isnan(td["action"][:, 0]).all() and torch.isnan(td["reward"][:, 0]).all()
    assert not torch.isnan(td["action"][:, 1:]).any() and not torch.isnan(td["obs"]).any()
    assert (td["task"] == td["task"][:, :1]).all()
    seen.update(td["task"][:, 0].tolist())
assert seen == {{0, 1, 2}}, seen
"#,
        data.display()
    );
    embedded_python::with_python(|py| {
        let code = std::ffi::CString::new(script).unwrap();
        py.run(&code, None, None)
    })
    .expect("the dataset loads as the official trainer loads it");
}

#[test]
fn two_ranks_train_offline_on_a_collected_dataset_and_resume_exactly() {
    let data = tempfile::tempdir().unwrap();
    let said = collect(data.path());
    // 2 episodes of Pendulum (200 steps), 4 of 500 steps: three files of two.
    assert!(said.contains("wrote 6 episodes in 3 files"), "{said}");
    check_official_format(data.path());

    let whole = tempfile::tempdir().unwrap();
    let console = train(data.path(), whole.path(), &["steps=40".into()]);
    assert!(
        console.contains("each of the 2 ranks samples from all 6 episodes")
            && console.contains("Training finished"),
        "every rank samples from every file: {console}"
    );
    let records = metrics(whole.path());
    let evals: Vec<_> = records.iter().filter(|r| r["phase"] == "eval").collect();
    assert_eq!(
        evals
            .iter()
            .map(|r| r["step"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [0, 20],
        "evaluations every eval_freq updates"
    );
    for task in ["Pendulum-v1", "reacher-easy", "cartpole-swingup"] {
        let key = format!("episode_reward+{task}");
        assert!(evals[1][&key].is_number(), "{key} missing: {}", evals[1]);
    }
    assert!(records
        .iter()
        .any(|r| r["phase"] == "train" && r["step"] == 20 && r["total_loss"].is_number()));

    // Stopped at 20 updates, then resumed: the same model and optimiser state at 40.
    let split = tempfile::tempdir().unwrap();
    train(data.path(), split.path(), &["steps=20".into()]);
    let resumed = train(
        data.path(),
        split.path(),
        &["steps=40".into(), "resume=auto".into()],
    );
    assert!(resumed.contains("(step 20)"), "{resumed}");
    let last = |run: &Path| {
        let dir = run.join("checkpoints/step_000000000040");
        assert!(
            dir.is_dir(),
            "no checkpoint at update 40 in {}",
            run.display()
        );
        dir
    };
    for name in ["model.safetensors", "state.safetensors"] {
        let a = std::fs::read(last(whole.path()).join(name)).unwrap();
        let b = std::fs::read(last(split.path()).join(name)).unwrap();
        assert!(a == b, "{name} of the resumed run differs");
    }
}

/// A dataset that does not fit the run is refused before training, naming the file and what
/// differs; more ranks than files too.
#[test]
fn a_dataset_of_other_tasks_is_refused_with_what_differs() {
    let data = tempfile::tempdir().unwrap();
    collect(data.path());
    let run = tempfile::tempdir().unwrap();
    let out = Command::new(common::tdmpc2_bin())
        .arg("train")
        .args(TINY)
        .args([
            "task=[walker-run,cheetah-run]".to_string(),
            format!("data_dir={}", data.path().display()),
            format!("run_dir={}", run.path().display()),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("chunk_0.pt") && stderr.contains("observations of 6 numbers"),
        "{stderr}"
    );
    let out = Command::new(common::tdmpc2_bin())
        .arg("train")
        .args(TINY)
        .args([
            format!("task={TASKS}"),
            format!("data_dir={}", data.path().display()),
            "world_size=4".into(),
            format!("master_port={}", free_port()),
            format!("run_dir={}", run.path().display()),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("3 dataset files and world_size=4"),
        "{stderr}"
    );
}
