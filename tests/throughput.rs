//! Many environments per rank through the real binary: Python environments in worker
//! processes, several ranks each with several environments, and a worker that dies.
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{children_of, free_port, tdmpc2_bin, TINY};

/// gymnasium's Pendulum-v1 (a Python environment, so it runs in worker processes), four
/// environments per rank, one update per vector step.
fn gym_settings() -> Vec<String> {
    let mut args: Vec<String> = TINY.iter().map(|s| s.to_string()).collect();
    args.extend(
        [
            "task=gym:Pendulum-v1",
            "num_envs=4",
            "steps_per_update=4",
            "env_workers=2",
            "num_threads=1",
            // One episode of each environment before learning starts.
            "seed_steps=800",
        ]
        .map(String::from),
    );
    args
}

#[test]
fn two_ranks_with_four_environments_each_keep_identical_learners() {
    let dir = tempfile::tempdir().unwrap();
    // Per rank: 4 environments × 2 episodes of 200 steps.
    let out = Command::new(tdmpc2_bin())
        .arg("train")
        .args(gym_settings())
        .args([
            "world_size=2".to_string(),
            "steps=3200".into(),
            "eval_freq=1600".into(),
            "eval_episodes=8".into(),
            format!("master_port={}", free_port()),
            format!("run_dir={}", dir.path().display()),
        ])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("checkpoints/step_000000003200/meta.json")).unwrap(),
    )
    .unwrap();
    // Saving compares every part of every rank's learner state and refuses to write when any
    // differs; the combined checksums are recorded per rank.
    let sums = meta["rank_checksums"].as_array().unwrap();
    assert_eq!(sums.len(), 2);
    assert_eq!(sums[0], sums[1]);
    // 2 ranks × 4 environments × 2 episodes, and each evaluation played all 8 episodes.
    assert_eq!(meta["episodes"], 8, "episodes counted per rank");
    let evals = std::fs::read_to_string(dir.path().join("eval.csv")).unwrap();
    assert_eq!(
        evals.lines().count(),
        1 + 3,
        "evaluations at 0, 1600, 3200: {evals}"
    );
    // Rank 0's four environments end their episodes together: one record a step, their mean.
    let train = std::fs::read_to_string(dir.path().join("train.csv")).unwrap();
    assert_eq!(
        train.lines().count(),
        1 + 2,
        "rank 0's episode ends: {train}"
    );
    let rows = common::metrics(dir.path());
    let trains: Vec<_> = rows.iter().filter(|r| r["phase"] == "train").collect();
    for row in trains {
        assert_eq!(row["episodes_ended"], 4.0, "{row}");
        let (min, mean, max) = (
            row["episode_reward_min"].as_f64().unwrap(),
            row["episode_reward"].as_f64().unwrap(),
            row["episode_reward_max"].as_f64().unwrap(),
        );
        assert!(min <= mean && mean <= max, "{row}");
    }
}

#[test]
fn a_killed_environment_worker_stops_training_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = common::Reaped::spawn(
        Command::new(tdmpc2_bin())
            .arg("train")
            .args(gym_settings())
            .args([
                "steps=100000".to_string(),
                format!("run_dir={}", dir.path().display()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    // Wait for the two workers, let them step a while, then kill one.
    let started = Instant::now();
    let workers = loop {
        let workers: Vec<u32> = children_of(child.id())
            .into_iter()
            .filter(|&pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("env-worker"))
            })
            .collect();
        if workers.len() == 2 {
            break workers;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no environment workers started"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(Duration::from_secs(3));
    let killed = Instant::now();
    unsafe { libc::kill(workers[1] as i32, libc::SIGKILL) };
    let (status, noticed) = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break (status, killed.elapsed());
        }
        if killed.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("training went on for 30 s after its environment worker died");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(!status.success());
    assert!(
        log.contains("gym:Pendulum-v1") && log.contains("died") && log.contains("SIGKILL"),
        "the error names the environment and what happened: {log}"
    );
    // Within a few steps; the bound leaves room for a loaded machine (a step can take a second
    // when other tests share the cores).
    assert!(
        noticed < Duration::from_secs(20),
        "noticed within seconds, not {noticed:?}"
    );
    // Its other worker is gone too.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !std::path::Path::new(&format!("/proc/{}", workers[0])).exists()
            || std::fs::read_to_string(format!("/proc/{}/stat", workers[0]))
                .is_ok_and(|s| s.contains(") Z "))
    );
}
