//! Hostile overrides through the real binary: every key of configs/config.yaml gets values of
//! the wrong type, zero, negative, huge, NaN, infinity, empty, unicode and 100 KB long, plus
//! unknown keys. `tdmpc2 train KEY=VALUE --cfg job` validates and resolves without training;
//! each case must exit 0 or 2, never panic, and an exit 2 names the key.
//!
//! By default each key gets a value of its own kind (numbers for a numeric key) and every
//! other key one more of any kind, rotating so that every value reaches several keys: about
//! 150 cases, which keeps the test within a minute on two cores (each process pays about
//! 0.45 s of CPU for loading libtorch). `TDMPC2_FUZZ_ALL=1` runs every key with every value
//! (about 1950 cases, all passing when this was written).
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde_yaml_ng::Value;

/// Cases run against a native task, so that no case pays for starting Python.
const BASE: &[&str] = &["train", "--cfg", "job", "task=Pendulum-v1"];

/// Values hostile to a number: zero, negative, huge, not finite, fractional.
const NUMERIC: &[&str] = &[
    "0",
    "-1",
    "9223372036854775808",
    ".nan",
    "1e300",
    ".inf",
    "18446744073709551616",
    "-1e300",
    "1.5",
    "-.inf",
    "1e5",
    "4294967296",
];

/// Values hostile to anything: wrong types, empty, unicode, unparsable; plus a 100 KB one.
const OTHER: &[&str] = &[
    "abc",
    "",
    "ñ日本→✓",
    "[1, 2]",
    "{a: 1}",
    "true",
    "null",
    "[",
    "-0",
    "0x10",
];

fn hostile_values() -> (Vec<String>, Vec<String>) {
    let numeric = NUMERIC.iter().map(|v| v.to_string()).collect();
    let other = OTHER
        .iter()
        .map(|v| v.to_string())
        .chain(std::iter::once("x".repeat(100 * 1024)))
        .collect();
    (numeric, other)
}

/// The keys of configs/config.yaml, each with whether its default is a number.
fn config_keys() -> Vec<(String, bool)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/config.yaml");
    let text = std::fs::read_to_string(path).expect("configs/config.yaml");
    let tree: Value = serde_yaml_ng::from_str(&text).expect("valid YAML");
    tree.as_mapping()
        .expect("a mapping of keys")
        .iter()
        .map(|(k, v)| (k.as_str().expect("string keys").to_owned(), v.is_number()))
        .collect()
}

/// One case: its overrides, and the key an error must name.
struct Case {
    args: Vec<String>,
    key: String,
}

fn cases() -> Vec<Case> {
    let (numeric, other) = hostile_values();
    let every: Vec<&String> = numeric.iter().chain(&other).collect();
    let all = std::env::var_os("TDMPC2_FUZZ_ALL").is_some();
    let mut cases = Vec::new();
    for (i, (key, is_number)) in config_keys().iter().enumerate() {
        let picked: Vec<&String> = if all {
            every.clone()
        } else {
            let own = if *is_number { &numeric } else { &other };
            let mut picked = vec![&own[i % own.len()]];
            if i % 2 == 0 {
                picked.push(every[(7 * i / 2 + 3) % every.len()]);
            }
            picked
        };
        for value in picked {
            cases.push(Case {
                args: vec![format!("{key}={value}")],
                key: key.clone(),
            });
        }
    }
    let long_key = "k".repeat(100 * 1024);
    for (arg, key) in [
        ("bach_size=1", "bach_size"),
        ("nosuchkey=1", "nosuchkey"),
        ("ñ日本=1", "ñ日本"),
        ("=1", "key is empty"),
        ("lr", "lr"),
        ("task.name=1", "task"),
        ("a.b.c=1", "a.b.c"),
        ("+foo=1", "foo"),
        (&format!("{long_key}=1"), &long_key),
    ] {
        cases.push(Case {
            args: vec![arg.to_owned()],
            key: key.to_owned(),
        });
    }
    // Values that once panicked (issue 11), each with the key its error must name.
    for (args, key) in [
        (&["discount_max=0"][..], "discount_max"),
        (&["discount_min=0.999", "discount_max=0.9"], "discount_max"),
        (&["model_size=null", "num_q=100000000000"], "num_q"),
        (&["num_samples=1000000000000"], "num_samples"),
        (
            &["world_size=64", "device=cpu", "num_threads=1"],
            "world_size",
        ),
        (&["world_size=3", "nnodes=2"], "nnodes"),
        (&["mlp_dim=1048576", "latent_dim=1048576"], "mlp_dim"),
        (&["seed=4294967295", "world_size=2"], "seed"),
        (&["seed=4294967295", "num_envs=2"], "seed"),
    ] {
        cases.push(Case {
            args: args.iter().map(|a| a.to_string()).collect(),
            key: key.to_owned(),
        });
    }
    cases
}

