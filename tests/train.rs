//! Training end to end through the real binary, mostly on the native Pendulum-v1 (no Python
//! env): the run directory, exact resume, evaluation of a checkpoint, checkpoints that survive a
//! writer killed at any moment, and one dm_control task.
mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{assert_same_tensors, checkpoint, tensors, TINY};

/// The tiny settings with two planning iterations, a small buffer and one thread.
fn tiny() -> Vec<&'static str> {
    [TINY, &["iterations=2", "buffer_size=2000", "num_threads=1"]].concat()
}

fn tdmpc2(args: &[&str], extra: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(args)
        .args(extra)
        .output()
        .expect("the tdmpc2 binary runs")
}

fn train(run_dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["train"];
    args.extend(tiny());
    args.extend_from_slice(extra);
    let out = tdmpc2(&args, &[format!("run_dir={}", run_dir.display())]);
    assert!(
        out.status.success(),
        "training failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn a_run_writes_config_metrics_and_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let out = train(dir.path(), &["steps=600", "eval_freq=400", "save_freq=400"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("eval") && l.contains("I: 400 ")),
        "{stdout}"
    );

    let config: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.path().join("config.yaml")).unwrap())
            .unwrap();
    assert_eq!(
        config["obs_shape"][0].as_u64(),
        Some(3),
        "the resolved config is saved"
    );
    let metrics = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let evals: Vec<u64> = lines
        .iter()
        .filter(|l| l["phase"] == "eval")
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(
        evals,
        [0, 400],
        "eval at step 0 and at the first episode end after 400"
    );
    let trains = lines.iter().filter(|l| l["phase"] == "train").count();
    assert_eq!(trains, 3, "three 200-step episodes");
    assert!(
        lines
            .iter()
            .any(|l| l["phase"] == "train" && l["grad_norm"].is_number()),
        "update info is logged"
    );
    let eval_csv = std::fs::read_to_string(dir.path().join("eval.csv")).unwrap();
    assert!(
        eval_csv.starts_with("step,") && eval_csv.lines().count() == 3,
        "{eval_csv}"
    );

    for step in [400, 600] {
        let ckpt = checkpoint(dir.path(), step);
        let model = tensors(&ckpt.join("model.safetensors"));
        assert!(
            model.iter().any(|(n, _)| n == "_encoder.state.0.weight"),
            "official key names"
        );
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(ckpt.join("meta.json")).unwrap()).unwrap();
        assert_eq!(meta["global_step"], step);
    }
}

/// The last evaluation point may fall mid-episode (500 steps of 200-step episodes): it is
/// still evaluated, at the end, as the official trainer evaluates at its last step.
#[test]
fn the_last_evaluation_point_is_evaluated_even_mid_episode() {
    let dir = tempfile::tempdir().unwrap();
    train(
        dir.path(),
        &["steps=500", "eval_freq=500", "eval_episodes=1"],
    );
    let evals: Vec<u64> = common::metrics(dir.path())
        .iter()
        .filter(|l| l["phase"] == "eval")
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(evals, [0, 500]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(
            &std::fs::read(checkpoint(dir.path(), 500).join("meta.json")).unwrap()
        )
        .unwrap()["eval_due"],
        false
    );
}

#[test]
fn a_resumed_run_makes_exactly_the_same_updates() {
    // The first run ends at a checkpoint point, and acts and learns there once more: its final
    // checkpoint is still the one of that point.
    assert_resume_is_exact(&[], 800, 800);
}

#[test]
fn a_resumed_pipelined_run_makes_exactly_the_same_updates() {
    assert_resume_is_exact(&["pipeline=true"], 600, 400);
}

