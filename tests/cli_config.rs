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
    std::fs::create_dir(dir.path().join("folder.yaml")).unwrap();
    let e = rejected(&[
        "train",
        "--config-path",
        path,
        "--config-name",
        "folder",
        "--cfg",
        "job",
    ]);
    assert!(
        e.contains("folder.yaml (available") && e.contains("a directory"),
        "{e}"
    );
    assert!(
        !e.contains(": folder"),
        "a directory is not listed as a config: {e}"
    );
    let e = rejected(&[
        "train",
        "--config-path",
        "/nonexistent/configs",
        "--config-name",
        "x",
        "--cfg",
        "job",
    ]);
    assert!(
        e.contains("the config directory \"/nonexistent/configs\" does not exist"),
        "{e}"
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    let file = file.path().to_str().unwrap();
    let e = rejected(&[
        "train",
        "--config-path",
        file,
        "--config-name",
        "x",
        "--cfg",
        "job",
    ]);
    assert!(
        e.contains(&format!(
            "the config directory {file:?} is a file, not a directory"
        )),
        "{e}"
    );
    for dir in ["/nonexistent", ""] {
        let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
            .args(["train", "--config-name", "x", "--cfg", "job"])
            .env("TDMPC2_CONFIG_DIR", dir)
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{e}");
        assert!(
            e.contains(&format!("the config directory {dir:?} does not exist"))
                && e.contains("(TDMPC2_CONFIG_DIR, or --config-path sets it)"),
            "{e}"
        );
    }

    // A hydra file as the official and seed-project ones are written: its defaults list (the
    // base config, hydra's launcher) and its "???" (to be given) read as what they mean here;
    // the official file's derived fields, all "???", resolve for any task.
    let hydra = "defaults:\n  - config\n  - override hydra/launcher: submitit_local\n  - _self_\n\
                 \ntask: dog-run\nhorizon: 5\nmodel_size: ???\ndata_dir: ???\n\
                 obs_shape: ???\naction_dim: ???\nepisode_length: ???\nseed_steps: ???\n";
    std::fs::write(dir.path().join("hydra.yaml"), hydra).unwrap();
    let c = job(&[
        "--config-path",
        path,
        "--config-name",
        "hydra",
        "task=Pendulum-v1",
    ]);
    assert_eq!(c["horizon"].as_u64(), Some(5));
    assert!(c["data_dir"].is_null(), "??? keeps the default");
    let other = "defaults:\n  - my_other_config\n";
    std::fs::write(dir.path().join("other.yaml"), other).unwrap();
    let e = rejected(&[
        "train",
        "--config-path",
        path,
        "--config-name",
        "other",
        "--cfg",
        "job",
    ]);
    assert!(e.contains("defaults entry my_other_config"), "{e}");

    // A run's saved config.yaml holds what its task derived (dog-run: two more iterations):
    // taken again for its task it is the same run's; for another it is refused.
    let saved = tdmpc2(&["train", "task=dog-run", "--cfg", "job"]);
    std::fs::write(dir.path().join("dog.yaml"), &saved.stdout).unwrap();
    let c = job(&["--config-path", path, "--config-name", "dog"]);
    assert_eq!(c["iterations"].as_u64(), Some(8));
    let e = rejected(&[
        "train",
        "--config-path",
        path,
        "--config-name",
        "dog",
        "task=walker-run",
        "--cfg",
        "job",
    ]);
    assert!(e.contains("is a config resolved for task=dog-run"), "{e}");
}