/// What is wrong with one run of the binary, if anything.
fn check(case: &Case) -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(BASE)
        .args(&case.args)
        .output()
        .expect("the tdmpc2 binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let shown: String = stderr.chars().take(400).collect();
    let args: Vec<String> = case
        .args
        .iter()
        .map(|a| a.chars().take(60).collect())
        .collect();
    let problem = match out.status.code() {
        _ if stderr.contains("panicked") || stderr.contains("backtrace") => Some("panicked"),
        Some(0) => serde_yaml_ng::from_slice::<Value>(&out.stdout)
            .is_err()
            .then_some("exit 0 without a YAML config"),
        Some(2) if !stderr.contains(&case.key) => Some("the error does not name the key"),
        Some(2) if stderr.trim().lines().count() != 1 => Some("the error is not one line"),
        Some(2) => None,
        _ => Some("exit code is neither 0 nor 2"),
    };
    problem.map(|p| format!("{args:?}: {p} (exit {:?}): {shown}", out.status.code()))
}

/// Runs the cases on a few threads, one process each.
fn run_all(cases: &[Case]) -> Vec<String> {
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 8);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                if let Some(failure) = check(case) {
                    failures.lock().unwrap().push(failure);
                }
            });
        }
    });
    failures.into_inner().unwrap()
}

#[test]
fn hostile_overrides_exit_cleanly_and_name_the_key() {
    let cases = cases();
    let keys = config_keys().len();
    let started = Instant::now();
    let failures = run_all(&cases);
    eprintln!(
        "fuzzed {} cases over {keys} keys in {:.1} s",
        cases.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(cases.len() >= keys * 3 / 2, "every key is fuzzed");
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Odd but valid settings are accepted, not refused by an over-eager check.
#[test]
fn odd_but_valid_overrides_are_accepted() {
    let cases: &[&[&str]] = &[
        &["steps=1e5"],
        &["exp_name=2024", "wandb_name=7"],
        &["exp_name=ñ日本"],
        &["seed=0"],
        &["batch_size=1", "horizon=1"],
        &["num_pi_trajs=0", "num_elites=1"],
        &["discount_min=0.5", "discount_max=0.5"],
        &["discount_denom=1e-30"],
        &["lr=1e-30", "tau=0", "rho=1", "dropout=0", "temperature=0"],
        &["consistency_coef=0", "entropy_coef=0"],
        &["vmin=-80", "vmax=80", "num_bins=2"],
        &["world_size=2", "steps=402"],
        &["buffer_size=201"],
        &["eval_freq=1", "save_freq=1", "master_port=65535"],
        &["world_size=4", "nnodes=2", "node_rank=1"],
        &["model_size=19.0"],
    ];
    for args in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
            .args(BASE)
            .args(*args)
            .output()
            .expect("the tdmpc2 binary runs");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_yaml_ng::from_slice::<Value>(&out.stdout).expect("YAML");
    }
}
