//! Data-parallel correctness on CPU with gloo, through real processes:
//! - N ranks with batch B equal one rank with batch N·B (parameters, scale, losses);
//! - sync_freq=2 on one rank equals one update on the doubled batch (world model);
//! - every rank ends with the same learner state (the checkpoints' per-rank checksums);
//! - a dying rank stops the run, naming the rank; a taken master_port is a clear error.
//!
//! Worker processes are this test binary re-run on `worker_entry` (or `diverged_rank_entry`) with
//! TDMPC2_TEST_WORKER set.
mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{children_of, free_port, TINY};
use tch::{Device, Kind, Tensor};
use tdmpc2::agent::{NoiseKind, ReplayNoise};
use tdmpc2::buffer::Batch;
use tdmpc2::config::{Config, Source};
use tdmpc2::ddp::{Backend, ProcessGroup, RankInfo};
use tdmpc2::learner::{Learner, LearnerSettings};

const B: i64 = 8;
const H: i64 = 3;
const OBS: i64 = 5;
const ACT: i64 = 2;
const NUM_Q: i64 = 2;

fn config(batch_size: i64, sync_freq: usize) -> Config {
    let overrides = [
        format!("batch_size={batch_size}"),
        format!("sync_freq={sync_freq}"),
        "horizon=3".into(),
        "latent_dim=16".into(),
        "enc_dim=32".into(),
        "mlp_dim=32".into(),
        format!("num_q={NUM_Q}"),
        "dropout=0".into(),
        "obs_shape=[5]".into(),
        "action_dim=2".into(),
        "discount=0.99".into(),
    ];
    Config::load(&Source {
        overrides: overrides.to_vec(),
        ..Source::default()
    })
    .unwrap()
}

/// Tests run on parallel threads but share torch's global generator: every helper that seeds
/// and draws from it holds this lock, so seeding and drawing stay together.
static TORCH_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    TORCH_RNG
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The union batch of `parts` batches of B, deterministic.
fn union_batch(parts: i64) -> Batch {
    let _lock = rng_lock();
    let _guard = tch::no_grad_guard();
    tch::manual_seed(123);
    let n = parts * B;
    Batch {
        obs: Tensor::randn([H + 1, n, OBS], (Kind::Float, Device::Cpu)),
        action: Tensor::rand([H, n, ACT], (Kind::Float, Device::Cpu)) * 2.0 - 1.0,
        reward: Tensor::randn([H, n, 1], (Kind::Float, Device::Cpu)),
        terminated: Tensor::zeros([H, n, 1], (Kind::Float, Device::Cpu)),
        task: None,
    }
}

fn part(batch: &Batch, index: i64) -> Batch {
    let slice = |t: &Tensor| t.narrow(1, index * B, B).copy();
    Batch {
        obs: slice(&batch.obs),
        action: slice(&batch.action),
        reward: slice(&batch.reward),
        terminated: slice(&batch.terminated),
        task: None,
    }
}

/// The per-sample noise of one update on `parts` batches, and the two head permutations.
fn update_noise(parts: i64) -> (Tensor, Tensor, Vec<i64>, Vec<i64>) {
    let _lock = rng_lock();
    tch::manual_seed(7);
    let td = Tensor::randn([H, parts * B, ACT], (Kind::Float, Device::Cpu));
    let pi = Tensor::randn([H + 1, parts * B, ACT], (Kind::Float, Device::Cpu));
    (td, pi, vec![1, 0], vec![0, 1])
}

/// Replayed draws for micro-batches `indices` of the union (in update order: every world-model
/// pass, then every policy pass).
fn replay(indices: &[i64], parts: i64) -> (ReplayNoise, ReplayNoise) {
    let (td, pi, td_perm, pi_perm) = update_noise(parts);
    let width = B;
    let mut sample = ReplayNoise::new();
    let mut batch = ReplayNoise::new();
    let perm = |p: &[i64]| Tensor::from_slice(p);
    for &i in indices {
        sample.push(NoiseKind::Randn, td.narrow(1, i * width, width).copy());
        batch.push(NoiseKind::Randperm, perm(&td_perm));
    }
    for &i in indices {
        sample.push(NoiseKind::Randn, pi.narrow(1, i * width, width).copy());
        batch.push(NoiseKind::Randperm, perm(&pi_perm));
    }
    (sample, batch)
}

/// Replayed draws for one update on the whole union of `parts` batches.
fn replay_whole(parts: i64) -> (ReplayNoise, ReplayNoise) {
    let (td, pi, td_perm, pi_perm) = update_noise(parts);
    let mut sample = ReplayNoise::new();
    sample.push(NoiseKind::Randn, td);
    sample.push(NoiseKind::Randn, pi);
    let mut batch = ReplayNoise::new();
    batch.push(NoiseKind::Randperm, Tensor::from_slice(&td_perm));
    batch.push(NoiseKind::Randperm, Tensor::from_slice(&pi_perm));
    (sample, batch)
}

/// A learner initialised from seed 5 (torch's generator is process-wide: tests take turns).
fn learner<'g>(config: &Config, group: &'g ProcessGroup) -> Learner<'g> {
    let _lock = rng_lock();
    let config = Config {
        seed: 5,
        ..config.clone()
    };
    Learner::new(
        &LearnerSettings::from_config(&config)
            .unwrap()
            .with_capacity(100),
        Device::Cpu,
        group,
    )
    .unwrap()
}

/// Parameters, scale and losses after one synchronised update, as named tensors.
fn outcome(learner: &Learner, info: &tdmpc2::agent::UpdateInfo) -> Vec<(String, Tensor)> {
    let mut out = learner.model().named_tensors();
    out.push(("scale".into(), learner.updater().scale.value().copy()));
    out.push(("info".into(), info.values.copy()));
    out
}

/// One update of this rank (`rank` of `world`) on its part of the union; returns the outcome.
fn rank_update(group: &ProcessGroup, parts: i64) -> Vec<(String, Tensor)> {
    let config = config(B, 1);
    let mut learner = learner(&config, group);
    let (sample, batch) = replay(&[group.rank() as i64], parts);
    learner.set_noise(Box::new(sample), Box::new(batch));
    let info = learner
        .update_on(&[part(&union_batch(parts), group.rank() as i64)])
        .unwrap();
    outcome(&learner, &info)
}

/// Not a test: the entry point of the worker processes `run_workers` starts.
#[test]
#[ignore = "the worker processes' entry point; run_workers starts it"]
fn worker_entry() {
    let out = std::env::var("TDMPC2_TEST_WORKER")
        .expect("started by run_workers, which sets TDMPC2_TEST_WORKER");
    let config = config(B, 1);
    let group = join_as_worker(&config);
    let result = rank_update(&group, group.world_size() as i64);
    if group.rank() == 0 {
        Tensor::write_safetensors(&result, &out).unwrap();
    }
}

/// The gloo group of a worker process `run_entry` started (its rank in the environment).
fn join_as_worker(config: &Config) -> ProcessGroup {
    let (rank, _) = RankInfo::from_env(config, &|k| std::env::var(k).ok()).unwrap();
    ProcessGroup::init(
        rank,
        Backend::Gloo,
        Device::Cpu,
        Duration::from_secs(60),
        false,
        || false,
    )
    .unwrap()
}

/// `train` with the tiny settings, one thread per rank.
fn tiny_train() -> Vec<&'static str> {
    [&["train"], TINY, &["num_threads=1"]].concat()
}