/// scripts/run_ddp.sh, the seed project's one-line launcher: TASK MODEL_SIZE [WORLD_SIZE]
/// [SYNC_FREQ] land on their keys over config_ddp's, and the rest (overrides, options) passes on.
#[test]
fn run_ddp_sh_puts_its_arguments_on_their_keys() {
    let run = |args: &[&str]| {
        Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/run_ddp.sh"))
            .args(args)
            .env("TDMPC2_SKIP_BUILD", "1")
            .env("TDMPC2_BIN", env!("CARGO_BIN_EXE_tdmpc2"))
            .output()
            .expect("scripts/run_ddp.sh runs")
    };
    // model_size, world_size, sync_freq, steps and eval_freq, after checking the task.
    let job = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--cfg", "job"]);
        let out = run(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        let c: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&out.stdout).expect("YAML");
        assert_eq!(c["task"].as_str(), Some("walker-run"), "{args:?}");
        [
            "model_size",
            "world_size",
            "sync_freq",
            "steps",
            "eval_freq",
        ]
        .map(|k| c[k].as_u64())
    };
    let given = job(&["walker-run", "5", "2", "4", "steps=20000"]);
    assert_eq!(given, [5, 2, 4, 20_000, 100_000].map(Some));
    let defaults = job(&["walker-run", "1", "steps=20000"]);
    assert_eq!(defaults, [1, 8, 1, 20_000, 100_000].map(Some));
    let option_next = job(&["walker-run", "1"]);
    assert_eq!(option_next[1], Some(8), "an option is not a world size");
    // Another config file instead of config_ddp: the defaults' eval_freq, not config_ddp's.
    let other = job(&["walker-run", "1", "--config-name=config", "steps=20000"]);
    assert_eq!(other, [1, 8, 1, 20_000, 50_000].map(Some));
    // A folder of one's own alone: its config.yaml, as the binary reads it.
    let mine = tempfile::tempdir().unwrap();
    std::fs::write(mine.path().join("config.yaml"), "eval_freq: 7000\n").unwrap();
    let folder = mine.path().to_str().unwrap();
    for flag in ["--config-path", "-cp", "-cd"] {
        let own = job(&["walker-run", "1", flag, folder, "steps=20000"]);
        assert_eq!(own, [1, 8, 1, 20_000, 7_000].map(Some), "{flag}");
    }
    // Local ranks even inside a SLURM step, unless the user says otherwise.
    let launcher = |args: &[&str]| {
        let out = run(&[args, &["--cfg", "job"]].concat());
        let c: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&out.stdout).expect("YAML");
        c["launcher"].as_str().map(String::from)
    };
    assert_eq!(launcher(&["walker-run", "1"]).as_deref(), Some("builtin"));
    assert_eq!(
        launcher(&["walker-run", "1", "launcher=torchrun"]).as_deref(),
        Some("torchrun")
    );
    let out = run(&["walker-run"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage:"));
    for help in ["--help", "-h"] {
        let out = run(&[help]);
        assert_eq!(out.status.code(), Some(0), "{help}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("usage:"),
            "{help}"
        );
    }
    for (args, named) in [
        (&["walker-run", "5", "two"][..], "WORLD_SIZE is 'two'"),
        (&["walker-run", "five"], "MODEL_SIZE is 'five'"),
        (&["walker-run", "5", "8", "0"], "SYNC_FREQ is '0'"),
        (&["walker-run", "5", "-2"], "WORLD_SIZE is '-2'"),
        (&["walker-run", "5", "8", "-1"], "SYNC_FREQ is '-1'"),
    ] {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
    }
}

/// scripts/collect_dataset.sh checks EPISODES before its setup and runs the binary TDMPC2_BIN
/// names.
#[test]
fn collect_dataset_sh_checks_its_arguments_first_and_runs_the_given_binary() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str], bin: &str| {
        Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/collect_dataset.sh"
        ))
        .args(args)
        .env("TDMPC2_BIN", bin)
        .output()
        .expect("scripts/collect_dataset.sh runs")
    };
    let out_dir = dir.path().join("data");
    let out_dir = out_dir.to_str().unwrap();
    for episodes in ["x", "0", "-3"] {
        let out = run(&[out_dir, episodes], "/nonexistent/tdmpc2");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!("EPISODES is '{episodes}'")),
            "{stderr}"
        );
    }
    for folder in ["", " ", "--help"] {
        let out = run(&[folder, "1"], "/nonexistent/tdmpc2");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!("OUT_DIR is '{folder}'")),
            "{stderr}"
        );
    }
    let out = run(
        &[out_dir, "1", "task=Pendulum-v1"],
        env!("CARGO_BIN_EXE_tdmpc2"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::path::Path::new(out_dir).join("chunk_0.pt").is_file());
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

/// `eval` and `collect` play one process: their help lists no sweep, and a sweep's options are
/// refused as unknown (collect prints no config either).
#[test]
fn eval_and_collect_take_only_what_they_use() {
    for verb in ["eval", "collect"] {
        let help = String::from_utf8_lossy(&tdmpc2(&[verb, "--help"]).stdout).into_owned();
        assert!(help.contains("--config-name"), "{help}");
        assert!(
            !help.contains("--multirun") && !help.contains("--jobs"),
            "{help}"
        );
    }
    let e = rejected(&["eval", "-m", "seed=1,2"]);
    assert!(e.contains("unexpected argument '-m'"), "{e}");
    let e = rejected(&["collect", "--out", "x", "--episodes", "1", "--cfg", "job"]);
    assert!(e.contains("unexpected argument '--cfg'"), "{e}");
}

/// A mistyped `resume` path is refused before the run directory is made, by one process and
/// by the built-in launcher before it starts any rank: nothing is left behind to clean up.
#[test]
fn a_resume_path_naming_no_checkpoint_leaves_no_run_dir() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let missing = dir.path().join("no-such-run");
    for world in ["world_size=1", "world_size=2"] {
        let e = rejected(&[
            "train",
            "task=pendulum-swingup",
            world,
            &format!("run_dir={}", run_dir.display()),
            &format!("resume={}", missing.display()),
        ]);
        assert!(
            e.contains(&format!(
                "resume={}: not a checkpoint directory",
                missing.display()
            )),
            "{world}: {e}"
        );
        assert!(!run_dir.exists(), "{world}: the run directory was made");
    }
}

