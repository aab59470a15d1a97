//! Loading and overrides: defaults, types, hydra's spellings and what cannot be set.
use super::*;

#[test]
fn defaults_match_the_official_values() {
    let c = load(&[]).unwrap();
    assert_eq!(
        (c.batch_size, c.horizon, c.num_samples, c.num_elites),
        (256, 3, 512, 64)
    );
    assert_eq!(
        (c.lr, c.enc_lr_scale, c.grad_clip_norm, c.tau),
        (3e-4, 0.3, 20.0, 0.01)
    );
    assert_eq!((c.num_bins, c.vmin, c.vmax, c.num_q), (101, -10.0, 10.0, 5));
    assert_eq!((c.latent_dim, c.mlp_dim, c.enc_dim), (512, 512, 256));
}

#[test]
fn a_task_brings_its_official_settings_below_the_users() {
    let c = load(&["task=mujoco-walker"]).unwrap();
    assert_eq!((c.discount_max, c.rho, c.episodic), (0.99, 0.7, true));
    let c = load(&["task=mujoco-walker", "rho=0.5"]).unwrap();
    assert_eq!((c.discount_max, c.rho, c.episodic), (0.99, 0.5, true));
    let c = load(&["task=mujoco-walker", "episodic=false"]).unwrap();
    let e = c.refuse_untaken_terminations().unwrap_err().to_string();
    assert!(
        e.contains("task=mujoco-walker ends episodes early") && e.contains("episodic=false"),
        "{e}"
    );
    let c = load(&["task=mujoco-halfcheetah"]).unwrap();
    assert_eq!((c.rho, c.episodic), (0.7, false));
    let c = load(&["task=walker-run"]).unwrap();
    assert_eq!((c.discount_max, c.rho), (0.995, 0.5));
    let c = load(&["task=lunarlander-continuous", "data_dir=d"]).unwrap();
    assert_eq!(
        (c.rho, c.episodic),
        (0.7, false),
        "offline: no terminations"
    );
    let e = error(&["task=[walker-run,mujoco-walker]"]);
    assert!(
        e.contains("mujoco-walker ends episodes early") && e.contains("train mujoco-walker alone"),
        "{e}"
    );
    let e = error(&["task=[Pendulum-v1,MountainCarContinuous-v0]"]);
    assert!(
        e.contains("MountainCarContinuous-v0 ends episodes early"),
        "{e}"
    );
}

/// A config file that repeats the defaults (ours, or the official `config.yaml`) leaves a
/// task's own settings standing; a value of its own wins, as an override does.
#[test]
fn a_config_file_of_defaults_leaves_the_tasks_settings() {
    let dir = tempfile::tempdir().unwrap();
    let with_file = |text: &str, overrides: &[&str]| {
        std::fs::write(dir.path().join("mine.yaml"), text).unwrap();
        Config::load(&Source {
            config_name: Some("mine".into()),
            config_path: Some(dir.path().to_path_buf()),
            overrides: overrides.iter().map(|s| s.to_string()).collect(),
            beneath: Vec::new(),
        })
    };
    let repeated = "episodic: false\nrho: 0.5\ndiscount_max: 0.995\nlr: 3e-4\n";
    let c = with_file(repeated, &["task=mujoco-walker"]).unwrap();
    assert_eq!((c.discount_max, c.rho, c.episodic), (0.99, 0.7, true));
    let c = with_file(repeated, &["task=walker-run"]).unwrap();
    assert_eq!((c.discount_max, c.rho, c.episodic), (0.995, 0.5, false));
    let own = "rho: 0.4\ndiscount_max: 0.98\n";
    let c = with_file(own, &["task=mujoco-walker"]).unwrap();
    assert_eq!((c.discount_max, c.rho, c.episodic), (0.98, 0.4, true));
    let c = with_file(own, &["task=mujoco-walker", "rho=0.6"]).unwrap();
    assert_eq!(c.rho, 0.6);
    let e = with_file("episodic: false\n", &["task=mujoco-walker"]).map(|c| c.episodic);
    assert!(matches!(e, Ok(true)), "{e:?}");
    // A run's own config.yaml (resolved: it holds episode_length) says what it ran with.
    let resolved = "task: mujoco-walker\nepisode_length: 1000\nrho: 0.5\nepisodic: true\n";
    let c = with_file(resolved, &[]).unwrap();
    assert_eq!((c.rho, c.discount_max), (0.5, 0.99));
    let repo = Config::load(&Source {
        config_name: Some("config".into()),
        overrides: vec!["task=mujoco-walker".into()],
        ..Source::default()
    })
    .unwrap();
    assert_eq!(
        (repo.rho, repo.episodic),
        (0.7, true),
        "configs/config.yaml"
    );
}

