//! The task families with venvs of their own through the real binary: Meta-World trains on
//! several ranks and resumes bit for bit, the 80-task mt80 resolves and runs, multitask runs
//! online and offline span the families (in one environment slot too), and a missing family venv is
//! one clear line.
//! The family venvs come from `scripts/setup.sh --family all` (scripts/test.sh runs it).
mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{assert_same_tensors, checkpoint, free_port, metrics, TINY};

fn tdmpc2(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(args)
        .output()
        .expect("the tdmpc2 binary runs")
}

/// `tdmpc2 train` with the tiny model, 2 ranks, `settings` and the run directory; it must
/// succeed.
fn train(run_dir: &Path, settings: &[&str]) -> Output {
    let port = format!("master_port={}", free_port());
    let dir = format!("run_dir={}", run_dir.display());
    let mut args = vec!["train"];
    args.extend(&TINY[1..]);
    args.extend(["world_size=2", "num_threads=1", &port, &dir]);
    args.extend(settings);
    let out = tdmpc2(&args);
    assert!(
        out.status.success(),
        "training failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn metaworld_trains_on_two_ranks_logs_success_and_resumes_bit_for_bit() {
    // Episodes of 100 steps on 2 environments per rank end together every 400 global steps;
    // seeding ends at the first checkpoint, so the resume also carries the planners' warm start.
    // A rank's first two episodes (202 rows) overfill its 200-row ring: it wraps.
    let settings = [
        "task=mw-reach",
        "num_envs=2",
        "seed_steps=200",
        "save_freq=400",
        "eval_freq=400",
        "save_buffer=true",
        "buffer_size=200",
    ];
    let whole = tempfile::tempdir().unwrap();
    train(whole.path(), &[&settings[..], &["steps=800"]].concat());
    let rows = metrics(whole.path());
    let train_rows: Vec<_> = rows.iter().filter(|r| r["phase"] == "train").collect();
    assert!(!train_rows.is_empty());
    assert!(
        train_rows
            .iter()
            .all(|r| r["episode_success"].is_number() && r["episode_length"] == 100.0),
        "every Meta-World episode logs its success and lasts 100 steps: {train_rows:?}"
    );
    let config = std::fs::read_to_string(whole.path().join("config.yaml")).unwrap();
    assert!(config.contains("discount: 0.95") && config.contains("episode_length: 100"));

    // Its step-400 checkpoint resumed in another run directory ends where it ended.
    let resumed = tempfile::tempdir().unwrap();
    let resume = format!("resume={}", checkpoint(whole.path(), 400).display());
    train(
        resumed.path(),
        &[&settings[..], &["steps=800", resume.as_str()]].concat(),
    );
    let (a, b) = (
        checkpoint(whole.path(), 800),
        checkpoint(resumed.path(), 800),
    );
    assert_same_tensors(&a.join("model.safetensors"), &b.join("model.safetensors"));
    assert_same_tensors(&a.join("state.safetensors"), &b.join("state.safetensors"));
}

#[test]
fn myosuite_trains_end_to_end_with_its_success() {
    let dir = tempfile::tempdir().unwrap();
    train(
        dir.path(),
        &[
            "task=myo-reach",
            "seed_steps=200",
            "steps=600",
            "eval_freq=600",
            "eval_episodes=1",
        ],
    );
    let rows = metrics(dir.path());
    assert!(rows
        .iter()
        .any(|r| r["phase"] == "train" && r["step"].as_u64() > Some(200)));
    assert!(
        rows.iter().all(|r| r["episode_success"].is_number()),
        "every episode, trained or evaluated, logs its success: {rows:?}"
    );
    let evals: Vec<_> = rows.iter().filter(|r| r["phase"] == "eval").collect();
    assert!(evals.len() >= 2, "{evals:?}");
}

#[test]
fn a_multitask_run_spans_families_in_one_slot_and_in_a_family_worker() {
    // Two slots of two tasks: slot 0 (rank 0) plays Pendulum-v1 then myo-reach, a slot that
    // spans families (a worker of the project's venv, holding a MyoSuite worker); slot 1 plays
    // mw-reach then mw-push, in a Meta-World worker. (DMControl beside Meta-World: mt80 below.)
    let dir = tempfile::tempdir().unwrap();
    train(
        dir.path(),
        &[
            "task=[Pendulum-v1,mw-reach,myo-reach,mw-push]",
            "mpc=false",
            "seed_steps=200",
            "eval_episodes=1",
            "steps=600",
            "eval_freq=600",
        ],
    );
    let rows = metrics(dir.path());
    let trained: Vec<f64> = rows
        .iter()
        .filter(|r| r["phase"] == "train")
        .filter_map(|r| r["episode_length"].as_f64())
        .collect();
    assert!(
        trained.contains(&200.0) && trained.contains(&100.0),
        "episodes of Pendulum and of the families were trained on: {trained:?}"
    );
    let evals: Vec<_> = rows.iter().filter(|r| r["phase"] == "eval").collect();
    let last = evals.last().expect("an evaluation");
    assert_eq!(last["step"], 600);
    for key in [
        "episode_reward+Pendulum-v1",
        "episode_success+mw-reach",
        "episode_success+mw-push",
        "episode_success+myo-reach",
        "episode_success+avg_metaworld",
    ] {
        assert!(last[key].is_number(), "{key} in {last}");
    }
}

#[test]
fn mt80_resolves_and_runs_every_task_on_two_ranks() {
    let job = tdmpc2(&["train", "task=mt80", "--cfg", "job"]);
    assert!(
        job.status.success(),
        "{}",
        String::from_utf8_lossy(&job.stderr)
    );
    let config: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&job.stdout).unwrap();
    assert_eq!(config["task_dim"], 96);
    assert_eq!(
        config["obs_shape"][0], 39,
        "Meta-World's observation is the widest"
    );
    let lengths = config["episode_lengths"].as_sequence().unwrap();
    assert_eq!(lengths.len(), 80);
    assert_eq!(lengths.iter().filter(|l| **l == 100).count(), 50);

    // The evaluation at step 0 plays every task once; training only seeds and pretrains.
    let dir = tempfile::tempdir().unwrap();
    train(
        dir.path(),
        &[
            "task=mt80",
            "mpc=false",
            "seed_steps=500",
            "eval_episodes=1",
            "steps=1002",
            "eval_freq=100000",
        ],
    );
    let rows = metrics(dir.path());
    let eval = rows
        .iter()
        .find(|r| r["phase"] == "eval")
        .expect("an evaluation at step 0");
    let played = eval
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with("episode_reward+") && !k.contains("avg"))
        .count();
    assert_eq!(played, 80, "{eval}");
    assert!(eval["episode_success+avg_metaworld"].is_number());
}