/// Not a test: the entry point of the ranks `a_checkpoint_of_ranks_that_differ_is_refused`
/// starts, whose learners differ (other seeds); each writes what saving a checkpoint said.
#[test]
#[ignore = "the ranks' entry point; a_checkpoint_of_ranks_that_differ_is_refused starts it"]
fn diverged_rank_entry() {
    let out = PathBuf::from(std::env::var_os("TDMPC2_TEST_WORKER").expect("set by the test"));
    let config = Config {
        run_dir: Some(out.join("run").display().to_string()),
        ..config(B, 1)
    };
    let group = join_as_worker(&config);
    let seeded = Config {
        seed: 5 + group.rank() as u64,
        ..config.clone()
    };
    let settings = LearnerSettings::from_config(&seeded)
        .unwrap()
        .with_capacity(100);
    let learner = Learner::new(&settings, Device::Cpu, &group).unwrap();
    let said = tdmpc2::checkpoint::save(
        &tdmpc2::checkpoint::CheckpointSettings::from_config(&config),
        &tdmpc2::checkpoint::TrainState::default(),
        &learner,
        &group,
    );
    let said = said.err().map(|e| e.to_string()).unwrap_or_default();
    std::fs::write(out.join(format!("rank{}.txt", group.rank())), said).unwrap();
}

/// Every rank's learner state is compared at each checkpoint: ranks that differ are refused
/// by name, not saved as one state.
#[test]
fn a_checkpoint_of_ranks_that_differ_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    run_entry("diverged_rank_entry", 2, dir.path());
    let said = std::fs::read_to_string(dir.path().join("rank0.txt")).unwrap();
    assert!(
        said.contains("learner state diverged across ranks")
            && said.contains("model_params on rank 1"),
        "{said}"
    );
    let saved = dir.path().join("run/checkpoints");
    let steps = std::fs::read_dir(&saved).map_or(0, |d| d.count());
    assert_eq!(steps, 0, "a checkpoint of differing ranks was written");
}

fn run_workers(world: usize, out: &Path) {
    run_entry("worker_entry", world, out);
}

/// Runs `world` ranks of this test binary's ignored `entry`, each told `out`.
fn run_entry(entry: &str, world: usize, out: &Path) {
    let port = free_port().to_string();
    let children: Vec<_> = (0..world)
        .map(|rank| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    entry,
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("TDMPC2_TEST_WORKER", out)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a worker failed");
    }
}

fn assert_close(a: &[(String, Tensor)], b: &[(String, Tensor)], what: &str) {
    let mut checked = 0;
    for (name, ta) in a {
        let tb = &b
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{name} missing"))
            .1;
        let diff = (ta - tb).abs().max().double_value(&[]);
        let scale = tb.abs().max().double_value(&[]).max(1.0);
        assert!(diff <= 1e-5 * scale, "{what}: {name} differs by {diff}");
        checked += 1;
    }
    assert!(checked > 10);
}

#[test]
fn two_ranks_with_batch_b_equal_one_rank_with_batch_2b() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rank0.safetensors");
    run_workers(2, &out);
    let distributed = Tensor::read_safetensors(&out).unwrap();

    let single = ProcessGroup::alone(RankInfo::single(&config(B, 1)));
    let config = config(2 * B, 1);
    let mut learner = learner(&config, &single);
    let (sample, batch) = replay_whole(2);
    learner.set_noise(Box::new(sample), Box::new(batch));
    let info = learner.update_on(&[union_batch(2)]).unwrap();
    let reference = outcome(&learner, &info);
    assert_close(&distributed, &reference, "2 ranks × B vs 1 rank × 2B");

    // The update moved the parameters: the comparison is not between two untouched models.
    let fresh = self::learner(&config, &single).model().named_tensors();
    let moved = fresh
        .iter()
        .zip(&reference)
        .any(|((_, a), (_, b))| !a.allclose(b, 1e-7, 1e-7, false));
    assert!(moved);
}

#[test]
fn sync_freq_two_equals_one_update_on_the_doubled_batch() {
    let single = ProcessGroup::alone(RankInfo::single(&config(B, 1)));
    let union = union_batch(2);

    let accumulated = config(B, 2);
    let mut learner_a = learner(&accumulated, &single);
    let (sample, batch) = replay(&[0, 1], 2);
    learner_a.set_noise(Box::new(sample), Box::new(batch));
    learner_a
        .update_on(&[part(&union, 0), part(&union, 1)])
        .unwrap();

    let doubled = config(2 * B, 1);
    let mut learner_b = learner(&doubled, &single);
    let (sample, batch) = replay_whole(2);
    learner_b.set_noise(Box::new(sample), Box::new(batch));
    learner_b.update_on(&[union]).unwrap();

    let world_model = |l: &Learner| -> Vec<(String, Tensor)> {
        l.model()
            .named_tensors()
            .into_iter()
            .filter(|(n, _)| !n.starts_with("_pi"))
            .collect()
    };
    assert_close(
        &world_model(&learner_a),
        &world_model(&learner_b),
        "sync_freq=2 vs doubled batch",
    );
}

fn launcher(args: &[String]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(tiny_train())
        .args(args)
        .output()
        .unwrap()
}

/// Two ranks on a run far too long to finish, for the tests that stop it from outside.
fn spawn_endless_two_rank_run(run_dir: &Path, stdout: Stdio) -> common::Reaped {
    spawn_endless_two_rank_run_with(run_dir, stdout, &[])
}

/// [`spawn_endless_two_rank_run`] with `extra` settings.
fn spawn_endless_two_rank_run_with(
    run_dir: &Path,
    stdout: Stdio,
    extra: &[&str],
) -> common::Reaped {
    common::Reaped::spawn(
        Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
            .args(tiny_train())
            .args([
                "world_size=2".to_string(),
                "steps=1000000".into(),
                format!("master_port={}", free_port()),
                format!("run_dir={}", run_dir.display()),
            ])
            .args(extra)
            .stdout(stdout)
            .stderr(Stdio::piped()),
    )
}