/// A config file's hydra settings and official names get the command line's hints.
#[test]
fn a_config_files_keys_get_the_command_lines_hints() {
    let dir = tempfile::tempdir().unwrap();
    let error = |text: &str| {
        std::fs::write(dir.path().join("mine.yaml"), text).unwrap();
        Config::load(&Source {
            config_name: Some("mine".into()),
            config_path: Some(dir.path().to_path_buf()),
            ..Source::default()
        })
        .unwrap_err()
        .to_string()
    };
    let e = error("seed: 2\nhydra:\n  run:\n    dir: out\n");
    assert!(
        e.contains("hydra.run.dir: the run directory is run_dir here"),
        "{e}"
    );
    let e = error("work_dir: out\n");
    assert!(e.contains("work_dir is run_dir here"), "{e}");
    let file = dir.path().join("mine.yaml");
    let e = error("steps: abc\n");
    assert!(
        e.contains(&format!("{}: wrong type for 'steps'", file.display())),
        "{e}"
    );
    let e = error("exp_name: ${task}\n");
    assert!(
        e.contains(&format!(
            "{}: exp_name=${{task}}: interpolations",
            file.display()
        )),
        "{e}"
    );
    let e = error("exp_name:\n");
    assert!(e.contains("expected a string, got null"), "{e}");
    // The rest of a hydra file's own section means nothing here and is passed over.
    std::fs::write(&file, "steps: 2000\nhydra:\n  job:\n    chdir: true\n").unwrap();
    let c = Config::load(&Source {
        config_name: Some("mine".into()),
        config_path: Some(dir.path().to_path_buf()),
        ..Source::default()
    })
    .unwrap();
    assert_eq!(c.steps, 2000);
}

/// A name that is no file of the config directory lists those there, and without
/// --config-path says how to give a file of one's own.
#[test]
fn a_missing_config_name_lists_the_files_and_the_way_to_ones_own() {
    let e = Config::load(&Source {
        config_name: Some("cfg/mine.yaml".into()),
        ..Source::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("no file") && e.contains("config_ddp") && e.contains("--config-path DIR"),
        "{e}"
    );
}

/// `--config-path DIR` alone reads DIR/config.yaml, hydra's primary config.
#[test]
fn a_config_path_alone_reads_its_primary_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), "steps: 3000\n").unwrap();
    let c = Config::load(&Source {
        config_path: Some(dir.path().to_path_buf()),
        ..Source::default()
    })
    .unwrap();
    assert_eq!(c.steps, 3000);
    let empty = tempfile::tempdir().unwrap();
    let e = Config::load(&Source {
        config_path: Some(empty.path().to_path_buf()),
        ..Source::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("--config-path")
            && e.contains("give --config-name NAME")
            && !e.contains("--config-name config"),
        "{e}"
    );
}