/// Seeding ends at the step-400 checkpoint, where new episodes began with a random action: the
/// first plans of those episodes shift the warm start the evaluation at step 400 left, which
/// the checkpoint must keep.
#[test]
fn a_resumed_run_with_several_environments_makes_exactly_the_same_updates() {
    let split = assert_resume_is_exact(&["num_envs=2", "seed_steps=400"], 600, 400);
    let state = tensors(&checkpoint(split.path(), 400).join("state.safetensors"));
    let (_, warm_start) = state
        .iter()
        .find(|(name, _)| name == "warm_start")
        .expect("the checkpoint keeps the planner's warm start");
    assert_eq!(warm_start.size()[0], 1, "one row per rank");
    assert!(
        warm_start.abs().sum(tch::Kind::Double).double_value(&[]) > 0.0,
        "the evaluation's plans left a warm start"
    );
}

/// The CPU as the golden run's recordings name it: vendor, family, model and whether it has
/// AVX-512. Pinned to AVX2 code paths, torch and MKL still compute other floats on other CPUs
/// (the same eval returns at step 400, other learner checksums at step 600), so each CPU kind
/// has its own recording.
fn cpu_kind() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().map(str::trim) == Some(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    let avx512 = field("flags").split(' ').any(|f| f == "avx512f");
    format!(
        "{} family {} model {} ({}){}",
        field("vendor_id"),
        field("cpu family"),
        field("model"),
        field("model name"),
        if avx512 { " avx512" } else { "" }
    )
}

/// The default loop (num_envs=1, pipeline=false) trains bit for bit what it trained when it was
/// recorded (re-recorded only by a change meant to change the draws or the floats): the learner
/// checksums and evaluation returns recorded then, on a CPU of the same kind. On a kind with no recording it says so in one line and checks what every
/// kind computes alike: the returns of the first evaluation.
#[test]
fn the_default_loop_reproduces_the_recorded_run() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/golden_pendulum.json"
    );
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["train"];
    args.extend(TINY);
    args.extend(["steps=600", "eval_freq=400", "num_threads=1"]);
    // Torch's own kernels, oneDNN's and MKL's (conditional numerical reproducibility) pinned
    // to one code path each, the same on every x86 CPU with AVX2.
    let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(&args)
        .arg(format!("run_dir={}", dir.path().display()))
        .env("ATEN_CPU_CAPABILITY", "avx2")
        .env("ONEDNN_MAX_CPU_ISA", "AVX2")
        .env("MKL_CBWR", "COMPATIBLE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(checkpoint(dir.path(), 600).join("meta.json")).unwrap(),
    )
    .unwrap();
    let evals = std::fs::read_to_string(dir.path().join("eval.csv")).unwrap();
    let column = |name: &str| -> Vec<f64> {
        let header = evals.lines().next().unwrap();
        let i = header.split(',').position(|c| c == name).unwrap();
        let value = |l: &str| l.split(',').nth(i).unwrap().parse().unwrap();
        evals.lines().skip(1).map(value).collect()
    };
    assert!(
        evals.starts_with("step,episode_reward,"),
        "the official's first columns"
    );
    let run = serde_json::json!({
        "learner_parts": meta["learner_parts"],
        "eval": column("step").iter().zip(column("episode_reward")).map(|(&step, r)| {
            serde_json::json!({"step": step as u64, "episode_reward": r})
        }).collect::<Vec<_>>(),
    });
    let cpu = cpu_kind();
    let recordings = golden["recordings"].as_object().unwrap();
    // A change that is meant to change the draws or the floats re-records the run on this CPU
    // kind (and drops the others' recordings, which it no longer reproduces):
    // TDMPC2_RECORD_GOLDEN="why" cargo test --release --test train the_default_loop -- --nocapture
    if let Ok(about) = std::env::var("TDMPC2_RECORD_GOLDEN") {
        let mut recordings = recordings.clone();
        if !about.starts_with('+') {
            recordings.clear();
        }
        let mut run = run;
        run["about"] = about.trim_start_matches('+').into();
        recordings.insert(cpu, run);
        let record = serde_json::json!({"how": golden["how"], "recordings": recordings});
        let text = serde_json::to_string_pretty(&record).unwrap() + "\n";
        std::fs::write(path, text).unwrap();
        eprintln!("RECORDED {path}: the comparison did not run");
        return;
    }
    match recordings.get(&cpu) {
        Some(recorded) => {
            assert_eq!(
                run["learner_parts"], recorded["learner_parts"],
                "the learner state after 600 steps differs from the one recorded on this CPU \
                 kind ({cpu})"
            );
            assert_eq!(run["eval"], recorded["eval"]);
        }
        None => {
            let first = |run: &serde_json::Value| run["eval"][0].clone();
            for (kind, recorded) in recordings {
                assert_eq!(first(&run), first(recorded), "first evaluation vs {kind}");
            }
            common::not_checked(&format!(
                "the golden run past its first evaluation: none is recorded on this CPU kind \
                 ({cpu}); TDMPC2_RECORD_GOLDEN=\"+why\" adds one"
            ));
        }
    }
}

