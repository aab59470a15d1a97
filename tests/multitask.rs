//! Online multitask training across ranks through the real binary: three tasks of different
//! observation sizes, action sizes and episode lengths on three ranks (one task each) and on two
//! (each rank cycling them), trained, checkpointed and resumed bit for bit, with each task's
//! evaluation return logged.
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{free_port, metrics, succeeds, TINY};

/// Pendulum (3 numbers, 1 action, 200 steps), reacher (6, 2, 500), cartpole (5, 1, 500).
const TASKS: [&str; 3] = ["Pendulum-v1", "reacher-easy", "cartpole-swingup"];

fn train(run_dir: &Path, world: usize, extra: &[String]) -> String {
    let out = succeeds(
        Command::new(common::tdmpc2_bin())
            .arg("train")
            .args(TINY)
            .args([
                format!("task=[{}]", TASKS.join(",")),
                format!("world_size={world}"),
                "seed_steps=500".into(),
                "eval_episodes=1".into(),
                "num_threads=1".into(),
                "save_buffer=true".into(),
                // Fewer rows than a rank plays: its ring wraps, and the resumed run must
                // go on with it exactly.
                "buffer_size=750".into(),
                format!("master_port={}", free_port()),
                format!("run_dir={}", run_dir.display()),
            ])
            .args(extra),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn checkpoints(run_dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(run_dir.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    dirs
}

fn file(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap()
}

/// Trains `world` ranks for `steps_each` steps each (checkpoints fall due every 600, at the next
/// step where every rank's episode ends), then resumes its first checkpoint in another run
/// directory: the resumed run ends in the same model and optimiser state. (Stopping a run and
/// resuming it in its own directory is tests/train.rs's.) Returns the uninterrupted run's
/// directory and console output.
fn assert_trains_and_resumes_exactly(
    world: usize,
    steps_each: usize,
) -> (tempfile::TempDir, String) {
    let steps = steps_each * world;
    let every = format!("{}", 600 * world);
    let frequencies = [format!("save_freq={every}"), format!("eval_freq={every}")];
    let whole = tempfile::tempdir().unwrap();
    let mut args = frequencies.to_vec();
    args.push(format!("steps={steps}"));
    let console = train(whole.path(), world, &args);
    let whole_checkpoints = checkpoints(whole.path());
    assert!(
        whole_checkpoints.len() >= 2,
        "a checkpoint before the end: {whole_checkpoints:?}"
    );
    let first = &whole_checkpoints[0];

    let resumed = tempfile::tempdir().unwrap();
    let mut args = frequencies.to_vec();
    args.extend([
        format!("steps={steps}"),
        format!("resume={}", first.display()),
    ]);
    train(resumed.path(), world, &args);

    let (last, resumed_last) = (
        whole_checkpoints.last().unwrap(),
        checkpoints(resumed.path()).pop().unwrap(),
    );
    assert_eq!(last.file_name(), resumed_last.file_name());
    for name in ["model.safetensors", "state.safetensors"] {
        assert!(
            file(last, name) == file(&resumed_last, name),
            "{world} ranks: {name} of the resumed run differs at {}",
            last.display()
        );
    }
    (whole, console)
}

/// Every evaluation logs each task's return, their DMControl average and the normalised score.
fn assert_each_task_evaluated(run_dir: &Path, console: &str) {
    let evals: Vec<serde_json::Value> = metrics(run_dir)
        .into_iter()
        .filter(|m| m["phase"] == "eval")
        .collect();
    assert!(evals.len() >= 2, "{evals:?}");
    for eval in &evals {
        for task in TASKS {
            let reward = eval[format!("episode_reward+{task}")].as_f64();
            assert!(reward.is_some_and(f64::is_finite), "{task}: {eval}");
        }
        let dmc = eval["episode_reward+avg_dmcontrol"].as_f64().unwrap();
        let reacher = eval["episode_reward+reacher-easy"].as_f64().unwrap();
        let cartpole = eval["episode_reward+cartpole-swingup"].as_f64().unwrap();
        assert!((dmc - (reacher + cartpole) / 2.0).abs() < 1e-9, "{eval}");
        let score = eval["episode_score+normalized"].as_f64().unwrap();
        assert!((score - dmc / 10.0).abs() < 1e-9, "{eval}");
        assert_eq!(
            eval["episodes"].as_f64(),
            Some(3.0),
            "one of each task: {eval}"
        );
    }
    assert!(
        console.contains("  reacher-easy") && console.contains("normalized score"),
        "{console}"
    );
    // Each training record also logs its episodes' returns under their tasks' names (the
    // episodes that end at one step are one record: several tasks, each its mean).
    let train: Vec<serde_json::Value> = metrics(run_dir)
        .into_iter()
        .filter(|m| m["phase"] == "train" && m.get("episode_reward").is_some())
        .collect();
    assert!(!train.is_empty());
    for row in &train {
        let named: Vec<f64> = TASKS
            .iter()
            .filter_map(|task| row.get(format!("episode_reward+{task}"))?.as_f64())
            .collect();
        let ended = row
            .get("episodes_ended")
            .and_then(|n| n.as_f64())
            .unwrap_or(1.0);
        assert!(!named.is_empty() && named.len() as f64 <= ended, "{row}");
        if ended == 1.0 {
            assert_eq!(named[0], row["episode_reward"].as_f64().unwrap(), "{row}");
        }
    }
}

/// The tasks of the episodes in `rank`'s buffer at its last checkpoint.
fn buffer_tasks(run_dir: &Path, rank: usize) -> Vec<u64> {
    let dir = run_dir.join("buffers").join(format!("rank{rank}"));
    let last = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    let meta: serde_json::Value = serde_json::from_slice(&file(&last, "buffer.json")).unwrap();
    let mut tasks: Vec<u64> = meta["episodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["task"].as_u64().unwrap())
        .collect();
    tasks.sort();
    tasks.dedup();
    tasks
}

#[test]
fn three_tasks_on_three_ranks_train_resume_exactly_and_log_each_task() {
    // Every rank's episodes end together at step 1000 (200- and 500-step episodes).
    let (run, console) = assert_trains_and_resumes_exactly(3, 1100);
    assert_each_task_evaluated(run.path(), &console);
    for rank in 0..3 {
        assert_eq!(
            buffer_tasks(run.path(), rank),
            [rank as u64],
            "rank {rank} plays its task"
        );
    }
}

#[test]
fn three_tasks_on_two_ranks_cycle_and_resume_exactly() {
    // Rank 0 plays tasks 0, 2, 1, 0 (200, 500, 500, 200 steps) and rank 1 tasks 1, 0, 2, 1:
    // their episodes end together at step 700; at 1400 the last 750 rows of each rank's
    // buffer hold all three tasks.
    let (run, console) = assert_trains_and_resumes_exactly(2, 1400);
    assert_each_task_evaluated(run.path(), &console);
    for rank in 0..2 {
        assert_eq!(
            buffer_tasks(run.path(), rank),
            [0, 1, 2],
            "rank {rank} cycles all three"
        );
    }
}
