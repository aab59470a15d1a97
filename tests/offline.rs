//! Offline multitask training through the real binary: `tdmpc2 collect` writes a dataset of
//! three tasks in the official format (checked by loading it as the official trainer does),
//! and two ranks train on it, each sampling from every file, evaluate each task, checkpoint and resume bit
//! for bit.
mod common;

use std::path::{Path, PathBuf};
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

    // Ended at update 13, between checkpoint points (as a stop's checkpoint falls), then
    // resumed: the same model and optimiser state at 40.
    let split = tempfile::tempdir().unwrap();
    train(data.path(), split.path(), &["steps=13".into()]);
    let resumed = train(
        data.path(),
        split.path(),
        &["steps=40".into(), "resume=auto".into()],
    );
    assert!(resumed.contains("(step 13)"), "{resumed}");
    assert!(
        !resumed.contains("replay buffers"),
        "an offline run has none to miss: {resumed}"
    );
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

    // Resumed with another sync_freq, each rank reads on from the batches it has read, not
    // from the step times the new sync_freq (which re-read batches 40..80).
    let batches_read = |step: u64| {
        let meta = split
            .path()
            .join(format!("checkpoints/step_{step:012}/meta.json"));
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(meta).unwrap()).unwrap();
        meta["batches_read"].as_u64()
    };
    assert_eq!(batches_read(40), Some(40));
    train(
        data.path(),
        split.path(),
        &[
            "steps=45".into(),
            "resume=auto".into(),
            "sync_freq=2".into(),
        ],
    );
    assert_eq!(batches_read(45), Some(50));
}

/// Ctrl-C during a collection writes the episodes finished (a file of fewer than
/// --episodes-per-file), drops those under way, says so, and exits as a stop: every file in
/// --out is a whole dataset file.
#[test]
fn a_stopped_collection_keeps_every_finished_episode() {
    let data = tempfile::tempdir().unwrap();
    let out = data.path().join("data");
    let mut collect = Command::new(common::tdmpc2_bin());
    collect
        .args([
            "collect",
            "--episodes",
            "1000000",
            "--episodes-per-file",
            "4",
            "--out",
        ])
        .arg(&out)
        .arg("task=Pendulum-v1");
    let child = common::Reaped::spawn(
        collect
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped()),
    );
    let files = || std::fs::read_dir(&out).map_or(0, |entries| entries.count());
    let start = std::time::Instant::now();
    while files() < 2 {
        assert!(start.elapsed().as_secs() < 120, "no dataset file written");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // SAFETY: SIGINT to this test's own child, as a terminal's Ctrl-C.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let stopped = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&stopped.stderr);
    assert_eq!(stopped.status.code(), Some(3), "{said}");
    let finished = said
        .lines()
        .filter(|line| line.starts_with("episode "))
        .count();
    assert!(
        said.contains(&format!(
            "collect stopped (Ctrl-C, SIGTERM or a hangup) after {finished} of 1000000 episodes"
        )),
        "{said}"
    );
    let names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), finished.div_ceil(4), "{names:?}");
    assert!(
        names
            .iter()
            .all(|name| name.starts_with("chunk_") && name.ends_with(".pt")),
        "{names:?}"
    );
}

