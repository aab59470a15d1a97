//! Checkpoint integrity and run safety through the real binary:
//! - a checkpoint written by two ranks (one thread each) resumes on one rank (two threads);
//! - Ctrl-C during the seed-data pretraining stops within seconds with a checkpoint, and the
//!   resumed run makes only the pretraining updates that were left;
//! - SIGTERM during a long evaluation stops between two of its steps, with a checkpoint;
//! - a second run on the same run directory is refused; a stale lock is taken over;
//! - `eval` refuses damaged weights, naming the file, and takes any file of a checkpoint;
//! - a finished run's directory takes only a resume, to at least its step; `eval` refuses what
//!   it cannot play, naming the setting.
mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{checkpoint, free_port, TINY};

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

fn meta(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap()
}

/// Polls `ready` until it holds or `limit` has passed.
fn wait_until(limit: Duration, ready: impl Fn() -> bool) {
    let start = Instant::now();
    while !ready() && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_two_rank_checkpoint_resumes_on_one_rank_with_more_threads() {
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let quick = ["eval_freq=1000000", "eval_episodes=1"];
    // 400 steps per rank: an episode (200) fits in the buffer that the run length bounds.
    let mut extra = args(&["world_size=2", "steps=800"]);
    extra.extend(args(&quick));
    extra.push(format!("master_port={}", free_port()));
    assert_ok(&run("train", first.path(), &extra));
    let saved = checkpoint(first.path(), 800);
    let checksums = meta(&saved)["rank_checksums"].as_array().unwrap().clone();
    assert_eq!(checksums.len(), 2);
    assert!(
        checksums[0].is_u64(),
        "an exact integer checksum: {checksums:?}"
    );

    // One rank now runs with every core's threads: the state sums differently, hashes the same.
    let mut extra = args(&["world_size=1", "steps=1000"]);
    extra.extend(args(&quick));
    extra.push(format!("resume={}", saved.display()));
    let stderr = assert_ok(&run("train", second.path(), &extra));
    assert!(stderr.contains("Resumed from"), "{stderr}");
    assert!(checkpoint(second.path(), 1000).join("meta.json").is_file());
}

/// A spawned run whose stderr is read line by line on a thread (and kept).
struct Watched {
    child: common::Reaped,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Watched {
    fn spawn(mut command: Command) -> Watched {
        let mut child = common::Reaped::spawn(command.stdout(Stdio::null()).stderr(Stdio::piped()));
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watched {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `text`; returns it.
    fn wait_for(&mut self, text: &str, limit: Duration) -> String {
        let start = Instant::now();
        while start.elapsed() < limit {
            match self.lines.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(text) {
                        return line;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(_) => break,
            }
        }
        let _ = self.child.kill();
        panic!("no line with {text:?}: {}", self.seen.join("\n"));
    }

    fn signal(&self, name: &str) {
        send(self.child.id(), name);
    }

    /// Waits for the exit (at most `limit`); returns the status and every stderr line.
    fn finish(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                panic!("still running {limit:?} later: {}", self.seen.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.seen.push(line);
        }
        (status, self.seen.join("\n"))
    }
}

/// A rank that cannot write its replay buffer fails the checkpoint on every rank, and the
/// buffers the others wrote for it are removed: no checkpoint will need them, and a restart
/// on a full disk would miss the space.
#[test]
fn a_checkpoint_that_fails_on_one_rank_leaves_no_buffers_behind() {
    let dir = tempfile::tempdir().unwrap();
    let buffers = dir.path().join("buffers");
    std::fs::create_dir_all(&buffers).unwrap();
    // Rank 1's buffer directory cannot be made: a file has its name.
    std::fs::write(buffers.join("rank1"), b"in the way").unwrap();
    let mut extra = args(&["world_size=2", "steps=800", "save_buffer=true"]);
    extra.extend(args(&["eval_freq=1000000", "eval_episodes=1"]));
    extra.push(format!("master_port={}", free_port()));
    let out = run("train", dir.path(), &extra);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("1 other rank(s) could not write their replay buffer"),
        "{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(buffers.join("rank0"))
        .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "rank 0's buffers stayed: {left:?}");
    assert!(!checkpoint(dir.path(), 800).exists());
}

/// Buffers written for a checkpoint that rank 0 then failed to write (a full disk) belong to
/// no checkpoint: the next start removes them, before a save of their step would need room for
/// two.
#[test]
fn buffers_of_a_checkpoint_never_written_go_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    // Rank 0 writes its buffer, then cannot make the checkpoints folder: a file has its name.
    let in_the_way = dir.path().join("checkpoints");
    std::fs::write(&in_the_way, b"in the way").unwrap();
    let train = |steps: &str| {
        let mut extra = args(&[steps, "save_buffer=true", "save_freq=400"]);
        extra.extend(args(&["eval_freq=1000000", "eval_episodes=1"]));
        run("train", dir.path(), &extra)
    };
    let out = train("steps=400");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let left = dir.path().join("buffers/rank0/step_000000000400");
    assert!(left.is_dir(), "the failed save's buffer: {stderr}");
    std::fs::remove_file(&in_the_way).unwrap();
    std::fs::rename(&left, left.with_file_name("step_000000000800")).unwrap();
    let out = train("steps=400");
    assert_ok(&out);
    assert!(
        !left.with_file_name("step_000000000800").exists(),
        "the buffer no checkpoint refers to is gone"
    );
    assert!(left.is_dir(), "this run's own");
}

#[test]
fn ctrl_c_during_pretraining_stops_with_a_checkpoint_and_resumes_what_was_left() {
    let dir = tempfile::tempdir().unwrap();
    const SEED_STEPS: u64 = 2000;
    let settings = |port: u16| {
        vec![
            "world_size=2".to_string(),
            "steps=1000000".into(),
            format!("seed_steps={SEED_STEPS}"),
            "buffer_size=5000".into(),
            "save_buffer=true".into(),
            "resume=auto".into(),
            format!("master_port={port}"),
        ]
    };
    let mut run = Watched::spawn(command("train", dir.path(), &settings(free_port())));
    let line = run.wait_for("Pretraining agent on seed data", Duration::from_secs(300));
    assert!(line.contains(&format!("({SEED_STEPS} updates)")), "{line}");
    std::thread::sleep(Duration::from_secs(2));
    let signalled = Instant::now();
    run.signal("INT");
    let (status, stderr) = run.finish(Duration::from_secs(60));
    let took = signalled.elapsed();
    assert!(!status.success(), "a stopped run exits non-zero: {stderr}");
    assert!(
        took < Duration::from_secs(45),
        "stopped in {took:?}: {stderr}"
    );
    assert!(stderr.contains("stopped during pretraining"), "{stderr}");
    // Stopped at the last random step, before the step counter moved on.
    let saved = checkpoint(dir.path(), 2 * SEED_STEPS);
    let done = meta(&saved)["pretrain_updates"].as_u64().unwrap();
    assert!(0 < done && done < SEED_STEPS, "{done} updates made");
    // What each environment started by the stop, not what an earlier checkpoint knew (none
    // here): the resumed run's episodes go on from there, without reusing a seed.
    let env_episodes = &meta(&saved)["env_episodes"];
    assert_eq!(
        env_episodes.as_array().map_or(0, Vec::len),
        2,
        "{env_episodes}"
    );

    // The resumed run (buffers restored) makes only the updates that were left.
    let mut run = Watched::spawn(command("train", dir.path(), &settings(free_port())));
    let line = run.wait_for("Pretraining agent on seed data", Duration::from_secs(300));
    assert!(
        line.contains(&format!("({} updates)", SEED_STEPS - done)),
        "{line} after {done} updates: {}",
        run.seen.join("\n")
    );
    run.signal("TERM");
    let (status, stderr) = run.finish(Duration::from_secs(60));
    assert!(!status.success());
    assert!(stderr.contains("Resumed from"), "{stderr}");
}

/// Starts `command` (its output to pipes whose readers are gone at once with `readers_gone`,
/// else discarded: a pipe nobody reads fills and blocks the run) and returns it once its run
/// trains (a training record in `run_dir`'s metrics.jsonl).
fn training_run(mut command: Command, run_dir: &Path, readers_gone: bool) -> common::Reaped {
    let output = || match readers_gone {
        true => Stdio::piped(),
        false => Stdio::null(),
    };
    let mut child = common::Reaped::spawn(command.stdout(output()).stderr(output()));
    drop(child.stdout.take());
    drop(child.stderr.take());
    let training = || {
        std::fs::read_to_string(run_dir.join("metrics.jsonl"))
            .is_ok_and(|text| text.contains("\"phase\":\"train\""))
    };
    let started = Instant::now();
    while !training() && started.elapsed() < Duration::from_secs(240) {
        assert_eq!(child.try_wait().unwrap(), None, "the run went on");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(child.try_wait().unwrap(), None, "the run went on");
    child
}

fn send(pid: u32, signal: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(sent, "kill -{signal} {pid}");
}

fn exit_within(child: &mut common::Reaped, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(start.elapsed() < limit, "still running {limit:?} later");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn checkpoints_in(run_dir: &Path) -> usize {
    std::fs::read_dir(run_dir.join("checkpoints"))
        .map(|entries| entries.flatten().count())
        .unwrap_or(0)
}

/// Whether `pid` catches `signal` (its handler is installed), from /proc.
fn catches(pid: u32, signal: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
}

/// Ctrl-C during start-up, the moment `train` takes stop requests (the embedded Python,
/// importing the task's simulator, took SIGINT over for its KeyboardInterrupt: a traceback and
/// exit 1): the run stops as asked, exit 3, and one stopped before it began leaves no run
/// directory. `train` catches a hangup from then on, after SIGINT; before, from the start of
/// `main`, SIGINT and SIGTERM are caught to end the process as by default.
#[test]
fn ctrl_c_during_start_up_stops_the_run_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let settings = args(&["task=cartpole-swingup", "seed_steps=1000"]);
    let mut command = command("train", &run_dir, &settings);
    // A hangup's default action, as from a terminal, whatever this test inherited (a suite
    // run under nohup ignores it, and so would the run).
    // SAFETY: signal(2) in the child between fork and exec, async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        command.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_DFL);
            Ok(())
        });
    }
    let child = common::Reaped::spawn(command.stdout(Stdio::null()).stderr(Stdio::piped()));
    let start = Instant::now();
    while !catches(child.id(), libc::SIGHUP) && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(1));
    }
    send(child.id(), "INT");
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(!stderr.contains("KeyboardInterrupt"), "{stderr}");
    if stderr.contains("stopped before the run started") {
        assert!(!run_dir.exists(), "nothing written: {stderr}");
    }
}