/// A `WANDB_MODE` W&B would refuse once the run started, and a sweep's run id that would lead
/// the run's folder out of runs/, are refused with the config, before any folder is made.
#[test]
fn tracker_variables_wandb_would_refuse_are_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |vars: &[(&str, &str)], args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
            .current_dir(dir.path())
            .args(["train", "task=Pendulum-v1", "enable_wandb=true"])
            .args(args)
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{vars:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = refused(&[("WANDB_MODE", "bogus")], &["--cfg", "job"]);
    assert!(e.contains("WANDB_MODE=\"bogus\" is not a W&B mode"), "{e}");
    let sweep = [("WANDB_SWEEP_ID", "abc"), ("WANDB_RUN_ID", "x/../../evil")];
    let e = refused(&sweep, &["steps=201", "eval_episodes=0"]);
    assert!(e.contains("names this run's folder"), "{e}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "{e}");
}

/// max_restarts is the launcher's: a run of one process, which has none, says it will not be
/// restarted.
#[test]
fn max_restarts_without_a_launcher_is_said_to_restart_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(["train", "task=Pendulum-v1", "model_size=1", "steps=201"])
        .args(["eval_episodes=0", "max_restarts=2", "num_threads=1"])
        .arg(format!("run_dir={}", dir.path().join("run").display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: max_restarts=2 is the built-in launcher's"),
        "{stderr}"
    );
}

/// A venv or site-packages named by a variable that is not there is named with the variable,
/// not replaced by the build's venv nor reported as a missing module.
#[test]
fn a_python_environment_variable_naming_nothing_is_named() {
    for (var, dir) in [
        ("TDMPC2_VENV", "/nonexistent/lib/python3"),
        ("TDMPC2_SITE_PACKAGES", "/nonexistent"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
            .args(["train", "task=cartpole-swingup", "--cfg", "job"])
            .env_remove("TDMPC2_SITE_PACKAGES")
            .env(var, "/nonexistent")
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            e.contains(&format!("cannot use site-packages {dir}"))
                && e.contains(&format!("(from {var}=/nonexistent)")),
            "{e}"
        );
    }
}

/// Issue 11's failure matrix (items 4, 5, 8 and 9): each of these once panicked, passed
/// silently or named a key the user never set.
#[test]
fn hostile_values_are_refused_naming_the_key() {
    let cases: &[(&[&str], &str)] = &[
        (&["discount_max=0"], "discount_max=0 is out of range"),
        (
            &["discount_min=0.999", "discount_max=0.9"],
            "must satisfy discount_min (0.999) <= discount_max < 1",
        ),
        (&["discount_min=.nan"], "discount_min=NaN is out of range"),
        (&["discount_min=0"], "0 < discount_min < 1"),
        (
            &["discount_denom=0"],
            "discount_denom=0 is out of range: must be > 0",
        ),
        (
            &["lr=.nan"],
            "lr=NaN is out of range: must be a finite number",
        ),
        (&["lr=.inf"], "lr=inf is out of range"),
        (&["lr=1e300"], "lr=1e300 is out of range"),
        (&["vmin=.nan"], "vmin=NaN"),
        (&["vmax=.inf"], "vmax=inf"),
        (
            &["vmax=200"],
            "vmax=200 is out of range: must be within [-80, 80]",
        ),
        (&["log_std_min=.nan"], "log_std_min=NaN"),
        (&["grad_clip_norm=.nan"], "grad_clip_norm=NaN"),
        (
            &["grad_clip_norm=0"],
            "grad_clip_norm=0 is out of range: must be > 0",
        ),
        (&["entropy_coef=.inf"], "entropy_coef=inf"),
        (
            &["consistency_coef=-1"],
            "consistency_coef=-1 is out of range: must be >= 0",
        ),
        (
            &["world_size=9223372036854775807"],
            "world_size=9223372036854775807 is out of range: must be <= 65536",
        ),
        (
            &["batch_size=9223372036854775808"],
            "batch_size=9223372036854775808 is out of range",
        ),
        (&["num_samples=1000000000000"], "num_samples=1000000000000"),
        (&["num_bins=100000000000"], "num_bins=100000000000"),
        (
            &["model_size=null", "num_q=100000000000"],
            "num_q=100000000000 is out of range",
        ),
        (
            &["steps=1e300"],
            "wrong type for 'steps': expected a non-negative integer, got 1e300",
        ),
        (&["seed=4294967296"], "seed=4294967296 is out of range"),
        (
            &["dist_timeout=99999999999"],
            "dist_timeout=99999999999 is out of range: must be <= 604800",
        ),
        (
            &["world_size=3", "nnodes=2"],
            "world_size=3 cannot be split over nnodes=2",
        ),
        (&["device=cuda:x"], "device=cuda:x is not a device"),
        (
            &["save_video=true", "task=Pendulum-v1"],
            "save_video=true films evaluations, and the native task Pendulum-v1 draws no images",
        ),
        (&["save_agent=false"], "save_agent=false is not supported"),
        (
            &["obs=rgb", "num_channels=3"],
            "obs=rgb needs latent_dim = 16 × num_channels",
        ),
        (&["task_dim=64"], "task_dim=64 is not supported"),
        (
            &["num_enc_layers=0"],
            "num_enc_layers=0 is out of range: must be >= 1",
        ),
        (&["eval_episodes=-1"], "eval_episodes"),
        (&["num_envs=0"], "num_envs=0 is out of range: must be >= 1"),
        (
            &["num_envs=4", "steps_per_update=3"],
            "steps_per_update=3 must divide num_envs=4",
        ),
        (
            &["actor_threads=0"],
            "actor_threads=0 is out of range: must be >= 1",
        ),
        (&["pipeline=maybe"], "pipeline"),
        // What needs the task and the machine (resolve).
        (
            &["task=Pendulum-v1", "num_envs=4", "seed_steps=400"],
            "seed_steps=400 is out of range: must be >= num_envs × the episode length (4 × 200)",
        ),
        (
            &["task=Pendulum-v1", "world_size=2", "steps=400"],
            "steps=400 is out of range: each of the world_size=2 ranks runs steps / world_size \
             = 200 steps",
        ),
        (
            &["task=Pendulum-v1", "buffer_size=100"],
            "buffer_size=100 is out of range: must hold one whole episode",
        ),
        (
            &["task=Pendulum-v1", "world_size=65536", "device=cpu"],
            "world_size=65536 puts 65536 ranks on each of nnodes=1",
        ),
        (
            &["task=Pendulum-v1", "batch_size=16777216"],
            "an update's batch (batch_size=16777216",
        ),
        (
            &["task=Pendulum-v1", "mlp_dim=1048576"],
            "the model and its optimiser state (mlp_dim=1048576",
        ),
    ];
    for (args, needle) in cases {
        let mut all = vec!["train", "--cfg", "job"];
        all.extend_from_slice(args);
        let e = rejected(&all);
        assert!(e.contains(needle), "{args:?}: expected '{needle}' in: {e}");
        assert_eq!(e.trim().lines().count(), 1, "{args:?}: one line: {e}");
    }
}

/// `steps=1e5` (the example of `--help`) is an integer; names are strings whatever they look
/// like, spelled as given.
#[test]
fn integral_floats_and_names_are_taken_as_meant() {
    let c = job(&[
        "task=Pendulum-v1",
        "steps=1e5",
        "model_size=1.0",
        "exp_name=007",
        "wandb_name=7",
        "wandb_entity=true",
        "discount_min=0.5",
        "discount_max=0.5",
    ]);
    assert_eq!(c["steps"].as_u64(), Some(100_000));
    assert_eq!(c["model_size"].as_u64(), Some(1));
    assert_eq!(c["exp_name"].as_str(), Some("007"));
    assert_eq!(c["wandb_name"].as_str(), Some("7"));
    assert_eq!(c["wandb_entity"].as_str(), Some("true"));
    assert_eq!(c["discount"].as_f64(), Some(0.5));
    let e = rejected(&["train", "--cfg", "job", "steps=1.5"]);
    assert!(e.contains("wrong type for 'steps'"), "{e}");
    let e = rejected(&["train", "--cfg", "job", "steps=-1e5"]);
    assert!(e.contains("wrong type for 'steps'"), "{e}");
}

/// The tools' counts are bounded where they are read (threads of 0 or 3e9 panicked in torch,
/// a picture of 100000² pixels in the drawing library), and ranks are bounded by the cores.
#[test]
fn bench_and_plot_options_are_bounded_naming_the_option() {
    for (args, named) in [
        (
            &["bench", "--cases", "agent", "--agent-repeats", "0"][..],
            "--agent-repeats",
        ),
        (
            &["bench", "--cases", "agent", "--threads", "0"],
            "--threads",
        ),
        (
            &["bench", "--cases", "agent", "--threads", "3000000000"],
            "at most 4096",
        ),
        (
            &["bench", "--cases", "agent", "--plan-envs", "4,0"],
            "--plan-envs",
        ),
        (
            &["bench", "--cases", "agent", "--plan-envs", "100000000"],
            "at most 4096 (num_envs's limit)",
        ),
        (
            &["bench", "--cases", "env", "--env-steps", "0"],
            "--env-steps",
        ),
        (
            &["bench", "--cases", "loop", "--num-envs", "x"],
            "--num-envs",
        ),
        (
            &["bench", "--cases", "ddp", "--ranks", "100000"],
            "--ranks 100000: at most",
        ),
        // An unknown case is refused before the known ones run.
        (
            &["bench", "--cases", "buffer,bogus"],
            "invalid value 'bogus'",
        ),
        // What no case could run with is refused before the first case (env) runs.
        (&["bench", "--model-sizes", "2"], "--model-sizes 2: allowed"),
        (
            &["bench", "--cases", "env", "--model-sizes", "5"],
            "--model-sizes serves the agent, graphs and loop cases, and --cases env runs none",
        ),
        (
            &["bench", "--cases", "env,agent", "--tasks", "foo"],
            "--tasks foo: allowed: walker-run, dog-run",
        ),
        (
            &["bench", "--cases", "env,loop", "--loop-set", "stepz=1"],
            "unknown key 'stepz'",
        ),
        (
            &["bench", "--cases", "dataset", "--dataset-mb", "999999999"],
            "--dataset-mb 999999999:",
        ),
        (
            &["bench", "--cases", "env,ddp", "--ranks", "100000"],
            "--ranks 100000: at most",
        ),
        (
            &["bench", "--cases", "env,video", "--video-task", "nosuch"],
            "unknown task `nosuch`",
        ),
        (
            &[
                "bench",
                "--cases",
                "env,video",
                "--video-task",
                "Pendulum-v1",
            ],
            "draws none",
        ),
        (
            &[
                "bench",
                "--cases",
                "env,buffer",
                "--buffer-rows",
                "100000000000",
            ],
            "--buffer-rows 100000000000: the largest case's buffer needs",
        ),
        (
            &[
                "bench",
                "--cases",
                "env,loop",
                "--loop-task",
                "mw-reach",
                "--loop-set",
                "obs=rgb",
            ],
            "Meta-World tasks observe state only",
        ),
        (&["doctor", "--world-size", "100000"], "--world-size 100000"),
        (&["plot", ".", "--width", "100000"], "--width 100000"),
        // An output no figure can be written to, named before any run is read.
        (
            &["plot", ".", "--out", "/proc/curves.png"],
            "--out /proc/curves.png: cannot be written",
        ),
    ] {
        let stderr = rejected(args);
        assert!(stderr.contains(named), "{args:?}: {stderr}");
        // Refused before the first case ran: nothing measured.
        assert!(tdmpc2(args).stdout.is_empty(), "{args:?}");
    }
}

/// The dataset bench stopped by SIGTERM while it writes removes what it wrote.
#[test]
fn a_stopped_dataset_bench_leaves_no_files() {
    let tmp = tempfile::tempdir().unwrap();
    let bench = std::process::Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(["bench", "--cases", "dataset", "--dataset-mb", "300"])
        .env("TMPDIR", tmp.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // tdmpc2-bench-dataset-<pid>-<nanos>
    let prefix = format!("tdmpc2-bench-dataset-{}-", bench.id());
    let folder = || {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .find(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
            .map(|entry| entry.path())
    };
    let started = std::time::Instant::now();
    let writing = || folder().is_some_and(|dataset| dataset.join("chunk_0.pt").exists());
    while !writing() && started.elapsed().as_secs() < 120 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let dataset = folder();
    let writing = writing();
    // SAFETY: SIGTERM to this test's own child.
    unsafe { libc::kill(bench.id() as libc::pid_t, libc::SIGTERM) };
    let out = bench.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(writing, "the bench wrote its first file: {stderr}");
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(!dataset.unwrap().exists(), "{prefix}… left behind");
}

/// Several tasks resolve against each task's environment (padded observations, each task's
/// action size); a task that cannot be made is named with its place.
#[test]
fn task_lists_resolve_per_task_and_name_a_missing_task() {
    let config = job(&["task=[walker-run,cartpole-swingup]"]);
    assert_eq!(
        config["task"].as_str(),
        Some("[walker-run,cartpole-swingup]")
    );
    assert_eq!(config["obs_shape"][0].as_u64(), Some(24));
    let dims: Vec<u64> = config["action_dims"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(serde_yaml_ng::Value::as_u64)
        .collect();
    assert_eq!(dims, [6, 1]);
    assert_eq!(config["task_dim"].as_u64(), Some(64));

    // mt30 with its 11 custom DMControl tasks (mt80: tests/families.rs).
    let mt30 = job(&["task=mt30"]);
    assert_eq!(mt30["action_dims"].as_sequence().map(Vec::len), Some(30));
    assert_eq!(mt30["obs_shape"][0].as_u64(), Some(24));
    let out = tdmpc2(&["train", "--cfg", "job", "task=[walker-run,lift-cube]"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("task 1 of 2 (lift-cube) cannot be made") && stderr.contains("SAPIEN"),
        "{stderr}"
    );
}

/// Under torchrun (or SLURM) the launcher's world size is the run's before any check that
/// depends on it: steps per rank, ranks per node.
#[test]
fn a_launchers_world_size_is_checked_as_the_configs() {
    let under_torchrun = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
            .args(args)
            .envs([
                ("RANK", "0"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_RANK", "0"),
                ("LOCAL_WORLD_SIZE", "2"),
            ])
            .output()
            .unwrap()
    };
    let out = under_torchrun(&["train", "--cfg", "job", "task=Pendulum-v1", "steps=600"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("each of the world_size=4 ranks runs steps / world_size = 150 steps"),
        "{stderr}"
    );
    let out = under_torchrun(&["train", "--cfg", "job", "task=Pendulum-v1", "steps=1000"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&out.stdout).unwrap();
    assert_eq!(job["world_size"].as_u64(), Some(4));
    // eval plays alone whatever the launcher: its world size is not checked.
    let out = under_torchrun(&["eval", "--cfg", "job", "task=Pendulum-v1", "world_size=8"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An argument that is not UTF-8 (a Latin-1 file name) is named or refused, never a panic.
#[test]
fn arguments_that_are_not_utf8_are_refused_not_a_panic() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let latin1 = |text: &[u8]| OsString::from_vec(text.to_vec());
    for args in [
        vec![
            "plot".into(),
            latin1(b"caf\xe9"),
            "--out".into(),
            "x.png".into(),
        ],
        vec!["train".into(), latin1(b"seed=\xe9")],
        vec![
            "train".into(),
            latin1(b"-cp=/nowhere/caf\xe9"),
            "-cn".into(),
            "x".into(),
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    // A launcher's variable that is not UTF-8 is refused, not taken for unset (which trained
    // one rank alone).
    let run_dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args(["train", "task=Pendulum-v1", "steps=400"])
        .arg(format!("run_dir={}", run_dir.path().display()))
        .env("RANK", "0")
        .env("WORLD_SIZE", latin1(b"\xff"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("environment variable WORLD_SIZE=\u{fffd} is not a non-negative integer"),
        "{stderr}"
    );
}