/// What hydra reads as text stays text (YAML's own signs, hydra's escapes), and hydra's
/// spellings that mean nothing here say what does.
#[test]
fn hydra_text_escapes_and_its_own_settings_are_read_as_hydra_reads_them() {
    for (arg, text) in [
        ("exp_name=#x", "#x"),
        ("exp_name=&team", "&team"),
        ("exp_name=!x", "!x"),
        ("exp_name=*x", "*x"),
        ("exp_name=@foo", "@foo"),
        ("exp_name=a\\,b", "a,b"),
        ("exp_name=f\\(x\\)", "f(x)"),
    ] {
        assert_eq!(load(&[arg]).unwrap().exp_name, text, "{arg}");
    }
    let c = load(&["data_dir=#x"]).unwrap();
    assert_eq!(c.data_dir.as_deref(), Some("#x"), "an online run instead");
    assert_eq!(
        load(&["run_dir=#1"]).unwrap().run_dir.as_deref(),
        Some("#1")
    );
    assert_eq!(load(&["vmax=2_0"]).unwrap().vmax, 20.0);
    assert_eq!(
        load(&["discount_denom=1_000"]).unwrap().discount_denom,
        1000.0
    );
    assert_eq!(load(&["lr=1_0e-5"]).unwrap().lr, 10e-5);
    assert_eq!(load(&["steps='3000'"]).unwrap().steps, 3000);
    for bad in ["vmax=1__0", "vmax=_1", "vmax=1_", "vmax=1_.5"] {
        assert!(error(&[bad]).contains("wrong type"), "{bad}");
    }
    for (arg, why) in [
        ("steps=null", "expected a non-negative integer, got null"),
        ("exp_name=null", "expected a string, got null"),
        ("~steps", "give steps=10000000 for the built-in default"),
        (
            "~checkpoint",
            "give checkpoint=null for the built-in default",
        ),
        ("~episode_length", "episode_length is derived"),
        (
            "+steps2=1",
            "hydra's + adds a key; here every setting exists already",
        ),
        (
            "master_addr=${oc.env:MASTER_ADDR,localhost}",
            "master_addr=${oc.env:MASTER_ADDR,localhost}: interpolations are not resolved",
        ),
        ("task=${oc.env:T}", "interpolations are not resolved"),
        ("data_dir=${oc.env:DATA}", "interpolations are not resolved"),
        (
            "hydra/job_logging=disabled",
            "hydra's logging is not used here",
        ),
        ("hydra.verbose=true", "hydra's logging is not used here"),
        (
            "hydra.job.chdir=true",
            "a run never changes its working directory",
        ),
    ] {
        // As the commands check them: derived settings first, then the load.
        let source = Source {
            overrides: vec![arg.to_owned()],
            ..Source::default()
        };
        let e = source
            .refuse_derived_settings()
            .and_then(|()| Config::load(&source).map(drop))
            .expect_err(arg)
            .to_string();
        assert!(e.contains(why), "{arg}: {e}");
    }
    // Without --multirun an escaped comma is one value, not a sweep.
    assert_eq!(load(&["exp_name=x\\,y"]).unwrap().exp_name, "x,y");
    assert_eq!(load(&["+steps=2000"]).unwrap().steps, 2000);
}

#[test]
fn overrides_parse_yaml_scalars_and_lists() {
    let c = load(&[
        "steps=1000",
        "lr=1e-3",
        "mpc=false",
        "wandb_entity=me",
        "num_threads=null",
    ])
    .unwrap();
    assert_eq!((c.steps, c.lr, c.mpc), (1000, 1e-3, false));
    assert_eq!(c.wandb_entity.as_deref(), Some("me"));
    let c = load(&["obs_shape=[3, 4]"]).unwrap();
    assert_eq!(c.obs_shape, Some(vec![3, 4]));
}

