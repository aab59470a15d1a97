//! The vector env over `tdmpc2 env-worker` processes: dm_control in a worker steps bit for
//! bit like in this process, so do the padded environments of a multitask run, and a killed
//! worker is a clear error within seconds.
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use envs::{Padding, Placement, TaskMix, VectorEnv, WorkerCommand};

fn worker() -> WorkerCommand {
    WorkerCommand::new(common::tdmpc2_bin(), &["env-worker"])
}

/// A fixed action sequence in [-1, 1], different per env and step.
fn action(t: usize, env: usize, dim: usize) -> Vec<f32> {
    (0..dim)
        .map(|j| (((t * 31 + env * 7 + j * 3) % 17) as f32 / 8.0) - 1.0)
        .collect()
}

#[test]
fn walker_run_in_worker_processes_equals_in_process() {
    let seeds = [1, 2, 3];
    let mut local = VectorEnv::new("walker-run", &seeds, Placement::InProcess, &worker()).unwrap();
    let mut remote =
        VectorEnv::new("walker-run", &seeds, Placement::Workers(2), &worker()).unwrap();
    assert_eq!(remote.worker_pids().len(), 2);
    assert_eq!(remote.spec(), local.spec());
    let dim = local.spec().action_dim;
    for i in 0..seeds.len() {
        assert_eq!(
            remote.reset(i, None).unwrap(),
            local.reset(i, None).unwrap()
        );
    }
    for t in 0..25 {
        if t == 10 {
            // Env 1 alone restarts; envs 0 and 2 carry on.
            assert_eq!(
                remote.reset(1, Some(42)).unwrap(),
                local.reset(1, Some(42)).unwrap()
            );
        }
        let which = if t % 3 == 0 {
            vec![2, 0]
        } else {
            vec![0, 1, 2]
        };
        let actions: Vec<f32> = which.iter().flat_map(|&i| action(t, i, dim)).collect();
        let ours = remote.step(&which, &actions).unwrap();
        assert_eq!(ours, local.step(&which, &actions).unwrap(), "step {t}");
        assert!(ours
            .iter()
            .all(|s| s.reward.is_finite() && s.obs.len() == 24));
    }
}

/// A multitask run's slots: one cycling two tasks, one with a task of its own, padded to
/// the largest observation (cartpole's 5) and action (reacher's 2).
#[test]
fn multitask_slots_in_worker_processes_equal_in_process() {
    let padding = Some(Padding {
        obs_dim: 6,
        action_dim: 2,
    });
    let mix = |tasks: &[&str]| TaskMix {
        tasks: tasks.iter().map(|t| t.to_string()).collect(),
        padding,
    };
    let mixes = [
        mix(&["cartpole-swingup", "reacher-easy"]),
        mix(&["Pendulum-v1"]),
    ];
    let seeds = [4, 5];
    let mut local = VectorEnv::mixed(
        &mixes,
        envs::ObsKind::State,
        &seeds,
        Placement::InProcess,
        &worker(),
    )
    .unwrap();
    let mut remote = VectorEnv::mixed(
        &mixes,
        envs::ObsKind::State,
        &seeds,
        Placement::Workers(2),
        &worker(),
    )
    .unwrap();
    assert_eq!(remote.spec(), local.spec());
    assert_eq!((local.spec().obs_dim(), local.spec().action_dim), (6, 2));
    for episode in 0..2 {
        local.switch_task(0, episode).unwrap();
        remote.switch_task(0, episode).unwrap();
        for i in 0..2 {
            let obs = remote.reset(i, Some(episode as u64)).unwrap();
            assert_eq!(obs, local.reset(i, Some(episode as u64)).unwrap());
        }
        for t in 0..5 {
            let actions: Vec<f32> = (0..2).flat_map(|i| action(t, i, 2)).collect();
            let ours = remote.step(&[0, 1], &actions).unwrap();
            assert_eq!(ours, local.step(&[0, 1], &actions).unwrap());
            // Cartpole's 5 numbers and one zero; Pendulum's 3 and three zeros.
            let zeros = |s: &envs::Step, from: usize| s.obs[from..].iter().all(|&x| x == 0.0);
            assert!(zeros(&ours[1], 3), "{:?}", ours[1].obs);
            if episode == 0 {
                assert!(zeros(&ours[0], 5), "{:?}", ours[0].obs);
            }
        }
    }
    let e = remote.switch_task(1, 1).unwrap_err().to_string();
    assert!(
        e.contains("task 1 of an environment that runs 1 tasks"),
        "{e}"
    );
}

#[test]
fn a_killed_tdmpc2_worker_is_a_clear_error_within_seconds() {
    let mut venv =
        VectorEnv::new("Pendulum-v1", &[0, 1, 2], Placement::Workers(3), &worker()).unwrap();
    for i in 0..3 {
        venv.reset(i, None).unwrap();
    }
    let pid = venv.worker_pids()[2];
    venv.check_workers().unwrap();
    let killed = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    assert!(killed.unwrap().success());
    // Found without a step too (what long work between steps asks), once the kernel has it.
    let died = format!(
        "the environment worker (pid {pid}) running `Pendulum-v1` env 2 died: killed by signal 9"
    );
    let start = Instant::now();
    let e = loop {
        match venv.check_workers() {
            Err(e) => break e.to_string(),
            Ok(()) if start.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Ok(()) => panic!("the killed worker was not found dead"),
        }
    };
    assert!(e.contains(&died), "{e}");
    let start = Instant::now();
    let e = venv.step(&[0, 1, 2], &[0.0; 3]).unwrap_err().to_string();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(e.contains(&died), "{e}");
}

#[test]
fn the_worker_subcommand_is_hidden() {
    let help = Command::new(common::tdmpc2_bin())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("bench") && !help.contains("env-worker"),
        "{help}"
    );
}
