//! VectorEnv over real worker processes (this crate's `envs-worker` binary), with the native
//! Pendulum-v1 so that every case runs in about a second. dm_control through the tdmpc2
//! binary's worker is tested in the root crate's tests/vector_env.rs.
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use envs::{Placement, ReplyLimit, Result, VectorEnv, WorkerCommand};

const TASK: &str = "Pendulum-v1";

fn worker() -> WorkerCommand {
    WorkerCommand::new(env!("CARGO_BIN_EXE_envs-worker"), &[])
}

fn error_text<T>(result: Result<T>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

/// The process's state letter (`R`, `S`, `Z`, ...), None once it is gone (reaped).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// Gone for good: reaped (a zombie is not gone: its parent has not waited for it).
fn process_gone(pid: u32) -> bool {
    matches!(process_state(pid), None | Some('X'))
}

/// Dead, reaped or not (an orphan is reaped by whichever process adopts it, not by us).
fn wait_until_dead(pid: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if matches!(process_state(pid), None | Some('X' | 'Z')) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn workers_step_bit_for_bit_like_in_process_envs_with_independent_resets() {
    let seeds = [3, 4, 5, 6, 7];
    let mut local = VectorEnv::new(TASK, &seeds, Placement::InProcess, &worker()).unwrap();
    let mut remote = VectorEnv::new(TASK, &seeds, Placement::Workers(2), &worker()).unwrap();
    assert_eq!(remote.worker_pids().len(), 2);
    assert_eq!(remote.spec(), local.spec());
    // Reset together (in an order that alternates between the workers), or one by one: the
    // same observations.
    let resets: Vec<(usize, Option<u64>)> = [4, 0, 3, 1, 2]
        .into_iter()
        .map(|i| (i, (i % 2 == 0).then_some(100 + i as u64)))
        .collect();
    let together = remote.reset_many(&resets).unwrap();
    for (&(i, seed), first) in resets.iter().zip(&together) {
        assert_eq!(first, &local.reset(i, seed).unwrap(), "env {i}");
    }
    let twice = remote.reset_many(&[(1, None), (1, None)]);
    assert!(error_text(twice).contains("env 1 is listed twice"));
    let all: Vec<usize> = (0..seeds.len()).collect();
    let actions = common::actions(9, 450, seeds.len());
    let mut truncations = 0;
    for (t, action) in actions.iter().enumerate() {
        if t == 50 {
            // Env 2 alone starts over, mid-episode; the others carry on.
            assert_eq!(
                remote.reset(2, Some(11)).unwrap(),
                local.reset(2, Some(11)).unwrap()
            );
        }
        // Odd steps leave env 1 out, so episodes drift apart and end at different steps.
        let which: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&i| t % 2 == 0 || i != 1)
            .collect();
        let action: Vec<f32> = which.iter().map(|&i| action[i]).collect();
        let ours = remote.step(&which, &action).unwrap();
        assert_eq!(ours, local.step(&which, &action).unwrap(), "step {t}");
        let ended: Vec<(usize, Option<u64>)> = (which.iter().zip(&ours))
            .filter(|(_, step)| step.terminated || step.truncated)
            .map(|(&i, _)| (i, None))
            .collect();
        truncations += ended.len();
        assert_eq!(
            remote.reset_many(&ended).unwrap(),
            local.reset_many(&ended).unwrap()
        );
    }
    assert!(truncations >= seeds.len(), "every env finished an episode");
}

#[test]
fn a_killed_worker_is_a_clear_error_within_seconds() {
    let mut venv = VectorEnv::new(TASK, &[0, 1, 2, 3], Placement::Workers(2), &worker()).unwrap();
    for i in 0..4 {
        venv.reset(i, None).unwrap();
    }
    venv.step(&[0, 1, 2, 3], &[0.0; 4]).unwrap();
    let pids = venv.worker_pids();
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(pids[1] as i32, libc::SIGKILL) }, 0);
    let start = Instant::now();
    let e = error_text(venv.step(&[0, 1, 2, 3], &[0.0; 4]));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let expected = format!(
        "the environment worker (pid {}) running `Pendulum-v1` envs 2-3 died: killed by signal 9",
        pids[1]
    );
    assert!(e.contains(&expected), "{e}");
    // The dead worker stays an error; the live one's envs keep working.
    assert!(error_text(venv.reset(3, None)).contains(&expected));
    assert_eq!(venv.step(&[1, 0], &[0.5, 0.5]).unwrap().len(), 2);
    assert!(process_gone(pids[1]), "the killed worker was reaped");
}