/// Dataset files hold no terminations: collecting a task whose episodes end early is refused
/// (offline training would bootstrap through them), unless asked for with episodic=false; nor
/// pixels.
#[test]
fn collecting_a_task_that_ends_episodes_early_is_refused() {
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(common::tdmpc2_bin())
        .args(["collect", "--episodes", "1", "--out"])
        .arg(data.path())
        .arg("task=lunarlander-continuous")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("task=lunarlander-continuous ends episodes early")
            && !stderr.contains("episodic=false to collect"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_dir(data.path()).unwrap().count(), 0);
    // A gymnasium id with episodic=false (its default) is stopped at its first early end,
    // named, and the folder it made for nothing is gone.
    let fresh = data.path().join("fresh");
    let out = Command::new(common::tdmpc2_bin())
        .args(["collect", "--episodes", "3", "--out"])
        .arg(&fresh)
        .arg("task=gym:LunarLanderContinuous-v3")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("environment 0 ended its episode early")
            && stderr.contains("dataset files (the official format) hold no terminations")
            && !stderr.contains("set episodic=true"),
        "{stderr}"
    );
    assert!(!fresh.exists(), "{stderr}");
    // Pixels: the files hold states. Refused before the episodes are played.
    let out = Command::new(common::tdmpc2_bin())
        .args(["collect", "--episodes", "1", "--out"])
        .arg(data.path())
        .args(["task=cartpole-swingup", "obs=rgb"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("collect: obs=rgb") && !stderr.contains("episode 1/1"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_dir(data.path()).unwrap().count(), 0);
}

/// A dataset that does not fit the run is refused before training, naming the file and what
/// differs; a directory holding one takes no second collection.
#[test]
fn a_dataset_of_other_tasks_is_refused_with_what_differs() {
    let data = tempfile::tempdir().unwrap();
    collect(data.path());
    // A second collection there would mix with this one (chunk names restart at 0).
    let again = Command::new(common::tdmpc2_bin())
        .args(["collect", "--episodes", "1", "--out"])
        .arg(data.path())
        .arg(format!("task={TASKS}"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("already holds dataset files (chunk_0.pt, chunk_1.pt, chunk_2.pt)"),
        "{stderr}"
    );
    // Part of the files (chunk_0 holds an episode of two of the tasks), beside a Mac's hidden
    // copy of one: the task with no episode is named; the hidden file is no dataset file.
    let part = tempfile::tempdir().unwrap();
    std::fs::copy(
        data.path().join("chunk_0.pt"),
        part.path().join("chunk_0.pt"),
    )
    .unwrap();
    std::fs::write(part.path().join("._chunk_0.pt"), b"\0\x05\x16\x07").unwrap();
    let run = tempfile::tempdir().unwrap();
    let quick = ["steps=2", "eval_episodes=0", "world_size=1"].map(String::from);
    let console = train(part.path(), run.path(), &quick);
    assert!(
        console.contains("warning: the dataset holds no episode of 1 of the 3 tasks (Pendulum-v1)"),
        "{console}"
    );
    // Nor does a file, or a disk too small for the episodes asked for.
    let elsewhere = tempfile::tempdir().unwrap();
    let file = elsewhere.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let fresh = elsewhere.path().join("fresh");
    let under_a_file = file.join("sub");
    // A filesystem that holds no files has no free space either: not the disk's size.
    let proc = PathBuf::from("/proc/tdmpc2-collected");
    for (out, episodes, expected) in [
        (&proc, "1", "no folder can be made in /proc"),
        (
            &file,
            "1",
            "a-file is a file: dataset files are written into a directory",
        ),
        (&under_a_file, "1", "a-file/sub: cannot be made"),
        (
            &fresh,
            "100000000000000",
            "--episodes 100000000000000: the dataset would take",
        ),
    ] {
        let refused = Command::new(common::tdmpc2_bin())
            .args(["collect", "--episodes", episodes, "--out"])
            .arg(out)
            .arg(format!("task={TASKS}"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
    }
    assert!(!fresh.exists(), "nothing written");
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
    // The same tasks in another order: reacher-easy's episodes (task id 1) would train as
    // Pendulum's, whose observations have 3 of the 6 numbers, the rest zero.
    let out = Command::new(common::tdmpc2_bin())
        .arg("train")
        .args(TINY)
        .args([
            "task=[reacher-easy,Pendulum-v1,cartpole-swingup]".to_string(),
            format!("data_dir={}", data.path().display()),
            format!("run_dir={}", run.path().join("reordered").display()),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("has task id 1, Pendulum-v1, whose observations have 3 numbers")
            && stderr.contains("another order than the run's task list"),
        "{stderr}"
    );
    // The doctor says so too, though every file reads back whole.
    let doctor = Command::new(common::tdmpc2_bin())
        .args(["doctor", "task=[walker-run,cheetah-run]"])
        .arg(format!("data_dir={}", data.path().display()))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(!doctor.status.success(), "{said}");
    assert!(
        said.contains("✓ dataset: 3 files")
            && said.contains("✗ dataset")
            && said.contains("observations of 6 numbers"),
        "{said}"
    );
}

/// Flips 64 bytes in the middle of the largest entry's data, the zip headers intact.
fn damage(file: &Path) {
    let (start, size) = {
        let mut archive = zip::ZipArchive::new(std::fs::File::open(file).unwrap()).unwrap();
        (0..archive.len())
            .map(|i| {
                let entry = archive.by_index(i).unwrap();
                (entry.data_start().unwrap(), entry.size())
            })
            .max_by_key(|&(_, size)| size)
            .unwrap()
    };
    let mut bytes = std::fs::read(file).unwrap();
    let at = (start + size / 2) as usize;
    bytes[at..at + 64].iter_mut().for_each(|b| *b ^= 0x5a);
    std::fs::write(file, bytes).unwrap();
}

/// A file whose data was damaged after it was written (the headers intact, so it indexes) stops
/// the run before any update, naming the file and the entry; the doctor finds it too, and
/// verify_data=false is the way past the check.
#[test]
fn a_damaged_dataset_file_stops_the_run_before_any_update_and_the_doctor_finds_it() {
    let data = tempfile::tempdir().unwrap();
    collect(data.path());
    let data_dir = format!("data_dir={}", data.path().display());
    let doctor = |dir: &str| {
        Command::new(common::tdmpc2_bin())
            .args(["doctor", dir, &format!("task={TASKS}")])
            .output()
            .unwrap()
    };
    let healthy = doctor(&data_dir);
    let said = String::from_utf8_lossy(&healthy.stdout);
    assert!(
        said.contains("✓ dataset: 3 files")
            && said.contains("✓ dataset: its 6 episodes fit the run's model and horizon"),
        "{said}"
    );
    damage(&data.path().join("chunk_1.pt"));
    let run = tempfile::tempdir().unwrap();
    let train = |extra: &[&str]| {
        Command::new(common::tdmpc2_bin())
            .arg("train")
            .args(TINY)
            .args([
                format!("task={TASKS}"),
                data_dir.clone(),
                "steps=2".into(),
                format!("run_dir={}", run.path().display()),
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = train(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error"))
        .unwrap_or("");
    assert!(
        error.contains("chunk_1.pt")
            && error.contains("CRC-32")
            && error.contains("/data/")
            && error.contains("download or copy it again"),
        "{stderr}"
    );
    assert!(
        metrics(run.path()).iter().all(|r| r["phase"] != "train"),
        "no update ran"
    );
    let damaged = doctor(&data_dir);
    let said = String::from_utf8_lossy(&damaged.stdout);
    assert!(!damaged.status.success(), "{said}");
    assert!(
        said.contains("✗ dataset") && said.contains("chunk_1.pt"),
        "{said}"
    );
    // Unchecked, the run goes on to its evaluation (kept short).
    let unchecked = train(&["verify_data=false", "mpc=false", "eval_episodes=1"]);
    let stderr = String::from_utf8_lossy(&unchecked.stderr);
    assert!(
        !stderr.contains("verifying dataset file") && !stderr.contains("CRC-32"),
        "{stderr}"
    );
    assert!(
        metrics(run.path()).iter().any(|r| r["phase"] == "eval"),
        "{stderr}"
    );
}

/// A stop during an evaluation (here at update 20, once its training record is logged) keeps
/// that record, and the resumed run redoes the evaluation as the uninterrupted run made it (its
/// planning noise is derived at its update), then trains on to the same model.
#[test]
fn a_stop_during_an_offline_evaluation_resumes_to_the_same_run() {
    let data = pendulum_dataset();
    let train = |run_dir: &Path| {
        let mut command = Command::new(common::tdmpc2_bin());
        command.arg("train").args(TINY).args([
            format!("data_dir={}", data.path().display()),
            format!("run_dir={}", run_dir.display()),
            "eval_episodes=10".into(),
            "eval_freq=20".into(),
            "steps=40".into(),
            "num_threads=1".into(),
        ]);
        command
    };
    let (whole, split) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    succeeds(&mut train(whole.path()));

    let mut stopped = common::Reaped::spawn(
        train(split.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped()),
    );
    let logged_20 = |r: &serde_json::Value| r["phase"] == "train" && r["step"] == 20;
    // Read as it is written: a last line may be half there.
    let logged_so_far = || {
        let text = std::fs::read_to_string(split.path().join("metrics.jsonl")).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .any(|r| logged_20(&r))
    };
    let start = std::time::Instant::now();
    while !logged_so_far() {
        assert!(start.elapsed().as_secs() < 300, "no training record at 20");
        assert_eq!(stopped.try_wait().unwrap(), None, "the run went on");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // SAFETY: SIGINT to this test's own child, as a terminal's Ctrl-C.
    unsafe { libc::kill(stopped.id() as libc::pid_t, libc::SIGINT) };
    let out = stopped.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(
        said.contains("during the evaluation at update 20"),
        "{said}"
    );
    assert!(
        metrics(split.path()).iter().any(logged_20),
        "the record stays"
    );

    let mut resumed = train(split.path());
    succeeds(resumed.arg("resume=auto"));
    let records = |run: &Path| {
        let records = metrics(run);
        records
            .iter()
            .map(|r| {
                let value = r.get("episode_reward").or_else(|| r.get("total_loss"));
                (r["phase"].to_string(), r["step"].as_u64(), value.cloned())
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(records(split.path()), records(whole.path()));
    common::assert_same_tensors(
        &common::checkpoint(whole.path(), 40).join("model.safetensors"),
        &common::checkpoint(split.path(), 40).join("model.safetensors"),
    );
}

/// Four random Pendulum episodes of 200 steps, in one file.
fn pendulum_dataset() -> tempfile::TempDir {
    let data = tempfile::tempdir().unwrap();
    succeeds(
        Command::new(common::tdmpc2_bin())
            .args(["collect", "--episodes", "4", "--out"])
            .arg(data.path())
            .arg("task=Pendulum-v1"),
    );
    data
}

/// A sweep whose later job's horizon the dataset's episodes cannot give is refused before its
/// first job runs, naming that job.
#[test]
fn a_sweep_is_checked_against_its_dataset_before_any_job_runs() {
    let data = pendulum_dataset();
    let runs = tempfile::tempdir().unwrap();
    let out = Command::new(common::tdmpc2_bin())
        .args([
            "train",
            "-m",
            "task=Pendulum-v1",
            "model_size=1",
            "steps=10",
        ])
        .arg(format!("data_dir={}", data.path().display()))
        .arg(format!("run_dir={}", runs.path().join("sweep").display()))
        .arg("horizon=3,250")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("--multirun job 1 (horizon=250)")
            && said.contains("shorter than a sampled slice of horizon + 1 = 251")
            && said.contains("no job was started"),
        "{said}"
    );
    assert!(!runs.path().join("sweep").exists(), "nothing ran");
}