/// `train ... | tee log`, then Ctrl-C: the same signal ends `tee`, and the lines written after
/// it reach no reader. They are lost, the run is not: it stops with its checkpoint (every line
/// was a panic, on the launcher's first forwarded line, whose ranks were then killed).
#[test]
fn a_run_whose_output_reader_is_gone_stops_with_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let settings = [
        "world_size=2".to_string(),
        "steps=1000000".into(),
        format!("master_port={}", free_port()),
    ];
    let mut child = training_run(command("train", dir.path(), &settings), dir.path(), true);
    send(child.id(), "INT");
    let status = exit_within(&mut child, Duration::from_secs(150));
    assert_eq!(status.code(), Some(3), "stopped as asked");
    assert!(checkpoints_in(dir.path()) > 0, "the stop's checkpoint");
}

/// A closed terminal (SIGHUP) stops a run as Ctrl-C does, with its checkpoint, where it
/// killed a single process at once and left a launcher's ranks to their 30 s orphan grace;
/// under `nohup` the run goes on.
#[test]
fn a_hangup_stops_a_run_with_its_checkpoint_unless_nohup_asked_otherwise() {
    for world_size in [2, 1] {
        let dir = tempfile::tempdir().unwrap();
        let settings = [
            format!("world_size={world_size}"),
            "steps=1000000".into(),
            format!("master_port={}", free_port()),
        ];
        let mut train = command("train", dir.path(), &settings);
        // As from a terminal: a hangup's default action, whatever this test inherited (a suite
        // run under nohup ignores it, and so would the run).
        // SAFETY: signal(2) in the child between fork and exec, async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            train.pre_exec(|| {
                libc::signal(libc::SIGHUP, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut child = training_run(train, dir.path(), false);
        send(child.id(), "HUP");
        let status = exit_within(&mut child, Duration::from_secs(150));
        assert_eq!(status.code(), Some(3), "world_size={world_size}: stopped");
        assert!(checkpoints_in(dir.path()) > 0, "world_size={world_size}");
    }
    let dir = tempfile::tempdir().unwrap();
    let mut nohup = Command::new("nohup");
    nohup
        .arg(env!("CARGO_BIN_EXE_tdmpc2"))
        .arg("train")
        .args(TINY)
        .args([
            "steps=1000000".to_string(),
            format!("run_dir={}", dir.path().display()),
        ]);
    let mut child = training_run(nohup, dir.path(), false);
    send(child.id(), "HUP");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(child.try_wait().unwrap(), None, "nohup: the run goes on");
    send(child.id(), "TERM");
    assert_eq!(
        exit_within(&mut child, Duration::from_secs(150)).code(),
        Some(3)
    );
}

/// A stop that cannot end (an environment worker that stopped answering, a tracker's network)
/// ends at once on a second Ctrl-C a moment later, workers included: it waited for
/// `env_timeout` whatever was pressed.
#[test]
fn a_second_ctrl_c_ends_a_stop_that_hangs() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let settings = args(&[
        "task=gym:Pendulum-v1",
        "num_envs=2",
        "env_workers=1",
        // Seeding all along: every step of the loop waits on the worker (pretraining's
        // updates would not, and the stop would end with them).
        "seed_steps=1000000",
        "steps=1000000",
        "env_timeout=600",
    ]);
    let mut child = training_run(command("train", dir.path(), &settings), dir.path(), false);
    let workers = common::children_of(child.id());
    assert_eq!(workers.len(), 1, "one environment worker");
    send(workers[0], "STOP");
    // The run is waiting on the stopped worker by then.
    std::thread::sleep(Duration::from_millis(300));
    send(child.id(), "INT");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        child.try_wait().unwrap(),
        None,
        "the stop waits on the worker"
    );
    send(child.id(), "INT");
    let status = exit_within(&mut child, Duration::from_secs(10));
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}");
    let gone = Instant::now();
    while std::fs::metadata(format!("/proc/{}", workers[0])).is_ok()
        && gone.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let state = std::fs::read_to_string(format!("/proc/{}/stat", workers[0])).unwrap_or_default();
    assert!(
        state.is_empty() || state.contains(") Z"),
        "the worker ended: {state}"
    );
}