/// A run stopped and resumed from a checkpoint writes the same later checkpoints as the
/// uninterrupted run, with `extra` settings on both. Returns the resumed run's directory.
fn assert_resume_is_exact(extra: &[&str], first_steps: u64, resume_at: u64) -> tempfile::TempDir {
    // buffer_size below the shorter run's steps: both runs have the same buffer capacity.
    let mut settings = vec![
        "save_freq=400",
        "eval_freq=400",
        "save_buffer=true",
        "buffer_size=500",
    ];
    settings.extend_from_slice(extra);
    let whole = tempfile::tempdir().unwrap();
    let mut args = settings.to_vec();
    args.push("steps=1000");
    train(whole.path(), &args);

    // The same run ended at step `first_steps`, then resumed from its checkpoint of step
    // `resume_at` to step 1000. Later checkpoints go first, as a run killed before writing them
    // leaves it (a resume from before the latest is refused).
    let split = tempfile::tempdir().unwrap();
    let first_steps = format!("steps={first_steps}");
    train(
        split.path(),
        &[&settings[..], &[first_steps.as_str()]].concat(),
    );
    for saved in std::fs::read_dir(split.path().join("checkpoints")).unwrap() {
        let saved = saved.unwrap().path();
        if saved > checkpoint(split.path(), resume_at) {
            std::fs::remove_dir_all(saved).unwrap();
        }
    }
    let resume = format!("resume={}", checkpoint(split.path(), resume_at).display());
    let mut second = settings.to_vec();
    second.extend(["steps=1000", resume.as_str()]);
    let out = train(split.path(), &second);
    assert!(String::from_utf8_lossy(&out.stderr).contains("Resumed from"));

    // The logs hold each step once, as the uninterrupted run's: the rows the first run wrote
    // past the checkpoint are gone.
    let rows = |run: &Path| -> Vec<(String, u64)> {
        let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
        (text.lines())
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .map(|row| (row["phase"].to_string(), row["step"].as_u64().unwrap()))
            .collect()
    };
    assert_eq!(rows(split.path()), rows(whole.path()));
    for step in [800, 1000] {
        let (a, b) = (
            checkpoint(whole.path(), step),
            checkpoint(split.path(), step),
        );
        assert_same_tensors(&a.join("model.safetensors"), &b.join("model.safetensors"));
        assert_same_tensors(&a.join("state.safetensors"), &b.join("state.safetensors"));
    }
    split
}

