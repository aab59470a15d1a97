//! The configuration through the real binary: `--cfg job`, config files, and every
//! validation error (exit code 2, one clear line, no panic).
use std::process::{Command, Output};

fn tdmpc2(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(args)
        .output()
        .expect("the tdmpc2 binary runs")
}

fn rejected(args: &[&str]) -> String {
    let out = tdmpc2(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?} should exit 2; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    assert!(!stderr.contains("backtrace"), "{args:?}: {stderr}");
    stderr
}

fn job(args: &[&str]) -> serde_yaml_ng::Value {
    let mut all = vec!["train", "--cfg", "job"];
    all.extend_from_slice(args);
    let out = tdmpc2(&all);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_yaml_ng::from_slice(&out.stdout).expect("--cfg job prints YAML")
}

#[test]
fn cfg_job_prints_the_derived_fields() {
    let c = job(&["task=Pendulum-v1", "model_size=1", "steps=5000"]);
    assert_eq!(
        c["obs_shape"],
        serde_yaml_ng::from_str::<serde_yaml_ng::Value>("[3]").unwrap()
    );
    assert_eq!(c["action_dim"].as_u64(), Some(1));
    assert_eq!(c["episode_length"].as_u64(), Some(200));
    assert_eq!(c["discount"].as_f64(), Some(0.975));
    assert_eq!(c["seed_steps"].as_u64(), Some(1000));
    assert_eq!(c["iterations"].as_u64(), Some(6));
    assert_eq!(c["steps"].as_u64(), Some(5000));
    assert_eq!(c["mlp_dim"].as_u64(), Some(384));
}

#[test]
fn cfg_job_on_dmc_tasks() {
    let c = job(&["task=walker-run"]);
    assert_eq!(c["action_dim"].as_u64(), Some(6));
    assert_eq!(c["episode_length"].as_u64(), Some(500));
    assert_eq!(c["discount"].as_f64(), Some(0.99));
    assert_eq!(c["seed_steps"].as_u64(), Some(2500));
    assert_eq!(c["iterations"].as_u64(), Some(6));
    let c = job(&["task=humanoid-walk"]);
    assert_eq!(c["action_dim"].as_u64(), Some(21));
    assert_eq!(
        c["iterations"].as_u64(),
        Some(8),
        "two more iterations when action_dim >= 20"
    );
}

#[test]
fn config_name_lays_a_file_over_the_defaults() {
    let c = job(&["--config-name=config_ddp", "task=Pendulum-v1"]);
    assert_eq!(c["world_size"].as_u64(), Some(8));
    assert_eq!(
        c["batch_size"].as_u64(),
        Some(256),
        "untouched keys keep the defaults"
    );
    let c = job(&[
        "--config-name",
        "config_ddp",
        "task=Pendulum-v1",
        "world_size=2",
    ]);
    assert_eq!(
        c["world_size"].as_u64(),
        Some(2),
        "overrides win over the file"
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mine.yaml"), "horizon: 5\nbach_size: 3\n").unwrap();
    let path = dir.path().to_str().unwrap();
    let e = rejected(&[
        "train",
        "--config-path",
        path,
        "--config-name",
        "mine",
        "--cfg",
        "job",
    ]);
    assert!(e.contains("did you mean 'batch_size'"), "{e}");
    let e = rejected(&["train", "--config-name", "nope", "--cfg", "job"]);
    assert!(e.contains("config_ddp"), "lists the available files: {e}");
}

#[test]
fn every_validation_error_is_clear() {
    let cases: &[(&str, &str)] = &[
        ("batch_siz=4", "did you mean 'batch_size'"),
        ("batch_size=four", "wrong type for 'batch_size'"),
        ("mpc=3", "wrong type for 'mpc'"),
        ("batch_size=0", "batch_size=0 is out of range: must be >= 1"),
        ("horizon=0", "horizon=0 is out of range: must be >= 1"),
        ("world_size=0", "world_size=0 is out of range: must be >= 1"),
        ("sync_freq=0", "sync_freq=0 is out of range: must be >= 1"),
        ("rho=0", "0 < rho <= 1"),
        ("rho=1.01", "0 < rho <= 1"),
        (
            "num_pi_trajs=512",
            "num_pi_trajs=512 is out of range: must be < num_samples (512)",
        ),
        (
            "num_elites=600",
            "num_elites=600 is out of range: must be <= num_samples (512)",
        ),
        (
            "min_std=2.5",
            "min_std=2.5 is out of range: must be <= max_std (2)",
        ),
        ("model_size=3", "valid sizes: 1, 5, 19, 48, 317"),
        ("task=walker-runn", "walker-run"),
        ("novalue", "overrides are key=value"),
        ("lr_scale=cubic", "allowed: none, linear, sqrt"),
        ("seed_steps=10", "seed_steps=10 is out of range"),
    ];
    for (arg, needle) in cases {
        let e = rejected(&["train", "--cfg", "job", arg]);
        assert!(e.contains(needle), "{arg}: expected '{needle}' in: {e}");
        assert_eq!(e.trim().lines().count(), 1, "{arg}: one line: {e}");
    }
}