/// SIGTERM during a long evaluation stops every rank between two of its steps, with a
/// checkpoint, instead of after the episodes (which can outlast a scheduler's grace period
/// before it kills the job).
#[test]
fn sigterm_during_a_long_evaluation_stops_between_two_steps() {
    let dir = tempfile::tempdir().unwrap();
    // Slow plans: each rank's one evaluation episode (200 steps of Pendulum) takes minutes.
    let mut slow = args(&[
        "world_size=2",
        "num_threads=1",
        "steps=1000000",
        "num_samples=4096",
        "iterations=12",
    ]);
    slow.push(format!("master_port={}", free_port()));
    let run = Watched::spawn(command("train", dir.path(), &slow));
    let config = dir.path().join("config.yaml");
    wait_until(Duration::from_secs(120), || config.exists());
    assert!(config.exists(), "the run started");
    // Well into the first evaluation (the one at step 0).
    std::thread::sleep(Duration::from_secs(10));
    let signalled = Instant::now();
    run.signal("TERM");
    let (status, stderr) = run.finish(Duration::from_secs(90));
    let took = signalled.elapsed();
    assert!(!status.success(), "a stopped run exits non-zero: {stderr}");
    assert!(
        stderr.contains("during the evaluation at step 0"),
        "{stderr}"
    );
    assert!(
        took < Duration::from_secs(30),
        "stopped in {took:?}: {stderr}"
    );
    let saved = checkpoint(dir.path(), 0);
    assert!(saved.join("model.safetensors").is_file());
    assert_eq!(
        meta(&saved)["eval_due"],
        true,
        "the evaluation is still owed: a resumed run makes it first"
    );
    assert!(
        !dir.path().join("metrics.jsonl").exists()
            || !std::fs::read_to_string(dir.path().join("metrics.jsonl"))
                .unwrap()
                .contains("\"eval\""),
        "the interrupted evaluation is not logged"
    );
}