/// Resumed mid-episode without replay buffers, before seeding ends: the buffer has no episode
/// when seeding ends (step 400; the next episode ends at 500), and the run pretrains once it
/// has one instead of never, even when a run ends in between (at 450, past seeding with no
/// update made: the pretraining is still owed, made at 650, when the first episode after that
/// resume ends).
#[test]
fn a_resume_without_buffers_pretrains_once_the_buffer_can_give_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let settings = ["seed_steps=400", "eval_freq=100000", "eval_episodes=1"];
    train(dir.path(), &[&settings[..], &["steps=300"]].concat());
    let resume = |steps: &str| {
        let out = train(
            dir.path(),
            &[&settings[..], &[steps, "resume=auto"]].concat(),
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let waiting = resume("steps=450");
    assert!(
        waiting.contains("without replay buffers") && !waiting.contains("Pretraining"),
        "{waiting}"
    );
    // Said at the start (150 steps left, an episode is 200) and at the end.
    assert!(
        waiting.contains("150 steps left, fewer than an episode (200): it makes no update")
            && waiting.contains("no update was made"),
        "{waiting}"
    );
    let owed = resume("steps=700");
    assert!(
        owed.contains("Pretraining agent on seed data (400 updates)"),
        "{owed}"
    );
    assert!(
        !owed.contains("makes no update") && !owed.contains("no update was made"),
        "{owed}"
    );
    // Resumed after its updates, again without buffers: none more, said at the end too.
    let trained = resume("steps=750");
    assert!(
        trained.contains("50 steps left") && trained.contains("no update was made"),
        "{trained}"
    );
}

#[test]
fn a_resume_passes_over_buffers_not_saved_with_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let settings = ["save_freq=400", "eval_freq=100000"];
    train(
        dir.path(),
        &[&settings[..], &["steps=400", "save_buffer=true"]].concat(),
    );
    std::fs::remove_dir_all(dir.path().join("checkpoints")).unwrap();
    std::fs::remove_file(dir.path().join("metrics.jsonl")).unwrap();
    // A fresh start removes the buffers of its directory: this one comes back after it, as
    // another run's of the same step.
    let buffers = dir.path().join("buffers");
    let aside = dir.path().join("buffers-aside");
    std::fs::rename(&buffers, &aside).unwrap();
    train(dir.path(), &[&settings[..], &["steps=400"]].concat());
    let _ = std::fs::remove_dir_all(&buffers);
    std::fs::rename(&aside, &buffers).unwrap();
    let out = train(
        dir.path(),
        &[&settings[..], &["steps=800", "resume=auto"]].concat(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stale = dir.path().join("buffers/rank0/step_000000000400");
    assert!(
        stderr.contains(&format!(
            "{} is not the replay buffer saved with the checkpoint of step 400",
            stale.display()
        )) && stderr.contains("resuming without replay buffers: the checkpoint saved none"),
        "{stderr}"
    );
}

/// Continued from another run's checkpoint of the step it holds its own of, a run writes its
/// own again: keeping the old one would make a restart (`resume=auto`) continue the run's
/// former learner instead of the one it was given.
#[test]
fn a_run_continued_from_another_runs_checkpoint_of_its_step_saves_its_own_again() {
    let (own, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let settings = ["steps=400", "save_freq=400", "eval_freq=100000"];
    train(own.path(), &settings);
    train(other.path(), &[&settings[..], &["seed=2"]].concat());
    let model = |run: &Path| std::fs::read(checkpoint(run, 400).join("model.safetensors")).unwrap();
    let former = model(own.path());
    assert_ne!(former, model(other.path()));

    let resume = format!("resume={}", checkpoint(other.path(), 400).display());
    train(own.path(), &[&settings[..], &[resume.as_str()]].concat());
    assert_ne!(model(own.path()), former);
}

/// A folder of the user's own, holding files a run writes, is refused before anything runs, and
/// keeps them as they were: a run would have replaced its config.yaml and added its rows to
/// the CSVs under the user's headers.
#[test]
fn a_folder_of_files_no_run_wrote_is_refused_as_a_run_dir() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        ("config.yaml", "my: settings\n"),
        ("train.csv", "a,b\n1,2\n"),
    ];
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let mut args = vec!["train"];
    args.extend(tiny());
    args.push("steps=300");
    let out = tdmpc2(&args, &[format!("run_dir={}", dir.path().display())]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("holds config.yaml, train.csv but no run recorded there"),
        "{stderr}"
    );
    for (name, text) in files {
        assert_eq!(
            std::fs::read_to_string(dir.path().join(name)).unwrap(),
            text
        );
    }
    assert!(!dir.path().join("metrics.jsonl").exists());
}

/// A saved replay buffer whose bytes changed is refused on resume, naming the file and the way
/// out; moved away, the run resumes without it.
#[test]
fn a_damaged_replay_buffer_is_refused_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let settings = ["save_freq=400", "eval_freq=100000", "save_buffer=true"];
    train(dir.path(), &[&settings[..], &["steps=400"]].concat());
    let saved = dir.path().join("buffers/rank0/step_000000000400");
    let file = saved.join("buffer.safetensors");
    common::damage_middle(&file);
    let mut args = vec!["train"];
    args.extend(tiny());
    args.extend_from_slice(&settings);
    let resume = |extra: &[&str]| {
        let extra: Vec<String> = [format!("run_dir={}", dir.path().display())]
            .into_iter()
            .chain(extra.iter().map(|s| s.to_string()))
            .collect();
        tdmpc2(&args, &extra)
    };
    let out = resume(&["steps=800", "resume=auto"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{} is damaged", file.display())),
        "{stderr}"
    );
    std::fs::rename(&saved, dir.path().join("damaged-buffer")).unwrap();
    let out = resume(&["steps=800", "resume=auto"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("without replay buffers: none was found"),
        "{stderr}"
    );
}

fn meta(checkpoint: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(checkpoint.join("meta.json")).unwrap()).unwrap()
}

/// The run's last checkpoint is taken with the next episode started, never played: a run
/// resumed from it logs and saves the episodes finished, as the uninterrupted run does.
#[test]
fn a_run_resumed_from_its_end_counts_only_finished_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let quick = ["eval_freq=1000000", "eval_episodes=1"];
    train(dir.path(), &[&quick[..], &["steps=400"]].concat());
    let ended = meta(&checkpoint(dir.path(), 400));
    assert_eq!(ended["episodes"], 2, "{ended}");
    assert_eq!(
        ended["env_episodes"],
        serde_json::json!([[3]]),
        "one started"
    );
    for (steps, finished) in [(600, 3), (800, 4)] {
        let steps = format!("steps={steps}");
        train(dir.path(), &[&quick[..], &[&steps, "resume=auto"]].concat());
        let rows = std::fs::read_to_string(dir.path().join("train.csv")).unwrap();
        let last = rows.lines().last().unwrap();
        assert_eq!(
            last.split(',').nth(3),
            Some(&*finished.to_string()),
            "{rows}"
        );
    }
    assert_eq!(meta(&checkpoint(dir.path(), 800))["episodes"], 4);
}