#[test]
fn offline_training_runs_on_a_dataset_that_spans_families() {
    let tasks = "task=[mw-reach,myo-reach,mw-push]";
    let data = tempfile::tempdir().unwrap();
    let collected = tdmpc2(&[
        "collect",
        "--episodes",
        "3",
        "--episodes-per-file",
        "3",
        "--out",
        &data.path().display().to_string(),
        tasks,
        "model_size=1",
    ]);
    let said = String::from_utf8_lossy(&collected.stdout);
    // One file of three 100-step episodes: each of the two ranks samples from it.
    assert!(said.contains("wrote 3 episodes in 1 file "), "{said}");
    let dir = tempfile::tempdir().unwrap();
    let data_dir = format!("data_dir={}", data.path().display());
    train(
        dir.path(),
        &[
            tasks,
            &data_dir,
            "eval_episodes=1",
            "steps=21",
            "eval_freq=20",
        ],
    );
    let rows = metrics(dir.path());
    let last = rows.iter().rfind(|r| r["phase"] == "eval").unwrap();
    assert_eq!(last["step"], 20);
    for key in [
        "episode_success+mw-push",
        "episode_success+mw-reach",
        "episode_success+myo-reach",
    ] {
        assert!(last[key].is_number(), "{key} in {last}");
    }
}

#[test]
fn a_missing_family_venv_is_one_line_naming_the_command_that_installs_it() {
    for task in ["mw-reach", "mt80"] {
        let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
            .args(["train", &format!("task={task}"), "--cfg", "job"])
            .env("TDMPC2_VENV_METAWORLD", "/nonexistent/venv")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{task}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(errors.len(), 1, "{task}: {stderr}");
        assert!(
            errors[0].contains("scripts/setup.sh --family metaworld")
                && errors[0].contains("/nonexistent/venv"),
            "{task}: {stderr}"
        );
        assert!(!stderr.contains("Traceback"), "{task}: {stderr}");
    }
}

/// The two button-press-topdown tasks succeed at v2's distance, but only where v3 sees a
/// success at all: a step v3 finds unstable reports none (and a distance of 0).
#[test]
fn an_unstable_metaworld_step_is_no_success() {
    let adapters = Path::new(env!("CARGO_MANIFEST_DIR")).join("envs/src/py");
    let script = format!(
        "import sys, numpy as np\n\
         sys.path.insert(0, {adapters:?})\n\
         import metaworld_adapter as m\n\
         a = m.MetaWorldAdapter('button-press-topdown-v3-goal-observable', 1, False, 100)\n\
         a.reset(1)\n\
         a.env._did_see_sim_exception = True\n\
         print(a.step(np.zeros(4))[4])\n"
    );
    let out = Command::new(envs::Family::MetaWorld.venv().join("bin/python"))
        .args(["-c", &script])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("the Meta-World venv's python runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "0.0",
        "{stderr}"
    );
}