/// A stop during a later evaluation keeps the episode that ended before it: in the replay
/// buffer the checkpoint saves, in the episode count and in the logs; and it records the
/// periodic checkpoint due after that evaluation as owed, for the resumed run to write (and
/// derive its streams at) where the uninterrupted run did.
#[test]
fn a_stop_during_an_evaluation_keeps_the_episode_that_ended_before_it() {
    let dir = tempfile::tempdir().unwrap();
    // Random actions up to step 400 (fast), slow evaluations at 0 and 400.
    let slow = args(&[
        "num_threads=1",
        "steps=1000000",
        "seed_steps=1000",
        "eval_freq=400",
        "save_freq=400",
        "eval_episodes=1",
        "save_buffer=true",
        "num_samples=1024",
        "iterations=3",
    ]);
    let run = Watched::spawn(command("train", dir.path(), &slow));
    let metrics = dir.path().join("metrics.jsonl");
    wait_until(Duration::from_secs(300), || {
        std::fs::read_to_string(&metrics).is_ok_and(|m| m.contains("\"eval\""))
    });
    // The evaluation at 0 is logged; the 400 random steps take well under a second (more on a
    // machine that stalls the run), the evaluation at 400 some 15 s. (The episodes that end
    // meanwhile are logged after it.)
    std::thread::sleep(Duration::from_secs(5));
    run.signal("TERM");
    let (status, stderr) = run.finish(Duration::from_secs(90));
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("during the evaluation at step 400"),
        "{stderr}"
    );
    let saved = checkpoint(dir.path(), 400);
    assert_eq!(meta(&saved)["episodes"], 2, "both episodes are counted");
    assert_eq!(meta(&saved)["eval_due"], true);
    assert_eq!(
        meta(&saved)["save_due"],
        true,
        "the checkpoint at 400 is owed"
    );
    let trains = common::metrics(dir.path())
        .iter()
        .filter(|l| l["phase"] == "train")
        .count();
    assert_eq!(trains, 2, "both episodes are logged");
}