/// A terminal's signals reach the whole process group, workers included: the rank decides
/// what they mean (a stop with a checkpoint, or nothing under `nohup`), so workers live on.
#[test]
fn workers_outlive_a_terminal_s_signals() {
    let mut venv = VectorEnv::new(TASK, &[0, 1], Placement::Workers(2), &worker()).unwrap();
    for i in 0..2 {
        venv.reset(i, None).unwrap();
    }
    for pid in venv.worker_pids() {
        for signal in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM] {
            // SAFETY: a plain kill(2) of our own child.
            assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(venv.step(&[0, 1], &[0.5, 0.5]).unwrap().len(), 2);
}

/// A worker that is alive but silent (stopped here, as a hung renderer would be) is named with
/// what it was asked, within its reply limit, and killed; the other workers keep working.
#[test]
fn a_silent_worker_is_named_and_killed_within_its_reply_limit() {
    let mut command = worker();
    command.reply_limit = Some(ReplyLimit {
        // Long enough for a worker to start on a busy machine: the limit counts from its start.
        after: Duration::from_secs(3),
        setting: "env_timeout".into(),
    });
    command.owner = "rank 1".into();
    let mut venv = VectorEnv::new(TASK, &[0, 1, 2, 3], Placement::Workers(2), &command).unwrap();
    for i in 0..4 {
        venv.reset(i, None).unwrap();
    }
    // Answers that take a while but come within the limit are fine.
    venv.step(&[0, 1, 2, 3], &[0.0; 4]).unwrap();
    let pids = venv.worker_pids();
    // SAFETY: a plain kill(2) of our own child: stopped, it is alive but never answers.
    assert_eq!(unsafe { libc::kill(pids[0] as i32, libc::SIGSTOP) }, 0);
    let start = Instant::now();
    let e = error_text(venv.step(&[0, 1, 2, 3], &[0.0; 4]));
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_secs(8),
        "{waited:?}"
    );
    let expected = format!(
        "rank 1: the environment worker (pid {}) running `Pendulum-v1` envs 0-1 did not answer \
         `step` within 3 s (env_timeout) and was killed",
        pids[0]
    );
    assert_eq!(e, expected);
    assert!(wait_until_dead(pids[0], Duration::from_secs(5)));
    assert!(process_gone(pids[0]), "the silent worker was reaped");
    // It stays an error at once; the other worker's envs keep working.
    let start = Instant::now();
    assert!(error_text(venv.reset(1, None)).contains("did not answer `step` within 3 s"));
    assert!(start.elapsed() < Duration::from_secs(1), "no new wait");
    assert_eq!(venv.step(&[2, 3], &[0.5, 0.5]).unwrap().len(), 2);
}