fn meta(run_dir: &Path, step: u64) -> serde_json::Value {
    let path: PathBuf = run_dir
        .join("checkpoints")
        .join(format!("step_{step:012}"))
        .join("meta.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// With at least one CPU per rank, the launcher plans one slice of CPUs per rank and rank 0
/// runs on its slice; with fewer, nobody is pinned.
fn assert_pinned_as_planned(stderr: &str, world: usize) {
    let cpus = std::thread::available_parallelism().unwrap().get();
    let plan = stderr.lines().find_map(|l| {
        l.split_once("rank → CPUs ")
            .map(|(_, list)| list.to_owned())
    });
    let pinned = stderr
        .lines()
        .find_map(|l| l.strip_prefix("rank 0 pinned to CPUs ").map(str::to_owned));
    if cpus < world {
        assert_eq!((plan, pinned), (None, None), "{stderr}");
        return;
    }
    let plan = plan.unwrap_or_else(|| panic!("no CPU plan for {world} ranks: {stderr}"));
    let slices: Vec<&str> = plan.split(", ").collect();
    assert_eq!(slices.len(), world, "{plan}");
    let first = slices[0].strip_prefix("0 → ").unwrap();
    assert_eq!(pinned.as_deref(), Some(first), "{stderr}");
}

#[test]
fn every_rank_holds_the_same_learner_state() {
    // A checkpoint when seeding ends (before any update) and one at the end, after the 200
    // pretraining updates and 200 more: the ranks trained and still agree.
    for world in [2usize, 3] {
        let dir = tempfile::tempdir().unwrap();
        let steps = 400 * world as u64;
        let out = launcher(&[
            format!("world_size={world}"),
            format!("steps={steps}"),
            format!("save_freq={}", 200 * world),
            format!("eval_freq={steps}"),
            format!("master_port={}", free_port()),
            format!("run_dir={}", dir.path().display()),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert_pinned_as_planned(&stderr, world);
        let checksums = meta(dir.path(), steps)["rank_checksums"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(checksums.len(), world);
        assert!(
            checksums.iter().all(|c| c == &checksums[0]),
            "{world} ranks at {steps}: {checksums:?}"
        );
        assert_ne!(
            meta(dir.path(), 200 * world as u64)["rank_checksums"][0],
            meta(dir.path(), steps)["rank_checksums"][0]
        );
    }
}

#[test]
fn a_dying_rank_stops_the_run_and_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    // A long run whose rank 1 is SIGKILLed mid-way.
    let child = spawn_endless_two_rank_run(dir.path(), Stdio::piped());
    std::thread::sleep(Duration::from_secs(6));
    // Rank 1 may not be started yet on a loaded machine.
    let mut killed = kill_rank(child.id(), 1);
    while !killed && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
        killed = kill_rank(child.id(), 1);
    }
    assert!(killed, "found rank 1's process");
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("rank 1 failed"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "stopped within a bounded time"
    );
}

/// SIGKILLs the child of `launcher` whose environment says RANK=`rank`.
fn kill_rank(launcher: u32, rank: usize) -> bool {
    rank_pid(launcher, rank).is_some_and(|pid| {
        Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success())
    })
}

#[test]
fn a_taken_master_port_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = launcher(&[
        "world_size=2".into(),
        "steps=800".into(),
        format!("master_port={port}"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("master_port={port} is not free")),
        "{stderr}"
    );
    // A master name that cannot resolve, on one node too (each rank waited for it until
    // dist_timeout).
    let started = Instant::now();
    let out = launcher(&[
        "world_size=2".into(),
        "steps=800".into(),
        "master_addr=not..a.host".into(),
        format!("master_port={}", free_port()),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("master_addr=not..a.host"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20), "{stderr}");
    // Another machine's address (TEST-NET-1, on none), with every rank on this one.
    let out = launcher(&[
        "world_size=2".into(),
        "steps=800".into(),
        "master_addr=192.0.2.1".into(),
        format!("master_port={}", free_port()),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("master_addr=192.0.2.1 leads to another machine"),
        "{stderr}"
    );
    // A rank of another launcher (torchrun, SLURM) names the variable that gave the name.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(tiny_train())
        .arg(format!("run_dir={}", dir.path().display()))
        .envs([
            ("RANK", "1"),
            ("LOCAL_RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_WORLD_SIZE", "1"),
            ("MASTER_ADDR", "not..a.host"),
            ("MASTER_PORT", &free_port().to_string()),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("MASTER_ADDR=not..a.host cannot be resolved"),
        "{stderr}"
    );
    // A SLURM task without MASTER_ADDR meets at its step's first node.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(tiny_train())
        .arg(format!("run_dir={}", dir.path().display()))
        .envs([
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_STEP_NODELIST", "not..a.host"),
            ("MASTER_PORT", &free_port().to_string()),
        ])
        .env_remove("MASTER_ADDR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("not..a.host, SLURM's first node (MASTER_ADDR unset), cannot be"),
        "{stderr}"
    );
}

/// A rank whose peers never come says what it waits for, stops at once on Ctrl-C (exit 3; it
/// waited out `dist_timeout` inside c10d), and after `dist_timeout` names how many joined,
/// without a Python traceback or c10d's C++ frames.
#[test]
fn a_rank_waiting_for_its_peers_says_so_and_stops_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let alone = |rank: &str, extra: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tdmpc2"));
        command
            .args(tiny_train())
            .args(["steps=480", "seed=5"])
            .args(extra)
            .arg(format!("run_dir={}", dir.path().join(rank).display()))
            .envs([
                ("RANK", rank),
                ("LOCAL_RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("LOCAL_WORLD_SIZE", "1"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", port.as_str()),
            ]);
        command
    };
    // Rank 1, whose rank 0 never starts: told, then stopped.
    let mut child = alone("1", &["dist_timeout=600"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let mut lines = stderr.lines().map_while(|line| line.ok());
    let mut before = Vec::new();
    let waiting = lines
        .by_ref()
        .find(|line| {
            before.push(line.clone());
            line.contains("waiting")
        })
        .unwrap_or_default();
    assert!(
        waiting.contains("rank 1: waiting")
            && waiting.contains(&format!("127.0.0.1:{port}"))
            && waiting.contains("dist_timeout"),
        "{waiting}"
    );
    let asked = Instant::now();
    // SAFETY: a plain kill(2) of this test's child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let rest: Vec<String> = lines.collect();
    let status = child.wait().unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(status.code(), Some(3), "{rest:?}");
    assert!(
        !before.iter().chain(&rest).any(|l| l.contains("frame #")),
        "no C++ frames of c10d's tries: {before:?} {rest:?}"
    );
    assert!(
        rest.iter()
            .any(|l| l.contains("asked to stop while it waited for the other ranks")),
        "{rest:?}"
    );
    // Rank 0, whose rank 1 never starts: named after dist_timeout.
    let out = alone("0", &["dist_timeout=4", "peer_timeout=2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("1 of 2 ranks joined") && stderr.contains("within 4 s (dist_timeout)"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("Traceback") && !stderr.contains("traceback"),
        "{stderr}"
    );
}

/// A node whose node 0 never comes says that it waits for it, then names it after
/// `dist_timeout` (exit 1), without c10d's C++ frames for each try.
#[test]
fn a_node_waiting_for_node_0_says_so_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = node_command(
        dir.path(),
        free_port(),
        1,
        480,
        &["dist_timeout=15", "peer_timeout=5"],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // The first report comes after 10 s (11 on a machine that stalled it).
    assert!(
        stderr.contains("node 1: waiting 1")
            && stderr.contains(" s for node 0's launcher")
            && stderr.contains("cannot reach node 0's launcher")
            && stderr.contains("within 15 s (dist_timeout)"),
        "{stderr}"
    );
    assert!(!stderr.contains("frame #"), "{stderr}");
}

/// A SLURM task that finds another job's store on its master port (an earlier job, or a
/// neighbour's on a shared node, still holding it) is refused before it joins that job's
/// group, naming both jobs; the other job's rank 0 goes on waiting for its own.
#[test]
fn a_rank_refuses_another_jobs_store_on_its_port() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let task = |job: &str, rank: &str| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tdmpc2"));
        command
            .args(tiny_train())
            .args(["steps=480", "dist_timeout=600"])
            .arg(format!("run_dir={}", dir.path().join(job).display()))
            .envs([
                ("SLURM_JOB_ID", job),
                ("SLURM_STEP_ID", "0"),
                ("SLURM_PROCID", rank),
                ("SLURM_LOCALID", rank),
                ("SLURM_NTASKS", "2"),
                ("SLURM_NODEID", "0"),
                ("SLURM_STEP_TASKS_PER_NODE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
            ])
            .env("MASTER_PORT", port.to_string())
            .stdout(Stdio::null());
        command
    };
    let mut first = common::Reaped::spawn(task("111", "0").stderr(Stdio::null()));
    let waiting = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        && waiting.elapsed() < Duration::from_secs(120)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = task("222", "1").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("master_port={port}"))
            && stderr.contains("another job (SLURM job 111), not this one (SLURM job 222)"),
        "{stderr}"
    );
    assert!(
        first.try_wait().unwrap().is_none(),
        "job 111's rank 0 waits on for its own rank 1"
    );
}

/// Outside SLURM nothing names a job, but a store whose ranks have all joined takes no more:
/// a rank started on a running job's port is refused at once, not left in its collectives
/// until dist_timeout.
#[test]
fn a_rank_too_many_on_a_running_jobs_port_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let rank = |rank: &str, job: &str| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tdmpc2"));
        command
            .args(tiny_train())
            .args(["steps=1000000", "dist_timeout=600"])
            .arg(format!("run_dir={}", dir.path().join(job).display()))
            .envs([
                ("RANK", rank),
                ("LOCAL_RANK", rank),
                ("WORLD_SIZE", "2"),
                ("LOCAL_WORLD_SIZE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
            ])
            .env("MASTER_PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    };
    let running = [
        common::Reaped::spawn(&mut rank("0", "running")),
        common::Reaped::spawn(&mut rank("1", "running")),
    ];
    let formed = wait_for_train_record(&dir.path().join("running"), 1, Duration::from_secs(240));
    let out = rank("1", "stray").stderr(Stdio::piped()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(formed, "the running job trains");
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("master_port={port}")) && stderr.contains("one too many"),
        "{stderr}"
    );
    drop(running);
}

#[test]
fn runs_under_torchrun() {
    let torchrun = Path::new(env!("TDMPC2_TEST_VENV_BIN")).join("torchrun");
    if !torchrun.is_file() {
        common::not_checked("runs under torchrun: the venv has no torchrun");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(torchrun)
        .args([
            "--no-python",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
        ])
        .arg(format!("--master_port={}", free_port()))
        .arg(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(tiny_train())
        .args([
            "steps=480".to_string(),
            "save_freq=480".into(),
            "eval_freq=480".into(),
        ])
        .arg(format!("run_dir={}", dir.path().display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta = meta(dir.path(), 480);
    assert_eq!(
        meta["world_size"], 2,
        "torchrun's WORLD_SIZE decides the ranks"
    );
    assert_eq!(meta["rank_checksums"].as_array().unwrap().len(), 2);
}

/// torchrun's agent killed (SIGKILL, the OOM killer) leaves no rank training unwatched: they
/// stop as on Ctrl-C, with a checkpoint, and are gone. A hangup it passes on (its terminal
/// closed) stays a stop with a checkpoint.
#[test]
fn ranks_die_with_a_killed_torchrun() {
    let torchrun = Path::new(env!("TDMPC2_TEST_VENV_BIN")).join("torchrun");
    if !torchrun.is_file() {
        common::not_checked("ranks die with a killed torchrun: the venv has no torchrun");
        return;
    }
    stops_with_a_checkpoint_when_torchrun(&torchrun, libc::SIGKILL);
    stops_with_a_checkpoint_when_torchrun(&torchrun, libc::SIGHUP);
}

/// Sends `signal` to torchrun once its two ranks train, and sees them gone after the stop's
/// checkpoint.
fn stops_with_a_checkpoint_when_torchrun(torchrun: &Path, signal: libc::c_int) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(torchrun)
        .args([
            "--no-python",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
        ])
        .arg(format!("--master_port={}", free_port()))
        .arg(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(tiny_train())
        .args([
            "steps=1000000".to_string(),
            "save_freq=480".into(),
            "eval_freq=1000000".into(),
        ])
        .arg(format!("run_dir={}", dir.path().display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let checkpoints = || -> Vec<String> {
        let found = std::fs::read_dir(dir.path().join("checkpoints"));
        let mut names: Vec<String> = found
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().join("meta.json").exists())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let waiting = Instant::now();
    while checkpoints().is_empty() && waiting.elapsed() < Duration::from_secs(300) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = checkpoints();
    assert!(!before.is_empty(), "training went as far as a checkpoint");
    // Past that checkpoint's loop pass, whose own stop would reuse it rather than write another.
    std::thread::sleep(Duration::from_secs(2));
    let ranks = children_of(child.id());
    assert_eq!(ranks.len(), 2, "torchrun's two workers: {ranks:?}");
    // SAFETY: a plain kill(2) of this test's own child.
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    child.wait().unwrap();
    let killed = Instant::now();
    let running = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| Some(!stat.rsplit_once(") ")?.1.starts_with('Z')))
            .unwrap_or(false)
    };
    while ranks.iter().any(running) && killed.elapsed() < Duration::from_secs(100) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !ranks.iter().any(running),
        "ranks {ranks:?} still run {:?} after torchrun got signal {signal}",
        killed.elapsed()
    );
    let after = checkpoints();
    let last_before = before.last().unwrap();
    assert!(
        after.last().is_some_and(|last| last > last_before),
        "signal {signal}: the stop's checkpoint, after {last_before}: {after:?}"
    );
}

/// The launcher of node `rank` of a two-node job on this machine (run directory `node<rank>`);
/// `extra` settings come last and win.
fn spawn_node(
    dir: &Path,
    port: u16,
    rank: usize,
    steps: u64,
    extra: &[&str],
) -> std::process::Child {
    node_command(dir, port, rank, steps, extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// [`spawn_node`]'s command.
fn node_command(dir: &Path, port: u16, rank: usize, steps: u64, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tdmpc2"));
    command
        .args(tiny_train())
        .args([
            "world_size=2".to_string(),
            "nnodes=2".into(),
            format!("node_rank={rank}"),
            "master_addr=127.0.0.1".into(),
            format!("master_port={port}"),
            format!("steps={steps}"),
            format!("save_freq={steps}"),
            format!("eval_freq={steps}"),
            format!("run_dir={}", dir.join(format!("node{rank}")).display()),
        ])
        .args(extra);
    command
}

#[test]
fn two_nodes_on_one_machine() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // 200 seed steps a rank, the pretraining updates and 40 more.
    let node = |rank: usize| spawn_node(dir.path(), port, rank, 480, &[]);
    let (first, second) = (node(0), node(1));
    for child in [first, second] {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Rank 0 (node 0) writes the checkpoints, with both ranks' checksums.
    let meta = meta(&dir.path().join("node0"), 480);
    let checksums = meta["rank_checksums"].as_array().unwrap().clone();
    assert_eq!(checksums.len(), 2);
    assert_eq!(checksums[0], checksums[1]);
    assert!(
        !dir.path().join("node1").join("checkpoints").exists(),
        "only rank 0 writes checkpoints"
    );
}

/// A node given other settings than node 0's (here `lr`, which would let the learners drift
/// apart unseen until a checkpoint) is refused as it joins, naming each difference; its own
/// paths are its own.
#[test]
fn a_node_with_other_settings_is_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // Node 0 would wait for node 1 until dist_timeout, were it not told of the refusal.
    let first = spawn_node(dir.path(), port, 0, 480, &["dist_timeout=600"]);
    let extra = ["dist_timeout=600", "lr=0.001", "horizon=2"];
    let second = spawn_node(dir.path(), port, 1, 480, &extra);
    let started = Instant::now();
    let (first, out) = (
        first.wait_with_output().unwrap(),
        second.wait_with_output().unwrap(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("horizon: 3 → 2, lr: 0.0003 → 0.001"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("run_dir"),
        "each node's paths are its own: {stderr}"
    );
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert_eq!(first.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "node 1 went away: its launcher came and was refused the job: its \
                         settings differ from this node's (node 0's → node 1's): horizon: 3 → 2, \
                         lr: 0.0003 → 0.001"
        ),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(120), "{stderr}");
}

#[test]
fn sigterm_stops_every_rank_after_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let child = spawn_endless_two_rank_run(dir.path(), Stdio::null());
    // Stop once training is under way (start-up is slow on a loaded machine).
    let metrics = dir.path().join("metrics.jsonl");
    let waiting = Instant::now();
    while !metrics.exists() && waiting.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    let stopped = Instant::now();
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "a requested stop: {stderr}");
    assert!(stderr.contains("terminated (SIGTERM)"), "{stderr}");
    assert!(
        stopped.elapsed() < Duration::from_secs(60),
        "stopped within a bounded time"
    );
    let (step, latest) =
        tdmpc2::checkpoint::store::latest(&dir.path().join("checkpoints")).expect("a checkpoint");
    // The stop may land during the first evaluation: then the checkpoint is the one of step 0.
    assert_eq!(meta(dir.path(), step)["global_step"], step);
    assert!(latest.join("model.safetensors").is_file());
}

/// Under `srun --kill-on-bad-exit` (the sbatch's) or torchrun, the first rank to exit ends the
/// others: a rank that left a stop (exit 3) before rank 0 had written the checkpoint the stop
/// promises would take that write with it. Here the ranks run as a launcher's tasks (its
/// variables set, no launcher of ours), and the first to exit has the other killed at once.
#[test]
fn no_rank_leaves_a_stop_before_rank_0_wrote_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    // Each rank's log in a file: a pipe nobody reads while it runs could fill and block it.
    let log = |rank: usize| dir.path().join(format!("rank{rank}.log"));
    let mut ranks: Vec<std::process::Child> = (0..2)
        .map(|rank: usize| {
            Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
                .args(tiny_train())
                // The official size: a checkpoint rank 0 takes a while to write.
                .args(["model_size=5", "steps=1000000", "save_freq=1000000"])
                .arg("eval_freq=1000000")
                .arg(format!("run_dir={}", dir.path().display()))
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(log(rank)).unwrap())
                .spawn()
                .unwrap()
        })
        .collect();
    // Into training: the first episodes (200 steps a rank) have ended.
    let trained = wait_for_train_record(dir.path(), 400, Duration::from_secs(240));
    for rank in &ranks {
        Command::new("kill")
            .args(["-TERM", &rank.id().to_string()])
            .status()
            .unwrap();
    }
    let stopping = Instant::now();
    let first = loop {
        if let Some(i) = (0..2).find(|&i| ranks[i].try_wait().unwrap().is_some()) {
            break Some(i);
        }
        if stopping.elapsed() > Duration::from_secs(120) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    // As srun --kill-on-bad-exit: the first rank's exit ends the other at once.
    for (i, rank) in ranks.iter_mut().enumerate() {
        if first != Some(i) {
            let _ = rank.kill();
        }
    }
    let first = first.expect("no rank ended within 120 s of the stop");
    let status = ranks[first].wait().unwrap();
    for rank in &mut ranks {
        let _ = rank.wait();
    }
    let stderr = std::fs::read_to_string(log(first)).unwrap();
    assert!(trained, "no episode ended: {stderr}");
    assert_eq!(status.code(), Some(3), "a requested stop: {stderr}");
    let stopped = stderr
        .lines()
        .rfind(|l| l.starts_with("stopped "))
        .unwrap_or("");
    let step: u64 = stopped
        .split(" at step ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.trim().replace(',', "").parse().ok())
        .unwrap_or_else(|| panic!("no stop step in: {stderr}"));
    let (latest, _) =
        tdmpc2::checkpoint::store::latest(&dir.path().join("checkpoints")).expect("a checkpoint");
    assert_eq!(
        latest, step,
        "rank {first} left the stop at step {step} before its checkpoint was written"
    );
}

#[test]
fn lr_scale_and_warmup_set_the_optimiser_rates() {
    let single = ProcessGroup::alone(RankInfo::single(&config(B, 1)));
    let mut scaled = config(B, 1);
    scaled.world_size = 4;
    scaled.lr_scale = "sqrt".into();
    scaled.lr_warmup_steps = 10;
    let mut learner = learner(&scaled, &single);
    let lrs = |l: &Learner| l.updater().model_optim.learning_rates();
    let expected = scaled.lr * 2.0; // sqrt(world_size 4 × sync_freq 1)
    assert_eq!(
        lrs(&learner),
        vec![expected * scaled.enc_lr_scale, expected]
    );
    assert_eq!(
        learner.updater().policy_optim.learning_rates(),
        vec![expected]
    );

    let batch = part(&union_batch(1), 0);
    // This update draws from torch's global generator: keep other tests' seeded draws whole.
    let _lock = rng_lock();
    learner.update_on(&[batch]).unwrap();
    let warm = lrs(&learner);
    assert!(
        (warm[1] - expected / 10.0).abs() < 1e-12,
        "first of 10 warm-up steps: {warm:?}"
    );
    assert!((learner.updater().policy_optim.learning_rates()[0] - expected / 10.0).abs() < 1e-12);
}

#[test]
fn a_checkpoint_moves_between_world_sizes() {
    // Resuming checks the loaded learner state against the checksum saved with it, so a run
    // that goes on at another world size started from exactly the saved state. The saved replay
    // buffers (one 200-step episode, 201 rows, per 200 steps a rank) are dealt out to the new
    // ranks: (filled rows, episodes) of each rank's buffer at the end.
    // From 1 rank to 2 with seed_steps=300, the checkpoint's 400 steps are each new rank's
    // 200: below seed_steps, yet the learner is trained, so the new ranks learn at once.
    for (from, to, seed_steps, buffers) in [
        (2usize, 1usize, 200, [(800, 4)].as_slice()),
        (1, 2, 300, &[(400, 2); 2]),
    ] {
        let seed_steps = format!("seed_steps={seed_steps}");
        let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
            .args(tiny_train())
            .args([
                format!("world_size={from}"),
                "steps=480".into(),
                seed_steps.clone(),
                "save_freq=400".into(),
                "eval_freq=400".into(),
                "save_buffer=true".into(),
                format!("master_port={}", free_port()),
                format!("run_dir={}", first.path().display()),
            ])
            .env("NCCL_DEBUG", "WARN")
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{from} ranks: {log}");
        if from > 1 {
            assert!(
                log.contains("collectives: gloo; settings: NCCL_DEBUG=WARN"),
                "rank 0 names the backend settings: {log}"
            );
        }
        let saved = first.path().join("checkpoints").join("step_000000000400");
        // Pinning off: a TDMPC2_CPUS inherited by the launcher does not reach the ranks.
        let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
            .args(tiny_train())
            .args([
                format!("world_size={to}"),
                "steps=800".into(),
                seed_steps.clone(),
                "save_freq=200".into(),
                "keep_checkpoints=1".into(),
                "eval_freq=800".into(),
                "save_buffer=true".into(),
                format!("resume={}", saved.display()),
                format!("master_port={}", free_port()),
                format!("run_dir={}", second.path().display()),
                "cpu_affinity=false".into(),
            ])
            .env("TDMPC2_CPUS", "0")
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{from} → {to} ranks: {log}");
        assert!(log.contains("Resumed from"), "{log}");
        assert!(
            !log.contains("CPU affinity") && !log.contains("pinned"),
            "{log}"
        );
        assert!(
            log.contains(&format!(
                "saved by {from} ranks are dealt out to this run's {to}"
            )),
            "{log}"
        );
        // Each rank's oldest episode is a saved one of its own (no episode dealt twice).
        let mut oldest = Vec::new();
        for (rank, &(filled, episodes)) in buffers.iter().enumerate() {
            let dir = second
                .path()
                .join(format!("buffers/rank{rank}/step_000000000800"));
            let meta: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join("buffer.json")).unwrap()).unwrap();
            let held = (
                meta["filled"].as_u64(),
                meta["episodes"].as_array().map(Vec::len),
            );
            assert_eq!(
                held,
                (Some(filled), Some(episodes)),
                "rank {rank} of {to}: {meta}"
            );
            let start = meta["episodes"][0]["start"].as_i64().unwrap();
            let tensors = Tensor::read_safetensors(dir.join("buffer.safetensors")).unwrap();
            let obs = &tensors.iter().find(|(name, _)| name == "obs").unwrap().1;
            oldest.push(Vec::<f32>::try_from(obs.get(start)).unwrap());
        }
        oldest.dedup();
        assert_eq!(oldest.len(), to, "{oldest:?}");
        // keep_checkpoints=1: what was written before step 800 (at 600 by one rank) is gone.
        let dirs = (0..to).map(|rank| format!("buffers/rank{rank}"));
        for dir in dirs.chain(["checkpoints".to_string()]) {
            let names: Vec<String> = std::fs::read_dir(second.path().join(&dir))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(names, ["step_000000000800"], "{dir} of {to} ranks");
        }
        let end = meta(second.path(), 800);
        let checksums = end["rank_checksums"].as_array().unwrap();
        assert_eq!(checksums.len(), to);
        assert!(
            checksums.iter().all(|c| c == &checksums[0]),
            "{checksums:?}"
        );
        assert_ne!(
            checksums[0],
            meta(first.path(), 400)["rank_checksums"][0],
            "the resumed run trained on"
        );
        // A trained learner makes one update a local step from the first on, none at random.
        let updates = |m: &serde_json::Value| m["model_optim_step"].as_u64().unwrap();
        let saved = updates(&meta(first.path(), 400));
        if from < to {
            assert!(
                saved > 0,
                "{from} → {to} ranks: the saved learner was trained"
            );
            let made = updates(&end) - saved;
            assert_eq!(
                made,
                800 / to as u64 - 400 / to as u64,
                "{from} → {to} ranks"
            );
        }
    }
}

#[test]
fn a_damaged_checkpoint_is_refused_on_resume() {
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let out = launcher(&[
        "steps=300".into(),
        "save_freq=300".into(),
        "eval_freq=300".into(),
        format!("run_dir={}", first.path().display()),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let saved = first.path().join("checkpoints").join("step_000000000300");
    // Same shapes, different values: loads without a shape error, yet is not what was saved.
    let state = saved.join("state.safetensors");
    let tensors: Vec<(String, Tensor)> = Tensor::read_safetensors(&state)
        .unwrap()
        .into_iter()
        .map(|(n, t)| if n == "scale" { (n, t + 1.0) } else { (n, t) })
        .collect();
    Tensor::write_safetensors(&tensors, &state).unwrap();
    let out = launcher(&[
        "steps=600".into(),
        format!("resume={}", saved.display()),
        format!("run_dir={}", second.path().display()),
    ]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "refused input: {log}");
    assert!(
        log.contains(&format!("{} is damaged", state.display())),
        "the changed file is named: {log}"
    );
}

/// Whether `pid` is still a running process (a zombie is not).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit(')').next().map(|s| s.trim_start().to_owned()))
        .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// Waits until the run's metrics hold a train record at `step` or later.
fn wait_for_train_record(run_dir: &Path, step: u64, limit: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        let text = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap_or_default();
        let reached = text.lines().any(|line| {
            serde_json::from_str::<serde_json::Value>(line).is_ok_and(|record| {
                record["phase"] == "train" && record["step"].as_u64().unwrap_or(0) >= step
            })
        });
        if reached {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

#[test]
fn ranks_die_with_a_killed_launcher() {
    let dir = tempfile::tempdir().unwrap();
    // An orphan's grace is the run's stop_grace.
    let mut launcher =
        spawn_endless_two_rank_run_with(dir.path(), Stdio::null(), &["stop_grace=30"]);
    // Into training, past the pretraining (200 seed steps per rank, then an episode).
    let trained = wait_for_train_record(dir.path(), 800, Duration::from_secs(240));
    let ranks = children_of(launcher.id());
    if !trained || ranks.len() != 2 {
        let _ = launcher.kill();
        for &pid in &ranks {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
    assert!(trained, "the run reached training");
    assert_eq!(ranks.len(), 2, "the launcher runs two ranks");
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let killed = Instant::now();
    // Within their orphan grace (stop_grace, 30 s: they stop at the next step and checkpoint,
    // slowly on a loaded machine), not training on.
    while ranks.iter().any(|&pid| running(pid)) && killed.elapsed() < Duration::from_secs(40) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let alive: Vec<u32> = ranks.into_iter().filter(|&pid| running(pid)).collect();
    for &pid in &alive {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(
        alive.is_empty(),
        "ranks {alive:?} outlived their launcher by 40 s"
    );
    // They stopped as on Ctrl-C, with a checkpoint (the run saves nothing else this early).
    let saved = std::fs::read_dir(dir.path().join("checkpoints"))
        .map(|entries| entries.flatten().count())
        .unwrap_or(0);
    assert!(saved > 0, "a checkpoint was written when the launcher died");
}

#[test]
fn a_node_whose_launcher_dies_stops_the_job_and_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (first, mut second) = (
        spawn_node(dir.path(), port, 0, 1_000_000, &[]),
        spawn_node(dir.path(), port, 1, 1_000_000, &[]),
    );
    let node0 = dir.path().join("node0");
    let trained = wait_for_train_record(&node0, 800, Duration::from_secs(240));
    second.kill().unwrap();
    second.wait().unwrap();
    let killed = Instant::now();
    let out = first.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(trained, "the job reached training: {stderr}");
    assert!(
        killed.elapsed() < Duration::from_secs(30),
        "node 0 noticed in {:?}",
        killed.elapsed()
    );
    assert_eq!(out.status.code(), Some(3), "a requested stop: {stderr}");
    assert!(
        stderr.contains("node 1 was stopped or killed"),
        "names the node: {stderr}"
    );
    let saved = std::fs::read_dir(node0.join("checkpoints"))
        .map(|entries| entries.flatten().count())
        .unwrap_or(0);
    assert!(saved > 0, "node 0 wrote a checkpoint: {stderr}");
}

/// Ctrl-C on one node while the job still forms stops the other nodes' ranks too, at once:
/// they would wait `dist_timeout` for ranks that never come.
#[test]
fn a_node_stopped_while_the_job_forms_stops_the_others_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let extra = ["dist_timeout=600"];
    let first_stderr = dir.path().join("node0.stderr");
    let mut first = common::Reaped::spawn(
        node_command(dir.path(), port, 0, 1_000_000, &extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&first_stderr).unwrap()),
    );
    // Node 0's rank waits for node 1's, which is stopped as soon as it exists (long before it
    // can have started up and met node 0's).
    let node_0_said = || std::fs::read_to_string(&first_stderr).unwrap_or_default();
    let started = Instant::now();
    while !node_0_said().contains("rank 0: waiting") && started.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let second = common::Reaped::spawn(
        node_command(dir.path(), port, 1, 1_000_000, &extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let spawned = Instant::now();
    while common::children_of(second.id()).is_empty() && spawned.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: SIGINT to this test's own child, as a terminal's Ctrl-C.
    unsafe { libc::kill(second.id() as libc::pid_t, libc::SIGINT) };
    let asked = Instant::now();
    // Node 0 ends within the limit, or is killed (and the test fails) rather than left waiting.
    while first.try_wait().unwrap().is_none() && asked.elapsed() < Duration::from_secs(90) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = asked.elapsed();
    let _ = first.kill();
    let first = first.wait_with_output().unwrap();
    let stderr = node_0_said();
    assert!(stderr.contains("rank 0: waiting"), "{stderr}");
    assert!(
        took < Duration::from_secs(60),
        "node 0 ended after {took:?}: {stderr}"
    );
    assert_eq!(first.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("node 1 was asked to stop; stopping this node's ranks"),
        "{stderr}"
    );
    let second = second.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(3), "{stderr}");
}

/// A node stopped as asked (Ctrl-C) while another node's rank fails takes no part in a
/// restart, so the other node makes none either: it would wait `dist_timeout` for ranks that
/// never come. It ends as a stop, naming the node.
#[test]
fn a_node_stopped_while_another_fails_leaves_no_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let extra = ["max_restarts=1", "dist_timeout=600"];
    let (first, second) = (
        spawn_node(dir.path(), port, 0, 1_000_000, &extra),
        spawn_node(dir.path(), port, 1, 1_000_000, &extra),
    );
    let trained = wait_for_train_record(&dir.path().join("node0"), 800, Duration::from_secs(240));
    // SAFETY: SIGINT to this test's own child, as a terminal's Ctrl-C.
    unsafe { libc::kill(second.id() as libc::pid_t, libc::SIGINT) };
    let killed = kill_rank(first.id(), 0);
    let stopped = Instant::now();
    let (first, second) = (
        first.wait_with_output().unwrap(),
        second.wait_with_output().unwrap(),
    );
    let took = stopped.elapsed();
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(
        trained && killed,
        "the job trained and lost rank 0: {stderr}"
    );
    assert!(
        took < Duration::from_secs(120),
        "ended in {took:?}: {stderr}"
    );
    assert_eq!(first.status.code(), Some(3), "{stderr}");
    // Named however node 0 heard of the stop: from node 1's launcher, before rank 0's death (a
    // stop during which a rank failed) or after (a failure that no restart follows), or only
    // from its own rank's stop line, when rank 0 died before node 1's launcher was heard.
    assert!(
        stderr.contains("node 1 stopped (Ctrl-C or SIGTERM there, or its ranks stopped as asked)")
            || stderr.contains("as rank 1 (node 1) got Ctrl-C, SIGTERM or a hangup"),
        "{stderr}"
    );
    assert!(!stderr.contains("restarting every rank"), "{stderr}");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(3), "{stderr}");
}

#[test]
fn a_failed_job_restarts_from_its_last_checkpoint_with_max_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(tiny_train())
        .args([
            "world_size=2".to_string(),
            "steps=1200".into(),
            "save_freq=400".into(),
            "eval_freq=1200".into(),
            "max_restarts=1".into(),
            format!("master_port={}", free_port()),
            format!("run_dir={}", dir.path().display()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first checkpoint, when seeding ends; 400 more steps a rank leave time for the kill.
    let first_checkpoint = dir.path().join("checkpoints").join("step_000000000400");
    let waiting = Instant::now();
    while !first_checkpoint.join("meta.json").exists()
        && waiting.elapsed() < Duration::from_secs(300)
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    let killed = kill_rank(child.id(), 1);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(killed, "found rank 1's process: {stderr}");
    assert!(out.status.success(), "the restarted job finished: {stderr}");
    assert!(stderr.contains("rank 1 failed"), "{stderr}");
    assert!(stderr.contains("restart 1 of 1"), "{stderr}");
    assert!(stderr.contains("Resumed from"), "{stderr}");
    let end = meta(dir.path(), 1200);
    let checksums = end["rank_checksums"].as_array().unwrap();
    assert_eq!(checksums.len(), 2);
    assert_eq!(checksums[0], checksums[1]);
}

/// The pid of rank `rank`'s process under the launcher `launcher`.
fn rank_pid(launcher: u32, rank: usize) -> Option<u32> {
    let wanted = format!("RANK={rank}");
    children_of(launcher).into_iter().find(|pid| {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        environ.split(|b| *b == 0).any(|kv| kv == wanted.as_bytes())
    })
}

/// Stops (SIGSTOP) the environment worker of rank `rank` once the run has one: alive but
/// silent, as a worker whose renderer hangs. Returns its pid.
fn silence_env_worker(launcher: u32, rank: usize, ready: impl Fn() -> bool) -> Option<u32> {
    let waiting = Instant::now();
    let running = || {
        let stat = std::fs::read_to_string(format!("/proc/{launcher}/stat")).unwrap_or_default();
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    };
    while waiting.elapsed() < Duration::from_secs(300) && running() {
        let worker = rank_pid(launcher, rank).and_then(|pid| {
            children_of(pid).into_iter().find(|child| {
                std::fs::read(format!("/proc/{child}/cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == b"env-worker"))
            })
        });
        if let Some(worker) = worker.filter(|_| ready()) {
            // SAFETY: a plain kill(2) of a process of this test's run.
            return (unsafe { libc::kill(worker as i32, libc::SIGSTOP) } == 0).then_some(worker);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

fn silent_worker_run(dir: &Path, extra: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(tiny_train())
        .args([
            "task=gym:Pendulum-v1",
            "num_envs=2",
            "env_workers=1",
            "world_size=2",
            "seed_steps=400",
        ])
        .args(extra)
        .args([
            format!("master_port={}", free_port()),
            format!("run_dir={}", dir.display()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A worker that stops answering ends its rank within `env_timeout`, named (rank, envs, task,
/// what it was asked) and killed; the launcher stops the other rank (which would otherwise wait
/// at its next collective for `dist_timeout`, naming no worker).
#[test]
fn a_silent_environment_worker_fails_its_rank_within_env_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let extra = [
        "steps=100000",
        "save_freq=800",
        "dist_timeout=600",
        // Also the workers' first answer (Python starting): loose for a loaded machine.
        "env_timeout=15",
    ];
    let child = silent_worker_run(dir.path(), &extra);
    let training = dir.path().join("checkpoints").join("step_000000000800");
    let worker = silence_env_worker(child.id(), 1, || training.join("meta.json").exists());
    let silenced = Instant::now();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let worker = worker.unwrap_or_else(|| panic!("found rank 1's env worker: {stderr}"));
    // Rank 1 may first finish its pretraining updates (without the worker), then waits
    // env_timeout.
    assert!(
        silenced.elapsed() < Duration::from_secs(120),
        "stopped after {:?}: {stderr}",
        silenced.elapsed()
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let named = |call: &str| {
        format!(
            "rank 1: the environment worker (pid {worker}) running `gym:Pendulum-v1` envs 0-1 \
             did not answer `{call}` within 15 s (env_timeout) and was killed"
        )
    };
    // Step 800 ends an episode on every environment: the worker is silenced before the
    // `reset` that follows or the `step` after it, whichever the signal lands before.
    assert!(
        stderr.contains(&named("step")) || stderr.contains(&named("reset")),
        "{stderr}"
    );
    assert!(stderr.contains("rank 1 failed"), "{stderr}");
    let state = std::fs::read_to_string(format!("/proc/{worker}/stat")).unwrap_or_default();
    assert!(state.is_empty(), "the silent worker is gone: {state}");
}

/// A stop while a worker hangs gives the worker up after the stop's patience, not after
/// `env_timeout` (past the launcher's `stop_grace`, which would kill the rank): the run stops
/// with its checkpoint, exit 3.
#[test]
fn a_stop_gives_a_hung_worker_up_and_keeps_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let extra = [
        "steps=100000",
        "save_freq=800",
        "dist_timeout=600",
        "env_timeout=500",
        "stop_grace=120",
    ];
    let child = silent_worker_run(dir.path(), &extra);
    // Past pretraining (at step 800), which waits for no worker.
    let checkpoint = dir.path().join("checkpoints").join("step_000000001600");
    let worker = silence_env_worker(child.id(), 1, || checkpoint.join("meta.json").exists());
    // Rank 1 waits for its worker from its next reset or step on (within a second, unless
    // the machine stalls it; the stop's patience is far longer).
    std::thread::sleep(Duration::from_secs(4));
    let asked = Instant::now();
    // SAFETY: SIGINT to this test's own child, as a terminal's Ctrl-C.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let worker = worker.unwrap_or_else(|| panic!("found rank 1's env worker: {stderr}"));
    assert!(
        asked.elapsed() < Duration::from_secs(100),
        "stopped after {:?}: {stderr}",
        asked.elapsed()
    );
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let given_up = |call: &str| {
        stderr.contains(&format!(
            "rank 1: the environment worker (pid {worker}) running `gym:Pendulum-v1` envs 0-1 \
             did not answer `{call}` within 10 s of the stop and was killed"
        ))
    };
    assert!(given_up("step") || given_up("reset"), "{stderr}");
    assert!(stderr.contains("checkpoint written"), "{stderr}");
    assert!(checkpoint.join("meta.json").exists());
    let state = std::fs::read_to_string(format!("/proc/{worker}/stat")).unwrap_or_default();
    assert!(state.is_empty(), "the hung worker is gone: {state}");
}

/// With `max_restarts`, a run whose worker stops answering restarts from its last checkpoint
/// with fresh workers and finishes.
#[test]
fn a_silent_environment_worker_is_restarted_from_the_last_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let extra = [
        "steps=1600",
        "save_freq=800",
        "eval_freq=1600",
        "max_restarts=1",
        // Loose: the restarted workers' first answers (Python starting anew) must not time out
        // on a loaded machine.
        "env_timeout=20",
    ];
    let child = silent_worker_run(dir.path(), &extra);
    let first_checkpoint = dir.path().join("checkpoints").join("step_000000000800");
    let worker = silence_env_worker(child.id(), 1, || {
        first_checkpoint.join("meta.json").exists()
    });
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(worker.is_some(), "found rank 1's env worker: {stderr}");
    assert!(out.status.success(), "the restarted job finished: {stderr}");
    // As above: silenced before the `reset` after step 800 or the `step` after it.
    let silent_at = |call: &str| stderr.contains(&format!("did not answer `{call}` within 20 s"));
    assert!(silent_at("step") || silent_at("reset"), "{stderr}");
    assert!(stderr.contains("restart 1 of 1"), "{stderr}");
    assert!(stderr.contains("Resumed from"), "{stderr}");
    let checksums = meta(dir.path(), 1600)["rank_checksums"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(checksums.len(), 2);
    assert_eq!(checksums[0], checksums[1]);
}

#[test]
fn inside_one_slurm_task_world_size_needs_the_builtin_launcher() {
    let dir = tempfile::tempdir().unwrap();
    let slurm = [
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "1"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_STEP_ID", "0"),
    ];
    let run = |launcher: &str| {
        Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
            .args(tiny_train())
            .args([
                "world_size=2".to_string(),
                "steps=800".into(),
                "eval_freq=800".into(),
                format!("launcher={launcher}"),
                format!("master_port={}", free_port()),
                format!("run_dir={}", dir.path().display()),
            ])
            .envs(slurm)
            .output()
            .unwrap()
    };
    let out = run("auto");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("world_size=2 disagrees with SLURM") && stderr.contains("launcher=builtin"),
        "{stderr}"
    );
    let out = run("builtin");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let checksums = meta(dir.path(), 800)["rank_checksums"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(checksums.len(), 2, "two ranks trained");
}

#[test]
fn a_node_that_freezes_is_noticed_within_peer_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let quick = ["peer_timeout=5"];
    let (first, second) = (
        spawn_node(dir.path(), port, 0, 1_000_000, &quick),
        spawn_node(dir.path(), port, 1, 1_000_000, &quick),
    );
    let trained = wait_for_train_record(&dir.path().join("node0"), 800, Duration::from_secs(240));
    // Node 1 freezes with its connections open, as a hung host or a cut network leaves them:
    // nothing tells node 0, whose ranks wait in a collective.
    let frozen: Vec<u32> = std::iter::once(second.id())
        .chain(children_of(second.id()))
        .collect();
    let signal_all = |signal: &str| {
        for pid in &frozen {
            let _ = Command::new("kill")
                .args([signal, &pid.to_string()])
                .status();
        }
    };
    signal_all("-STOP");
    let frozen_at = Instant::now();
    let out = first.wait_with_output().unwrap();
    let noticed = frozen_at.elapsed();
    signal_all("-KILL");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(trained, "the job reached training: {stderr}");
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("node 1 went away: its launcher sent no heartbeat"),
        "names the node: {stderr}"
    );
    assert!(
        noticed < Duration::from_secs(40),
        "noticed after {noticed:?}, dist_timeout is 300 s"
    );
}

/// Ctrl-Z, `kill -STOP` of a job and a scheduler's suspension stop every process of a node at
/// once, for as long as they like: after the continue the job trains on. Here both nodes (each
/// launcher's process group: its rank and the rank's environment worker) stop twice for
/// longer than `env_timeout`, `dist_timeout` and `peer_timeout`, whose clocks run on meanwhile,
/// and continue a second apart.
#[test]
fn a_job_stopped_longer_than_its_timeouts_trains_on_after_it_continues() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let limits = [
        "task=gym:Pendulum-v1",
        "num_envs=2",
        "env_workers=1",
        "seed_steps=400",
        // Loose enough for six processes starting Python on a loaded machine; the stops below
        // outlast them all.
        "env_timeout=20",
        "dist_timeout=20",
        "peer_timeout=10",
    ];
    let log = |rank: usize| dir.path().join(format!("node{rank}.log"));
    let nodes: Vec<common::Reaped> = (0..2)
        .map(|rank| {
            common::Reaped::spawn(
                node_command(dir.path(), port, rank, 1_000_000, &limits)
                    .process_group(0)
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(log(rank)).unwrap()),
            )
        })
        .collect();
    let run_dir = dir.path().join("node0");
    let said = |rank: usize| std::fs::read_to_string(log(rank)).unwrap_or_default();
    let trained = wait_for_train_record(&run_dir, 1600, Duration::from_secs(240));
    assert!(trained, "the job reached training: {}{}", said(0), said(1));
    // A moment between the nodes, as a scheduler resumes one node after another: the first
    // node's waits on the second go on after its continue.
    let signal_nodes = |signal: libc::c_int, between: Duration| {
        for node in &nodes {
            // SAFETY: kill(2) of the process group this test started.
            unsafe { libc::kill(-(node.id() as i32), signal) };
            std::thread::sleep(between);
        }
    };
    for _ in 0..2 {
        signal_nodes(libc::SIGSTOP, Duration::ZERO);
        std::thread::sleep(Duration::from_secs(30));
        signal_nodes(libc::SIGCONT, Duration::from_secs(1));
        std::thread::sleep(Duration::from_secs(2));
    }
    let continued_at = last_train_step(&run_dir);
    let trains_on = wait_for_train_record(&run_dir, continued_at + 800, Duration::from_secs(120));
    signal_nodes(libc::SIGTERM, Duration::ZERO);
    for (rank, node) in nodes.into_iter().enumerate() {
        let status = node.wait_with_output().unwrap().status;
        assert_eq!(status.code(), Some(3), "a requested stop: {}", said(rank));
    }
    assert!(
        trains_on,
        "trained on after step {continued_at}: {}{}",
        said(0),
        said(1)
    );
    for rank in 0..2 {
        for timed_out in [
            "went away",
            "did not answer",
            "while the job ran",
            "timed out",
        ] {
            assert!(!said(rank).contains(timed_out), "{}", said(rank));
        }
    }
}

/// A rank alive but stopped (SIGSTOP: a hung process, a frozen host) fails the others'
/// collective after `dist_timeout`, named; gloo's own limit is out of reach, so the ranks hold
/// their collectives to it themselves.
#[test]
fn a_collective_waiting_on_a_stopped_rank_fails_after_dist_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let limits = ["dist_timeout=15", "peer_timeout=5", "env_timeout=10"];
    let launcher = spawn_endless_two_rank_run_with(dir.path(), Stdio::null(), &limits);
    let trained = wait_for_train_record(dir.path(), 400, Duration::from_secs(240));
    let rank_1 = rank_pid(launcher.id(), 1).expect("rank 1 runs");
    // SAFETY: kill(2) of a rank of this test's run.
    unsafe { libc::kill(rank_1 as i32, libc::SIGSTOP) };
    let stopped = Instant::now();
    let out = launcher.wait_with_output().unwrap();
    let failed_after = stopped.elapsed();
    // SAFETY: as above; the launcher killed it, if not, this does.
    unsafe { libc::kill(rank_1 as i32, libc::SIGKILL) };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(trained, "{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("waited 15 s for the other ranks while the job ran (dist_timeout)"),
        "{stderr}"
    );
    assert!(failed_after < Duration::from_secs(90), "{failed_after:?}");
}

/// The step of the run's last train record (0 before the first).
fn last_train_step(run_dir: &Path) -> u64 {
    let text = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|record| record["phase"] == "train")
        .filter_map(|record| record["step"].as_u64())
        .max()
        .unwrap_or(0)
}

/// Node 1 keeps no copy of node 0's run directory: its restarted rank takes rank 0's state.
#[test]
fn a_two_node_job_restarts_from_rank_zeros_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let extra = ["max_restarts=1", "save_freq=400", "eval_freq=1200"];
    let (first, second) = (
        spawn_node(dir.path(), port, 0, 1200, &extra),
        spawn_node(dir.path(), port, 1, 1200, &extra),
    );
    let node0 = dir.path().join("node0");
    let saved = node0.join("checkpoints").join("step_000000000400");
    let waiting = Instant::now();
    while !saved.join("meta.json").exists() && waiting.elapsed() < Duration::from_secs(300) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let killed = kill_rank(second.id(), 1);
    let (out0, out1) = (
        first.wait_with_output().unwrap(),
        second.wait_with_output().unwrap(),
    );
    let (log0, log1) = (
        String::from_utf8_lossy(&out0.stderr),
        String::from_utf8_lossy(&out1.stderr),
    );
    assert!(killed, "found rank 1's process: {log1}");
    assert!(out0.status.success(), "node 0: {log0}");
    assert!(out1.status.success(), "node 1: {log1}");
    assert!(log1.contains("restart 1 of 1"), "{log1}");
    assert!(log0.contains("Resumed from"), "{log0}");
    let end = meta(&node0, 1200);
    let checksums = end["rank_checksums"].as_array().unwrap();
    assert_eq!(checksums.len(), 2);
    assert_eq!(checksums[0], checksums[1]);
}