#[test]
fn a_run_directory_serves_one_run_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let long = args(&["steps=1000000", "num_threads=1"]);
    let first = Watched::spawn(command("train", dir.path(), &long));
    let lock = dir.path().join(".lock");
    wait_until(Duration::from_secs(120), || {
        std::fs::read_to_string(&lock).is_ok_and(|t| t.contains("host="))
    });
    let pid = first.child.id();
    let owner = std::fs::read_to_string(&lock).unwrap();
    assert!(owner.contains(&format!("pid={pid}\n")), "{owner}");

    let started = Instant::now();
    let out = run("train", dir.path(), &args(&["steps=400", "num_threads=1"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("run_dir={} is in use", dir.path().display()))
            && stderr.contains(&format!("pid {pid} on ")),
        "{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "refused at once"
    );
    // Two ranks: the built-in launcher refuses before it starts any.
    let started = Instant::now();
    let out = run(
        "train",
        dir.path(),
        &[
            "world_size=2".into(),
            "steps=800".into(),
            format!("master_port={}", free_port()),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is in use by another run"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "refused at once"
    );

    // SIGKILL leaves the lock file behind; the next run takes it over.
    first.signal("KILL");
    let (status, _) = first.finish(Duration::from_secs(30));
    assert!(!status.success());
    assert!(lock.is_file(), "a killed run leaves its lock file");
    let out = run(
        "train",
        dir.path(),
        &args(&["steps=400", "num_threads=1", "resume=null"]),
    );
    let stderr = assert_ok(&out);
    assert!(
        stderr.contains("taking over the stale lock") && stderr.contains(&format!("pid {pid} ")),
        "{stderr}"
    );
    assert!(!lock.exists(), "a finished run removes its lock");
}

#[test]
fn eval_refuses_damaged_weights_and_takes_any_file_of_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let settings = args(&[
        "steps=400",
        "save_freq=400",
        "eval_freq=400",
        "num_threads=1",
    ]);
    assert_ok(&run("train", dir.path(), &settings));
    let saved = checkpoint(dir.path(), 400);
    let eval = |path: &Path| {
        run(
            "eval",
            dir.path(),
            &[
                format!("checkpoint={}", path.display()),
                "eval_episodes=1".into(),
                "num_threads=1".into(),
            ],
        )
    };
    for file in ["state.safetensors", "meta.json"] {
        let out = eval(&saved.join(file));
        let stderr = assert_ok(&out);
        assert!(
            stderr.contains("taking the weights of its checkpoint"),
            "{stderr}"
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("\"episodes\":1"));
    }
    // Training settings eval does not use are named, not taken for applied.
    let mut unused = vec![
        format!("checkpoint={}", saved.display()),
        "eval_episodes=1".into(),
    ];
    unused.extend(args(&["num_threads=1", "resume=auto", "pipeline=true"]));
    let stderr = assert_ok(&run("eval", dir.path(), &unused));
    assert!(
        stderr.contains(
            "note: eval leaves unused: resume=auto (the weights are checkpoint='s), pipeline=true"
        ),
        "{stderr}"
    );

    // 4 KB of garbage in the middle of the weights: same size, loads as tensors, yet damaged.
    let model = saved.join("model.safetensors");
    common::damage_middle(&model);
    assert!(
        tch::Tensor::read_safetensors(&model).is_ok(),
        "the damage is in tensor data, not the header"
    );
    for path in [saved.clone(), model.clone(), dir.path().to_owned()] {
        let out = eval(&path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: {stderr}", path.display());
        assert!(
            stderr.contains(&format!("{} is damaged", model.display())),
            "{stderr}"
        );
    }
}

#[test]
fn a_finished_run_takes_only_a_resume_and_eval_names_what_it_cannot_play() {
    let dir = tempfile::tempdir().unwrap();
    let settings = args(&["steps=400", "eval_freq=400", "num_threads=1"]);
    assert_ok(&run("train", dir.path(), &settings));
    let metrics = std::fs::read(dir.path().join("metrics.jsonl")).unwrap();
    let job = std::fs::read(dir.path().join(".job")).unwrap();
    let refused = |extra: &[&str], expected: &str| {
        let mut all = settings.clone();
        all.extend(args(extra));
        let out = run("train", dir.path(), &all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
    };
    // A new run here, by one process or by the built-in launcher before it starts any rank.
    let holds = "already holds a run (checkpoints up to step 400): resume=auto continues it";
    refused(&[], holds);
    let port = format!("master_port={}", free_port());
    refused(&["world_size=2", "steps=800", &port], holds);
    refused(
        &["resume=auto", "steps=300"],
        "is at step 400, past this run's steps=300",
    );
    // Another model size: named, with where the trained one's settings are.
    refused(
        &["resume=auto", "steps=800", "model_size=5"],
        "resume with those the checkpoint was trained with (model_size",
    );
    // Refused once the checkpoint is read, into a new run directory: no folder is left.
    let fresh = dir.path().join("fresh").join("run");
    let resume = format!("resume={}", dir.path().display());
    let out = run(
        "train",
        &fresh,
        &args(&[&resume, "steps=800", "model_size=5"]),
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !dir.path().join("fresh").exists(),
        "a refused start left its folders"
    );
    // Several ranks: the launcher refuses it before starting any; a checkpoint that does not
    // fit the model (found once rank 0 loads it) is exit 2 on every rank, and not restarted.
    refused(
        &[
            "resume=auto",
            "steps=800",
            "task=gym:Pendulum-v1",
            "world_size=2",
            &port,
        ],
        "the checkpoint was trained on task=Pendulum-v1, this run has task=gym:Pendulum-v1",
    );
    let port = format!("master_port={}", free_port());
    let mut all = settings.clone();
    all.extend(args(&[
        "resume=auto",
        "steps=800",
        "model_size=5",
        "world_size=2",
        "max_restarts=1",
        &port,
    ]));
    let out = run("train", dir.path(), &all);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("rank 0 refused the checkpoint") && !stderr.contains("restarting"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(dir.path().join("metrics.jsonl")).unwrap(),
        metrics,
        "the refused runs wrote nothing"
    );
    assert_eq!(
        std::fs::read(dir.path().join(".job")).unwrap(),
        job,
        "the run directory is still the first job's (a restarted attempt of it resumes)"
    );
    // Refused before any run directory is made: nothing is left behind.
    let new_run = dir.path().join("never");
    for extra in ["device=cuda:99", "data_dir=/nonexistent/data"] {
        let out = run("train", &new_run, &args(&[extra]));
        assert_eq!(out.status.code(), Some(2), "{extra}");
        assert!(!new_run.exists(), "{extra} made {}", new_run.display());
    }
    // Several ranks: refused once, by the launcher, before any rank starts.
    let out = run(
        "train",
        &new_run,
        &args(&["world_size=2", "data_dir=/nonexistent/data"]),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.matches("cannot be read").count(), 1, "{stderr}");
    assert!(!new_run.exists());
    assert_eq!(
        std::fs::read_dir(dir.path().join("checkpoints"))
            .unwrap()
            .count(),
        1
    );

    let eval = |extra: &[&str]| {
        let mut all = args(&[&format!("checkpoint={}", dir.path().display())]);
        all.extend(args(extra));
        run("eval", dir.path(), &all)
    };
    let out = eval(&["eval_episodes=0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("eval_episodes=0: eval plays at least one episode"));
    // The checkpoint is of model size 1 (TINY's): eval builds its model from its own settings.
    let out = eval(&["model_size=5"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("The model is built from this command's settings (model_size=5")
            && stderr.contains("config.yaml differs in (trained with → given here): ")
            && stderr.contains("model_size: 1 → 5"),
        "{stderr}"
    );
    // Another task of the same sizes plays, with a warning that names both.
    let out = eval(&["task=gym:Pendulum-v1", "eval_episodes=1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ok(&out);
    assert!(
        stderr.contains("was trained on task=Pendulum-v1; playing it on task=gym:Pendulum-v1"),
        "{stderr}"
    );
    // collect plays with the same policy: the same refusal, before it makes its --out.
    let data = dir.path().join("dataset");
    let collect = |episodes: &str, extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
            .args(["collect", "--episodes", episodes, "--out"])
            .arg(&data)
            .args(TINY)
            .arg(format!("checkpoint={}", dir.path().display()))
            .args(extra)
            .output()
            .unwrap()
    };
    let out = collect("1", &["model_size=5"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("(model_size=5"), "{stderr}");
    assert!(!data.exists(), "collect made its --out");
    // Fewer episodes than environments: the agent plans for those that play.
    let out = collect("2", &["num_envs=4", "seed_steps=800"]);
    assert_ok(&out);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("wrote 2 episodes in 1 file"), "{said}");
    std::fs::remove_dir_all(&data).unwrap();
    let official = dir.path().join("agent.pt");
    std::fs::write(&official, b"not safetensors").unwrap();
    let out = run(
        "eval",
        dir.path(),
        &[format!("checkpoint={}", official.display())],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("`tdmpc2 import"), "{stderr}");
    // The settings that built the model come from its run: neither task nor size given again.
    // What training alone needs (steps past an episode, seed steps) is not asked of eval.
    let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(["eval", "eval_episodes=1", "iterations=1", "num_samples=32"])
        .args(["steps=5", "seed_steps=1"])
        .args(["num_elites=4", "num_pi_trajs=2", "horizon=2", "vmax=20"])
        .arg(format!("checkpoint={}", dir.path().display()))
        .output()
        .unwrap();
    let stderr = assert_ok(&out);
    assert!(
        stderr.contains("eval: the model is built with its run's settings")
            && stderr.contains("model_size=1")
            && stderr.contains("task=Pendulum-v1")
            && !stderr.contains("latent_dim"),
        "{stderr}"
    );
    // The planner is this command's, said where it is not the run's; so is a setting that
    // changes what the model computes but no shape.
    assert!(
        stderr.contains("note: playing otherwise than the checkpoint's run")
            && stderr.contains("horizon: 3 → 2")
            && stderr.contains("vmax: 10.0 → 20.0"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(r#""task":"Pendulum-v1""#), "{stdout}");
    // --cfg job prints the resolved settings and plays nothing.
    let out = eval(&["--cfg", "job"]);
    assert_ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("episode_length: 200") && !stdout.contains("episodes,"),
        "{stdout}"
    );
    // Without its run's settings, the checkpoint still names its task, and its size.
    let settings = dir.path().join("config.yaml");
    std::fs::rename(&settings, dir.path().join("moved.yaml")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(["eval", "eval_episodes=1"])
        .arg(format!("checkpoint={}", dir.path().display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot read the settings of the checkpoint's run in {}",
            settings.display()
        )) && stderr.contains("on the task it was trained on (task=Pendulum-v1)")
            && stderr.contains("its widths are model_size=1's: mlp_dim 384, here 512"),
        "{stderr}"
    );
}

/// A checkpoint or a saved replay buffer copied in part, or edited, is bad input (exit 2, not
/// restarted), named with the way on: a missing file, a newer checkpoint directory left empty
/// by a copy cut short, a replay buffer's bookkeeping that is not JSON.
#[test]
fn an_incomplete_checkpoint_or_buffer_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    let settings = args(&[
        "steps=400",
        "save_freq=400",
        "eval_freq=400",
        "save_buffer=true",
    ]);
    assert_ok(&run("train", &whole, &settings));
    let copy = |name: &str| {
        let to = dir.path().join(name);
        let status = Command::new("cp").arg("-a").arg(&whole).arg(&to).status();
        assert!(status.unwrap().success());
        to
    };
    let refused = |run_dir: &Path, verb: &str, expected: &str| {
        let extra = match verb {
            "train" => args(&["steps=800", "resume=auto"]),
            _ => vec![format!("checkpoint={}", run_dir.display())],
        };
        let out = run(verb, run_dir, &extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{verb}: {stderr}");
        assert!(stderr.contains(expected), "{verb}: {stderr}");
    };

    let no_model = copy("no_model");
    let saved = checkpoint(&no_model, 400);
    std::fs::remove_file(saved.join("model.safetensors")).unwrap();
    let incomplete = format!(
        "{} is incomplete: it has no model.safetensors",
        saved.display()
    );
    refused(&no_model, "train", &incomplete);
    refused(&no_model, "eval", &incomplete);

    let left_empty = copy("left_empty");
    let empty = checkpoint(&left_empty, 800);
    std::fs::create_dir(&empty).unwrap();
    let incomplete = format!("{} is incomplete: it has no meta.json", empty.display());
    refused(&left_empty, "train", &incomplete);

    let edited = copy("edited");
    let buffer = edited.join("buffers/rank0/step_000000000400");
    let bookkeeping = buffer.join("buffer.json");
    let mut ring: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&bookkeeping).unwrap()).unwrap();
    let named = format!("{} is damaged or edited", bookkeeping.display());
    // Its hash is recorded: the same bookkeeping written compactly is an edit.
    std::fs::write(&bookkeeping, ring.to_string()).unwrap();
    refused(
        &edited,
        "train",
        &format!("{named} (its bytes do not match the hash recorded when it was saved"),
    );
    // A buffer saved before that hash was recorded is checked for consistency only.
    std::fs::remove_file(buffer.join("buffer.json.crc32c")).unwrap();
    let hash = buffer.join("buffer.crc32c");
    ring["cursor"] = serde_json::json!(1_000_000);
    std::fs::write(&bookkeeping, ring.to_string()).unwrap();
    refused(
        &edited,
        "train",
        &format!("{named} (the saved replay buffer's bookkeeping is inconsistent"),
    );
    std::fs::write(&bookkeeping, "{").unwrap();
    refused(&edited, "train", &named);
    // Every save writes the hash before its folder appears: without it, damage (the buffer
    // was passed over, and the run resumed with an empty one, silently inexact).
    std::fs::remove_file(&hash).unwrap();
    let missing = format!(
        "{} is missing: the buffer cannot be checked",
        hash.display()
    );
    refused(&edited, "train", &missing);
}