#[test]
fn eval_loads_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    train(dir.path(), &["steps=400", "eval_freq=400", "save_freq=400"]);
    let mut args = vec!["eval"];
    args.extend(tiny());
    let out = tdmpc2(
        &args,
        &[
            format!("checkpoint={}", dir.path().display()),
            "eval_episodes=3".into(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(json["episodes"], 3);
    assert!(
        json["mean"].as_f64().unwrap() < 0.0,
        "Pendulum returns are negative: {stdout}"
    );

    let out = tdmpc2(&args, &["checkpoint=/nonexistent".into()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("checkpoint=/nonexistent"));
}

#[test]
fn a_killed_writer_never_leaves_a_checkpoint_that_loads_half_written() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = format!("run_dir={}", dir.path().display());
    // Large model (5M parameters, ~60 MB per checkpoint) saved after every episode: a kill
    // lands inside a write often.
    let mut args = vec!["train"];
    args.extend(tiny());
    args.extend([
        "model_size=5",
        "mpc=false",
        "steps=100000",
        "save_freq=200",
        "seed_steps=100000",
        "eval_freq=100000",
    ]);
    let checkpoints = dir.path().join("checkpoints");
    // `pid` is writing a checkpoint: its temporary directory is there.
    let writing = |pid: u32| {
        std::fs::read_dir(&checkpoints).is_ok_and(|entries| {
            entries.flatten().any(|entry| {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                name.starts_with(".tmp-") && name.ends_with(&format!("-{pid}"))
            })
        })
    };
    for attempt in 0..4usize {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
            .args(&args)
            .arg(&run_dir)
            .arg(if attempt == 0 {
                "resume=null"
            } else {
                "resume=auto"
            })
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Killed a different time into one of its writes (timed from the write, not from the
        // start: a loaded machine starts slowly); the last attempt once a checkpoint landed.
        let started = Instant::now();
        let ready = |pid| match attempt {
            3 => tdmpc2::checkpoint::store::latest(&checkpoints).is_some(),
            _ => writing(pid),
        };
        while !ready(child.id()) && started.elapsed() < Duration::from_secs(180) {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis([0, 30, 90, 0][attempt]));
        child.kill().unwrap(); // SIGKILL: no handler runs
        child.wait().unwrap();
        let Some((_, latest)) = tdmpc2::checkpoint::store::latest(&dir.path().join("checkpoints"))
        else {
            continue;
        };
        for file in ["model.safetensors", "state.safetensors"] {
            assert!(
                !tensors(&latest.join(file)).is_empty(),
                "{} loads",
                latest.join(file).display()
            );
        }
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(latest.join("meta.json")).unwrap()).unwrap();
        assert!(meta["global_step"].as_u64().unwrap() > 0);
    }
    assert!(
        tdmpc2::checkpoint::store::latest(&dir.path().join("checkpoints")).is_some(),
        "some checkpoint landed"
    );
}

#[test]
fn a_dm_control_task_trains_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = tdmpc2(
        &[
            "train",
            "task=cartpole-swingup",
            "model_size=1",
            "steps=1000",
            "seed_steps=500",
            "batch_size=16",
            "num_samples=32",
            "num_elites=4",
            "num_pi_trajs=2",
            "iterations=1",
            "eval_freq=1000",
            "eval_episodes=1",
            "num_threads=1",
            "enable_tensorboard=false",
        ],
        &[format!("run_dir={}", dir.path().display())],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metrics = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let trains: Vec<&serde_json::Value> = lines.iter().filter(|l| l["phase"] == "train").collect();
    assert_eq!(
        trains.len(),
        2,
        "two 500-step episodes (1000 env steps each)"
    );
    for t in &trains {
        assert_eq!(t["episode_length"], 500.0);
        let r = t["episode_reward"].as_f64().unwrap();
        assert!((0.0..=500.0).contains(&r), "a cartpole return: {r}");
    }
    assert!(trains[1]["grad_norm"].is_number(), "updates ran");
    let evals: Vec<u64> = lines
        .iter()
        .filter(|l| l["phase"] == "eval")
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(evals, [0, 1000]);
    let config = std::fs::read_to_string(dir.path().join("config.yaml")).unwrap();
    assert!(config.contains("cartpole-swingup"), "{config}");
    assert!(checkpoint(dir.path(), 1000)
        .join("model.safetensors")
        .is_file());
    for file in ["train.csv", "eval.csv"] {
        assert!(dir.path().join(file).is_file(), "{file}");
    }
}

/// `lr=1e30` diverges in the first updates: the run stops with an error naming the step and
/// the non-finite losses, without a panic, and keeps only the checkpoint of the good state. It
/// is not restarted (exit 4): from that checkpoint it would diverge again.
#[test]
fn a_diverging_run_stops_cleanly_with_the_last_good_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["train"];
    args.extend(tiny());
    // The checkpoint at step 400 precedes the first update (pretraining at each rank's 200).
    args.extend_from_slice(&[
        "steps=1000",
        "save_freq=200",
        "eval_freq=1000",
        "lr=1e30",
        "world_size=2",
        "max_restarts=2",
    ]);
    let out = tdmpc2(
        &args,
        &[
            format!("run_dir={}", dir.path().display()),
            format!("master_port={}", common::free_port()),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("training diverged at step 800") && stderr.contains("_loss=NaN"),
        "{stderr}"
    );
    assert!(
        stderr.contains("not restarted") && !stderr.contains("restarting every rank"),
        "{stderr}"
    );
    let saved: Vec<String> = std::fs::read_dir(dir.path().join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("step_"))
        .collect();
    assert_eq!(
        saved,
        ["step_000000000400"],
        "no checkpoint of the diverged state"
    );
    for (name, t) in tensors(&checkpoint(dir.path(), 400).join("model.safetensors")) {
        let finite = t.isfinite().all().int64_value(&[]) == 1;
        assert!(finite, "{name} is not finite in the last good checkpoint");
    }
}