#[test]
fn nested_keys_are_set_and_checked() {
    let mut tree: Value = serde_yaml_ng::from_str("a: {b: 1, c: {d: 2}}").unwrap();
    apply_override(&mut tree, "a.c.d=5").unwrap();
    assert_eq!(tree["a"]["c"]["d"], Value::from(5));
    let e = apply_override(&mut tree, "a.c.e=1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("did you mean 'a.c.d'"), "{e}");
    let e = apply_override(&mut tree, "a.b.x=1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("a.b is not a section"), "{e}");
}

#[test]
fn unknown_key_names_the_closest() {
    assert!(error(&["bach_size=3"]).contains("did you mean 'batch_size'"));
    assert!(error(&["horizn=3"]).contains("did you mean 'horizon'"));
    let far = error(&["+foo=1"]);
    assert!(
        far.contains("unknown key 'foo'") && !far.contains("did you mean"),
        "{far}"
    );
    // Hydra's own spellings, and the official name of another setting, say what they are here.
    for (arg, said) in [
        ("~checkpoint", "give checkpoint=null"),
        ("~foo", "unknown key 'foo'"),
        ("~horizn", "did you mean 'horizon'"),
        ("hydra.run.dir=/x", "run_dir=DIR"),
        (
            "hydra/launcher=submitit_slurm",
            "launcher=builtin, torchrun or slurm",
        ),
        ("work_dir=/x", "work_dir is run_dir here"),
    ] {
        let e = error(&[arg]);
        assert!(e.contains(said), "{arg}: {e}");
    }
}

#[test]
fn wrong_types_name_key_and_type() {
    let e = error(&["batch_size=abc"]);
    assert!(
        e.contains("batch_size") && e.contains("non-negative integer"),
        "{e}"
    );
    let e = error(&["mpc=maybe"]);
    assert!(e.contains("mpc") && e.contains("true or false"), "{e}");
    let e = error(&["lr=fast"]);
    assert!(e.contains("'lr'") && e.contains("a number"), "{e}");
}

#[test]
fn the_official_parser_s_arithmetic_is_read() {
    let c = load(&[
        "eval_freq=10000/2",
        "steps=5*1000",
        "lr=3/10000",
        "exp_name=1+2",
    ])
    .unwrap();
    assert_eq!(
        (c.eval_freq, c.steps, c.exp_name.as_str()),
        (5000, 5000, "1+2")
    );
    assert!((c.lr - 3e-4).abs() < 1e-12);
    let e = error(&["eval_freq=10000/3"]);
    assert!(
        e.contains("10000/3 is 3333.333…, not a non-negative integer"),
        "{e}"
    );
}

#[test]
fn integral_floats_are_integers_and_names_are_strings_as_typed() {
    let c = load(&["steps=1e5", "exp_name=1.10", "wandb_name=7", "seed=3.0"]).unwrap();
    assert_eq!((c.steps, c.seed), (100_000, 3));
    assert_eq!(c.exp_name, "1.10");
    assert_eq!(c.wandb_name.as_deref(), Some("7"));
    // A colon reads as a YAML mapping; a name takes it as typed.
    let c = load(&["exp_name=a: b", "wandb_name=gym:"]).unwrap();
    assert_eq!(
        (c.exp_name.as_str(), c.wandb_name.as_deref()),
        ("a: b", Some("gym:"))
    );
    assert!(error(&["steps=2.5"]).contains("wrong type for 'steps'"));
    assert!(error(&["steps=1e20"]).contains("got 1e20"));
}

#[test]
fn non_finite_and_unsupported_values_are_refused() {
    for (arg, needle) in [
        ("lr=.nan", "lr=NaN is out of range"),
        ("tau=-.inf", "tau=-inf is out of range"),
        ("discount=1", "0 < discount < 1"),
        ("discount_min=0.999", "discount_min (0.999) <= discount_max"),
        ("save_agent=false", "save_agent=false is not supported"),
        ("task_dim=32", "task_dim=32 is not supported"),
        ("stop_grace=0", "stop_grace=0 is out of range: must be >= 1"),
        ("stop_grace=10000000000000000000", "must be <= 604800"),
    ] {
        let e = error(&[arg]);
        assert!(e.contains(needle), "{arg}: {e}");
    }
    // One task has no embedding, as the official parser's 0 says.
    assert_eq!(load(&["task_dim=0"]).unwrap().task_dim, 0);
}

/// hydra's spellings: integers grouped with underscores (the official config writes
/// `steps: 10_000_000`), booleans as yes/no/on/off or 1/0, `key=` as the empty string (refused
/// for a path or a name, by name), and commas, which sweep, only with --multirun.
#[test]
fn hydra_spellings_are_taken_and_empty_values_named() {
    let c = load(&["steps=10_000_000", "compile=yes", "save_csv=0", "tf32=Off"]).unwrap();
    assert_eq!(
        (c.steps, c.compile, c.save_csv, c.tf32),
        (10_000_000, true, false, false)
    );
    for bad in ["steps=1__0", "steps=_1", "compile=maybe", "compile=2"] {
        assert!(error(&[bad]).contains("wrong type"), "{bad}");
    }
    // Why a value that looks like a number is none, in words ("got string" before).
    for (bad, why) in [
        ("lr=inf", "expected a finite number, got inf"),
        ("lr=nan", "expected a finite number, got nan"),
        ("lr=1e400", "expected a finite number, got 1e400"),
        ("steps=10000/3", "10000/3 is 3333.333…"),
        ("steps=10000/0", "10000/0 divides by zero"),
        ("steps=3-5", "3-5 is -2, not a non-negative integer"),
        ("eval_freq=${steps}", "interpolations are not resolved here"),
        (
            "run_dir=/x/${task}",
            "run_dir=/x/${task}: interpolations are not resolved here",
        ),
        ("exp_name=${seed}", "exp_name=${seed}: interpolations"),
        (
            "steps=18446744073709551616",
            "steps=18446744073709551616 is too large",
        ),
    ] {
        let e = error(&[bad]);
        assert!(e.contains(why), "{bad}: {e}");
    }
    // A path the run reads is taken as it is: a folder an earlier version named so exists.
    let dir = tempfile::tempdir().unwrap();
    let named = dir.path().join("old/${seed}/1");
    std::fs::create_dir_all(&named).unwrap();
    assert!(load(&[&format!("checkpoint={}", named.display())]).is_ok());
    let e = error(&["checkpoint=old/${seed}/1"]);
    assert!(e.contains("interpolations are not resolved"), "{e}");
    for key in [
        "data_dir",
        "run_dir",
        "checkpoint",
        "exp_name",
        "wandb_entity",
    ] {
        let e = error(&[&format!("{key}=")]);
        assert!(e.contains(&format!("{key}= is empty")), "{e}");
    }
    let e = error(&["seed=1,2"]);
    assert!(e.contains("add --multirun (-m)"), "{e}");
    assert_eq!(load(&["exp_name='a,b'"]).unwrap().exp_name, "a,b");
    let c = load(&["run_dir=runs/[a,b]/0"]).unwrap();
    assert_eq!(c.run_dir.as_deref(), Some("runs/[a,b]/0"));
    // A shell argument holds no YAML comment: ` #` is part of the value.
    assert_eq!(load(&["exp_name=run #2"]).unwrap().exp_name, "run #2");
    let e = error(&["steps=5 #x"]);
    assert!(e.contains("got string \"5 #x\""), "{e}");
}

/// A field derived from the task, set on the command line, is refused (it would be replaced,
/// and `episode_length` taken for a config resolved before); settings beside them pass.
#[test]
fn derived_fields_cannot_be_set_on_the_command_line() {
    let source = |args: &[&str]| Source {
        overrides: args.iter().map(|a| a.to_string()).collect(),
        ..Source::default()
    };
    for key in DERIVED_FIELDS {
        let e = source(&["steps=10", &format!("{key}=3")])
            .refuse_derived_settings()
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("{key} is derived (from ")), "{e}");
        // Each from what it is (all of them read "from vmin, vmax and num_bins").
        assert_eq!(e.contains("num_bins"), key == "bin_size", "{e}");
    }
    let e = source(&["+episode_length=5"]).refuse_derived_settings();
    assert!(e.is_err(), "with hydra's + too");
    source(&["discount=0.9", "seed_steps=1000", "task=walker-run"])
        .refuse_derived_settings()
        .unwrap();
}

/// Brackets nested past any setting's need are refused before the YAML parser, whose time
/// grows with the square of the depth.
#[test]
fn deep_nesting_is_refused_before_parsing() {
    let deep = format!("steps={}{}", "[".repeat(100_000), "]".repeat(100_000));
    let started = std::time::Instant::now();
    let e = error(&[&deep]);
    assert!(
        e.contains("steps: brackets nested more than 32 deep"),
        "{e}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // Brackets in quotes are not nesting.
    super::refuse_deep_nesting("exp_name: '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['", "f").unwrap();
}