/// Workers asked together are waited for together: two silent ones end the step after one
/// reply limit, not one limit after the other.
#[test]
fn silent_workers_asked_together_share_one_reply_limit() {
    let limit = Duration::from_secs(2);
    let mut command = worker();
    command.reply_limit = Some(ReplyLimit {
        after: limit,
        setting: "env_timeout".into(),
    });
    let mut venv = VectorEnv::new(TASK, &[0, 1], Placement::Workers(2), &command).unwrap();
    for i in 0..2 {
        venv.reset(i, None).unwrap();
    }
    for pid in venv.worker_pids() {
        // SAFETY: a plain kill(2) of our own child: stopped, it is alive but never answers.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    }
    let start = Instant::now();
    let e = error_text(venv.step(&[0, 1], &[0.0; 2]));
    let waited = start.elapsed();
    assert!(e.contains("did not answer `step` within 2 s"), "{e}");
    assert!(waited >= limit && waited < 2 * limit, "{waited:?}");
}

#[test]
fn dropping_ends_the_workers_through_eof_and_reaps_them() {
    let venv = VectorEnv::new(TASK, &[0, 1, 2], Placement::Workers(3), &worker()).unwrap();
    let pids = venv.worker_pids();
    assert_eq!(pids.len(), 3);
    assert!(pids.iter().all(|&pid| !process_gone(pid)));
    let start = Instant::now();
    drop(venv);
    // Well under the 2 s after which a worker that ignores EOF is killed.
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    for pid in pids {
        assert!(
            process_gone(pid),
            "worker {pid} is still there (or a zombie)"
        );
    }
}

#[test]
fn more_workers_than_envs_is_one_worker_per_env() {
    let venv = VectorEnv::new(TASK, &[0, 1], Placement::Workers(8), &worker()).unwrap();
    assert_eq!(venv.worker_pids().len(), 2);
}

#[test]
fn errors_inside_a_worker_name_the_task_and_env_and_leave_the_channel_usable() {
    let mut venv = VectorEnv::new(TASK, &[0, 1, 2, 3], Placement::Workers(2), &worker()).unwrap();
    venv.reset(2, None).unwrap();
    let e = error_text(venv.step(&[2, 3], &[0.0, 0.0]));
    let pid = venv.worker_pids()[1];
    assert!(
        e.contains(&format!(
            "`Pendulum-v1` env 3 failed in its worker process (pid {pid}): step called before reset"
        )),
        "{e}"
    );
    venv.reset(3, None).unwrap();
    assert_eq!(venv.step(&[3, 2], &[0.1, 0.2]).unwrap().len(), 2);

    venv.reset(0, None).unwrap();
    let e = error_text(venv.step(&[0], &[f32::NAN]));
    assert!(
        e.contains("env 0 failed") && e.contains("not finite"),
        "{e}"
    );

    let e = error_text(VectorEnv::new(
        "walker-run",
        &[1 << 40, 1 << 41],
        Placement::Workers(2),
        &worker(),
    ));
    assert!(
        e.contains("`walker-run` env 0 failed in its worker process")
            && e.contains("dm_control seeds must be below 2^32"),
        "{e}"
    );
    let e = error_text(VectorEnv::new(
        "walker-runn",
        &[0],
        Placement::Workers(1),
        &worker(),
    ));
    assert!(e.contains("unknown task `walker-runn`"), "{e}");
}

/// Run as a child by `workers_die_with_their_parent`: makes a vector env, prints its worker
/// pids and waits to be killed.
#[test]
#[ignore = "a child process of workers_die_with_their_parent, not a test of its own"]
fn child_holding_workers() {
    // Made on a thread that ends at once: workers must not die with that thread.
    let venv = std::thread::spawn(|| {
        VectorEnv::new(TASK, &[0, 1], Placement::Workers(2), &worker()).unwrap()
    })
    .join()
    .unwrap();
    let pids: Vec<String> = venv.worker_pids().iter().map(u32::to_string).collect();
    println!("PIDS {}", pids.join(" "));
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn workers_die_with_their_parent() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_holding_workers",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let pids: Vec<u32> = stdout
        .lines()
        .map_while(std::result::Result::ok)
        .find_map(|line| {
            // The harness prints the test's name on the same line first.
            line.split_once("PIDS ")
                .map(|(_, pids)| pids.split(' ').map(|p| p.parse().unwrap()).collect())
        })
        .expect("the child prints its worker pids");
    assert_eq!(pids.len(), 2);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        pids.iter().all(|&pid| !process_gone(pid)),
        "workers outlive the thread that made them"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    for pid in pids {
        assert!(
            wait_until_dead(pid, Duration::from_secs(5)),
            "worker {pid} outlived its parent"
        );
    }
}

/// A worker holds none of its parent's descriptors but its channel and region: a trainer's
/// collective sockets and pipes (opened without close-on-exec by the libraries that own them)
/// would stay open in it, and in anything it leaves behind.
#[test]
fn a_worker_holds_none_of_its_parents_descriptors() {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) into a two-element array; both ends are closed below.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let pipe = std::fs::read_link(format!("/proc/self/fd/{}", fds[0])).unwrap();
    let venv = VectorEnv::new(TASK, &[0, 1], Placement::Workers(1), &worker()).unwrap();
    let held: Vec<std::path::PathBuf> =
        std::fs::read_dir(format!("/proc/{}/fd", venv.worker_pids()[0]))
            .unwrap()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .collect();
    drop(venv);
    // SAFETY: the two descriptors pipe(2) opened above.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    assert!(!held.contains(&pipe), "{pipe:?} in {held:?}");
}
