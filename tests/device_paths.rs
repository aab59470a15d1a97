//! The collectives on every device path. Here: a one-rank run in a forced process group (real
//! gloo collectives) trains exactly as the same run without a group. On a GPU (ignored
//! elsewhere; `scripts/gpu_check.sh` runs them): one rank through NCCL in a forced group, and
//! two ranks sharing one GPU through gloo, each training and checkpointing.
mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{free_port, tdmpc2_bin, tensors, TINY};

/// `train` with the tiny settings for 400 steps, with a checkpoint at the end.
fn tiny_train() -> Vec<&'static str> {
    let run = [
        "steps=400",
        "eval_freq=400",
        "save_freq=400",
        "num_threads=1",
    ];
    [&["train"], TINY, &run].concat()
}

fn train(run_dir: &Path, extra: &[&str]) -> Output {
    Command::new(tdmpc2_bin())
        .args(tiny_train())
        .args(extra)
        .arg(format!("run_dir={}", run_dir.display()))
        .arg(format!("master_port={}", free_port()))
        .output()
        .expect("the tdmpc2 binary runs")
}

fn final_weights(run_dir: &Path) -> Vec<(String, tch::Tensor)> {
    tensors(
        &run_dir
            .join("checkpoints")
            .join("step_000000000400")
            .join("model.safetensors"),
    )
}

fn assert_trained(out: &Output, what: &str) -> String {
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what}: {log}");
    assert!(log.contains("Training finished"), "{what}: {log}");
    log
}

#[test]
fn a_forced_one_rank_group_runs_the_collectives_and_changes_nothing() {
    let (forced, plain) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let out = train(forced.path(), &["dist_force_group=true", "device=cpu"]);
    let log = assert_trained(&out, "forced group");
    assert!(log.contains("collectives: gloo"), "a real group: {log}");
    let out = train(plain.path(), &["device=cpu"]);
    let log = assert_trained(&out, "no group");
    assert!(!log.contains("collectives:"), "no group: {log}");
    let (a, b) = (final_weights(forced.path()), final_weights(plain.path()));
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(
            x.equal(y),
            "{name} differs between the forced group and no group"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
fn one_rank_trains_through_nccl_in_a_forced_group() {
    let dir = tempfile::tempdir().unwrap();
    let out = train(dir.path(), &["device=cuda", "dist_force_group=true"]);
    let log = assert_trained(&out, "NCCL, one rank");
    assert!(log.contains("collectives: cpu:gloo,cuda:nccl"), "{log}");
    assert!(!final_weights(dir.path()).is_empty());
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
fn two_ranks_share_one_gpu_through_gloo() {
    let dir = tempfile::tempdir().unwrap();
    let out = train(
        dir.path(),
        &[
            "device=cuda",
            "dist_backend=gloo",
            "world_size=2",
            "steps=800",
        ],
    );
    let log = assert_trained(&out, "two ranks on one GPU");
    assert!(log.contains("collectives: gloo"), "{log}");
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            dir.path()
                .join("checkpoints")
                .join("step_000000000800")
                .join("meta.json"),
        )
        .expect("the final checkpoint's meta.json"),
    )
    .expect("meta.json is JSON");
    let checksums = meta["rank_checksums"].as_array().expect("rank_checksums");
    assert_eq!(checksums.len(), 2);
    assert_eq!(
        checksums[0], checksums[1],
        "both ranks hold the same learner"
    );
}

/// Collectives on NCCL run inside the update's graph: one rank in a forced NCCL group with two
/// micro-batches per update (the synchronised update, its all-reduces and all-gathers) trains
/// with its updates captured.
#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
fn nccl_collectives_run_inside_the_update_graph() {
    let dir = tempfile::tempdir().unwrap();
    let out = train(
        dir.path(),
        &["device=cuda", "dist_force_group=true", "sync_freq=2"],
    );
    let log = assert_trained(&out, "NCCL inside graphs");
    assert!(log.contains("collectives: cpu:gloo,cuda:nccl"), "{log}");
    assert!(
        log.contains("compile=true: updates run as CUDA graphs"),
        "{log}"
    );
    assert!(!final_weights(dir.path()).is_empty());
}

/// `compile=true` (the default) on one GPU: plans and updates run as CUDA graphs, and a run
/// stopped after step 600 and resumed from its step-400 checkpoint writes the uninterrupted run's
/// step-800 checkpoint; also pipelined (the acting thread drawing from a generator of its own).
#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
fn graphs_train_and_resume_exactly_on_one_gpu() {
    let checkpoint = |run: &Path, step: u64| run.join(format!("checkpoints/step_{step:012}"));
    for extra in [
        &[][..],
        &["pipeline=true", "num_envs=2", "seed_steps=400"][..],
    ] {
        let (whole, split) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // The buffer is saved with each checkpoint and smaller than the shorter run, so both
        // runs sample from the same rows.
        let run = |dir: &Path, more: &[&str]| {
            let settings = ["device=cuda", "save_buffer=true", "buffer_size=500"];
            let args: Vec<&str> = settings.iter().chain(extra).chain(more).copied().collect();
            train(dir, &args)
        };
        let log = assert_trained(&run(whole.path(), &["steps=800"]), "graphs, whole run");
        for what in ["updates", "plans"] {
            let line = format!("compile=true: {what} run as CUDA graphs");
            assert!(log.contains(&line), "{extra:?}: {line}: {log}");
        }
        assert_trained(&run(split.path(), &["steps=600"]), "graphs, first part");
        let same_at = |step: u64, what: &str| {
            let differ = differences(
                &checkpoint(whole.path(), step),
                &checkpoint(split.path(), step),
            );
            assert!(
                differ.is_empty(),
                "{extra:?}: {what} at step {step}: {differ:?}"
            );
        };
        // Before any resume both runs made the same steps: a difference here means the runs are
        // not reproducible at all (thread timing, say), not that resuming lost something.
        same_at(400, "two runs with graphs differ before any resume");
        // As a run killed after step 600 leaves it (a resume from before the latest is refused).
        std::fs::remove_dir_all(checkpoint(split.path(), 600)).unwrap();
        let resume = format!("resume={}", checkpoint(split.path(), 400).display());
        let log = assert_trained(
            &run(split.path(), &["steps=800", &resume]),
            "graphs, resumed",
        );
        assert!(log.contains("Resumed from"), "{extra:?}: {log}");
        same_at(800, "the run resumed from step 400 differs");
    }
}

/// What differs between two checkpoints' model and train state: each tensor that does, with
/// its largest difference.
fn differences(a: &Path, b: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for name in ["model.safetensors", "state.safetensors"] {
        let (a, b) = (tensors(&a.join(name)), tensors(&b.join(name)));
        let keys =
            |t: &[(String, tch::Tensor)]| t.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        if keys(&a) != keys(&b) {
            found.push(format!(
                "{name}: other tensors ({:?} vs {:?})",
                keys(&a),
                keys(&b)
            ));
            continue;
        }
        for ((key, x), (_, y)) in a.iter().zip(&b) {
            if x.size() != y.size() {
                found.push(format!(
                    "{name} {key}: shapes {:?} vs {:?}",
                    x.size(),
                    y.size()
                ));
            } else if !x.equal(y) {
                let diff = (x.to_kind(tch::Kind::Double) - y.to_kind(tch::Kind::Double))
                    .abs()
                    .max()
                    .double_value(&[]);
                found.push(format!("{name} {key}: max |difference| {diff:e}"));
            }
        }
    }
    found
}
