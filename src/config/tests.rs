//! Loading, overrides, validation and resolution, through `Config::load` as a user meets them.
use serde_yaml_ng::Value;

use super::resources::Machine;
use super::*;

fn load(overrides: &[&str]) -> Result<Config> {
    Config::load(&Source {
        overrides: overrides.iter().map(|s| s.to_string()).collect(),
        ..Source::default()
    })
}

fn error(overrides: &[&str]) -> String {
    load(overrides).expect_err("should be rejected").to_string()
}

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
    let c = load(&["task=mujoco-walker", "rho=0.5", "episodic=false"]).unwrap();
    assert_eq!((c.discount_max, c.rho, c.episodic), (0.99, 0.5, false));
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
fn ranges_are_enforced() {
    for (arg, needle) in [
        ("batch_size=0", "batch_size=0 is out of range"),
        ("horizon=0", "horizon=0"),
        ("world_size=0", "world_size=0"),
        ("sync_freq=0", "sync_freq=0"),
        ("rho=0", "0 < rho <= 1"),
        ("rho=1.5", "0 < rho <= 1"),
        ("num_pi_trajs=600", "must be < num_samples"),
        ("num_elites=513", "must be <= num_samples"),
        ("min_std=3", "must be <= max_std"),
        ("model_size=7", "valid sizes: 1, 5, 19, 48, 317"),
        ("env_timeout=0", "env_timeout=0 is out of range"),
    ] {
        let e = error(&[arg]);
        assert!(e.contains(needle), "{arg}: {e}");
    }
    assert!(load(&["rho=1"]).is_ok());
}

/// Offline training (data_dir) takes what the official datasets hold, and says so.
#[test]
fn offline_settings_are_checked() {
    for (args, needle) in [
        (
            &["data_dir=d", "episodic=true"][..],
            "the dataset files hold no terminations",
        ),
        (
            &["data_dir=d", "obs=rgb"],
            "offline training takes obs=state",
        ),
        (&["data_dir=d", "pipeline=true"], "use pipeline=false"),
        (&["data_dir=d", "save_buffer=true"], "use save_buffer=false"),
    ] {
        let e = error(args);
        assert!(e.contains(needle), "{args:?}: {e}");
    }
    assert!(load(&["data_dir=d"]).unwrap().offline());
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
    ] {
        let e = error(&[arg]);
        assert!(e.contains(needle), "{arg}: {e}");
    }
    // One task has no embedding, as the official parser's 0 says.
    assert_eq!(load(&["task_dim=0"]).unwrap().task_dim, 0);
}

#[test]
fn resources_are_checked_against_the_machine() {
    let mut c = load(&["task=Pendulum-v1", "device=cpu"]).unwrap();
    c.obs_shape = Some(vec![3]);
    c.action_dim = Some(1);
    let small = Machine {
        cores: 2,
        memory_bytes: 4e9,
        cuda_available: || false,
    };
    c.check_resources(&small).unwrap();
    // NCCL on a machine without a GPU: refused before any rank starts.
    for device in ["cpu", "auto"] {
        c.device = device.into();
        c.dist_backend = "nccl".into();
        c.check_resources(&small).unwrap();
        let e = c.check_backend_on(&small).unwrap_err().to_string();
        assert!(e.contains("dist_backend=nccl needs a CUDA device"), "{e}");
    }
    c.device = "auto".into();
    c.check_backend_on(&Machine {
        cuda_available: || true,
        ..small
    })
    .unwrap();
    c.dist_backend = "auto".into();
    c.device = "cpu".into();
    c.world_size = 9;
    let e = c.check_resources(&small).unwrap_err().to_string();
    assert!(e.contains("world_size=9 puts 9 ranks"), "{e}");
    c.world_size = 8;
    c.check_resources(&small).unwrap();
    // Ranks of a GPU node are not limited by its cores.
    c.device = "auto".into();
    c.world_size = 64;
    let gpu = Machine {
        cuda_available: || true,
        ..small
    };
    c.check_resources(&gpu).unwrap();
    c.world_size = 1;
    c.buffer_size = 1 << 40;
    c.steps = 1 << 50;
    let e = c.check_resources(&gpu).unwrap_err().to_string();
    assert!(
        e.contains("more than a GPU") && e.contains("the replay buffer (buffer_size="),
        "{e}"
    );
    c.device = "cpu".into();
    c.buffer_size = 200_000_000;
    let e = c.check_resources(&small).unwrap_err().to_string();
    assert!(e.contains("this machine's memory (3.7 GiB)"), "{e}");
    // A rank plans for all its environments at once: 1,024 of them at 16,384 samples each.
    c.buffer_size = 1_000_000;
    c.num_samples = 16_384;
    c.check_resources(&small).unwrap();
    c.num_envs = 1024;
    let e = c.check_resources(&small).unwrap_err().to_string();
    assert!(
        e.contains("planning (num_envs=1024, num_samples=16384"),
        "{e}"
    );
    // Under a launcher, memory per node counts its ranks on this node, whatever world_size /
    // nnodes say (nodes of other sizes, or nnodes left at 1 under torchrun).
    c.num_envs = 1;
    c.num_samples = 512;
    c.buffer_size = 40_000_000;
    c.check_resources(&small).unwrap();
    c.ranks_on_this_node = Some(4);
    let e = c.check_resources(&small).unwrap_err().to_string();
    assert!(
        e.contains("(4 rank(s) on this node: as this process runs)"),
        "{e}"
    );
    c.ranks_on_this_node = Some(9);
    let e = c.check_resources(&small).unwrap_err().to_string();
    assert!(e.contains("9 ranks run on this node"), "{e}");
}

#[test]
fn resolve_derives_the_official_fields() {
    let mut c = load(&["model_size=1"]).unwrap();
    let spec = envs::EnvSpec {
        obs_shape: vec![223],
        action_dim: 38,
        episode_length: 500,
    };
    c.resolve(&spec).unwrap();
    assert_eq!(
        (c.enc_dim, c.mlp_dim, c.latent_dim, c.num_q),
        (256, 384, 128, 2)
    );
    // As the official table: sizes 5, 19 and 48 leave num_q as given, 1 and 317 set it.
    for (size, given, trained) in [(19, 10, 10), (48, 3, 3), (5, 5, 5), (1, 10, 2), (317, 4, 8)] {
        let mut c = load(&[&format!("model_size={size}"), &format!("num_q={given}")]).unwrap();
        c.resolve(&spec).unwrap();
        assert_eq!(c.num_q, trained, "model_size={size} num_q={given}");
    }
    assert_eq!(c.discount, Some(0.99));
    assert_eq!(c.seed_steps, Some(2500));
    assert_eq!(c.iterations, 8);
    assert!((c.bin_size.unwrap() - 0.2).abs() < 1e-12);
    let mut c = load(&[]).unwrap();
    c.resolve(&envs::EnvSpec {
        obs_shape: vec![3],
        action_dim: 1,
        episode_length: 200,
    })
    .unwrap();
    assert_eq!(
        (c.discount, c.seed_steps, c.iterations),
        (Some(0.975), Some(1000), 6)
    );
    let mut c = load(&[]).unwrap();
    c.resolve(&envs::EnvSpec {
        obs_shape: vec![3],
        action_dim: 1,
        episode_length: 1000,
    })
    .unwrap();
    assert_eq!(c.discount, Some(0.995));
}

/// A horizon longer than an episode (the shortest task's, with several) leaves the buffer never
/// able to give a batch: refused, naming the length. Offline, the dataset's episodes decide.
#[test]
fn the_horizon_fits_in_an_episode() {
    let spec = |episode_length| envs::EnvSpec {
        obs_shape: vec![3],
        action_dim: 1,
        episode_length,
    };
    load(&["horizon=200"]).unwrap().resolve(&spec(200)).unwrap();
    let e = load(&["horizon=201"])
        .unwrap()
        .resolve(&spec(200))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("horizon=201 is out of range") && e.contains("(200 steps)"),
        "{e}"
    );
    let mut tasks = load(&["task=[walker-run,mw-reach]", "horizon=101"]).unwrap();
    let e = tasks
        .resolve_tasks(&[spec(500), spec(100)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("(100 steps)"), "the shortest task's: {e}");
}

#[test]
fn pixels_take_the_encoders_latent_and_refuse_any_other() {
    let spec = envs::EnvSpec {
        obs_shape: vec![5],
        action_dim: 1,
        episode_length: 500,
    };
    let mut c = load(&["obs=rgb", "model_size=1"]).unwrap();
    c.resolve(&spec).unwrap();
    assert_eq!(
        (c.latent_dim, c.mlp_dim),
        (512, 384),
        "size 1 widths, the encoder's latent"
    );
    assert_eq!(c.obs_shape, Some(vec![9, 64, 64]));
    assert_eq!(c.resolved_obs_dim().unwrap(), 9 * 64 * 64);
    let e = error(&["obs=rgb", "latent_dim=256"]);
    assert!(
        e.contains("obs=rgb needs latent_dim") && e.contains("latent_dim=256 with num_channels=32"),
        "{e}"
    );
    let mut c = load(&["obs=rgb", "num_channels=16", "latent_dim=256"]).unwrap();
    c.resolve(&spec).unwrap();
    let e = error(&["obs=pixels"]);
    assert!(
        e.contains("obs=pixels is not an observation kind; allowed: state, rgb"),
        "{e}"
    );
}

#[test]
fn several_tasks_resolve_to_one_padded_model_with_each_tasks_sizes() {
    let mut c = load(&[
        "task=[walker-run, cartpole-swingup, mw-reach]",
        "model_size=5",
    ])
    .unwrap();
    assert_eq!(c.task, "[walker-run,cartpole-swingup,mw-reach]");
    assert!(c.multitask());
    let spec = |obs, action_dim, episode_length| envs::EnvSpec {
        obs_shape: vec![obs],
        action_dim,
        episode_length,
    };
    c.resolve_tasks(&[spec(24, 6, 500), spec(5, 1, 500), spec(39, 4, 100)])
        .unwrap();
    assert_eq!(
        (
            c.obs_shape.clone(),
            c.action_dim,
            c.episode_length,
            c.task_dim
        ),
        (Some(vec![39]), Some(6), Some(500), 64)
    );
    assert_eq!(c.action_dims, Some(vec![6, 1, 4]));
    let agent = crate::agent::AgentConfig::from_config(&c).unwrap();
    let tasks = agent.tasks.expect("a multitask agent");
    assert_eq!(tasks.discounts, [0.99, 0.99, 0.95]);
    assert_eq!(
        (agent.obs_dim, agent.action_dim, tasks.task_dim),
        (39, 6, 64)
    );
    let mt30 = vec![spec(24, 6, 500); 30];
    let mut small = load(&["task=mt30", "model_size=1"]).unwrap();
    small.resolve_tasks(&mt30).unwrap();
    assert_eq!(small.task_dim, 96, "the official rule: 96 at size 1");
    let mut large = load(&["task=mt30", "model_size=19"]).unwrap();
    large.resolve_tasks(&mt30).unwrap();
    assert_eq!((large.task_dim, large.latent_dim), (64, 512));
    let e = small.resolve_tasks(&mt30[..2]).unwrap_err().to_string();
    assert!(e.contains("30 tasks, but 2 environments"), "{e}");
    let mut mixed = load(&["task=[mw-reach,walker-run]"]).unwrap();
    mixed
        .resolve_tasks(&[spec(39, 4, 100), spec(24, 6, 500)])
        .unwrap();
    assert_eq!(mixed.seed_steps, Some(2500), "the longest episode's");
    assert!(load(&[]).unwrap().tasks().unwrap().len() == 1);
    let listed = load(&["task=[walker-run, cup-catch]"]).unwrap().run_dir();
    assert!(
        listed.starts_with("runs/walker-run+cup-catch"),
        "{listed:?}"
    );
    let named = load(&["task=mt30"]).unwrap().run_dir();
    assert!(named.starts_with("runs/mt30"), "{named:?}");
}

#[test]
fn a_w_and_b_sweep_run_gets_a_directory_of_its_own() {
    let config = load(&["task=walker-run", "seed=2"]).unwrap();
    assert_eq!(
        config.run_dir_of(Some("ab12cd")),
        std::path::Path::new("runs/walker-run/default/2-ab12cd")
    );
    assert_eq!(
        config.run_dir_of(None),
        std::path::Path::new("runs/walker-run/default/2")
    );
    let given = load(&["run_dir=mine"]).unwrap();
    assert_eq!(
        given.run_dir_of(Some("ab12cd")),
        std::path::Path::new("mine")
    );
}

#[test]
fn several_tasks_need_states_and_no_terminations() {
    let e = error(&["task=[walker-run,cup-catch]", "obs=rgb"]);
    assert!(
        e.contains("observes states") && e.contains("2 tasks"),
        "{e}"
    );
    let e = error(&["task=mt30", "episodic=true"]);
    assert!(e.contains("not episodic"), "{e}");
    let e = error(&["task=[walker-run]"]);
    assert!(e.contains("two or more"), "{e}");
    let e = error(&["task_dim=32"]);
    assert!(e.contains("task embedding of a multitask model"), "{e}");
    // A task list's width and discounts follow the official rules: another one set is refused,
    // not silently replaced (its default and the official value load, as a saved config does).
    let e = error(&["task=[walker-run,cartpole-swingup]", "task_dim=7"]);
    assert!(
        e.contains("task_dim=7 is not supported") && e.contains("64 here"),
        "{e}"
    );
    for given in ["task_dim=96", "task_dim=64"] {
        load(&["task=[walker-run,cartpole-swingup]", given]).unwrap();
    }
    let spec = |obs, action_dim, episode_length| envs::EnvSpec {
        obs_shape: vec![obs],
        action_dim,
        episode_length,
    };
    let mut discounted = load(&["task=[walker-run,mw-reach]", "discount=0.9"]).unwrap();
    let e = discounted
        .resolve_tasks(&[spec(24, 6, 500), spec(39, 4, 100)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("discount=0.9 is not used by a task list"), "{e}");
    let mut saved = load(&["task=[walker-run,mw-reach]", "discount=0.99"]).unwrap();
    saved
        .resolve_tasks(&[spec(24, 6, 500), spec(39, 4, 100)])
        .unwrap();
}

#[test]
fn changed_settings_name_each_key_with_both_values() {
    let old = "lr: 0.0003\nsteps: 1000\nresume: null\ntask: walker-run\ngone: 1\n";
    let new = "lr: 0.0001\nsteps: 1000\nresume: auto\ntask: walker-run\nseed: 2\n";
    assert_eq!(
        super::changed_settings(old, new),
        [
            "gone: 1 → (absent)",
            "lr: 0.0003 → 0.0001",
            "seed: (absent) → 2"
        ]
    );
    assert!(super::changed_settings(old, old).is_empty());
    assert!(super::changed_settings("[not: a map", new).is_empty());
}

#[test]
fn every_environment_seed_fits_32_bits() {
    let e = load(&["seed=4294967295", "num_envs=2"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("seed + num_envs × world_size - 1"), "{e}");
    load(&["seed=4294967294", "num_envs=2"]).unwrap();
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
            "steps=18446744073709551616",
            "steps=18446744073709551616 is too large",
        ),
    ] {
        let e = error(&[bad]);
        assert!(e.contains(why), "{bad}: {e}");
    }
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

/// exp_name may nest folders under runs/<task>/ but never leave that tree.
#[test]
fn exp_name_stays_under_the_runs_tree() {
    load(&["exp_name=sweep/a"]).unwrap();
    load(&["exp_name=./b"]).unwrap();
    for bad in ["/tmp/x", "..", "../../x", "a/../../b", "."] {
        let e = error(&[&format!("exp_name={bad}")]);
        assert!(
            e.contains(&format!("exp_name={bad} is a folder under runs")),
            "{e}"
        );
    }
}

/// A W&B project name that W&B would refuse once the run has started is refused first, when
/// W&B is on.
#[test]
fn a_wandb_project_name_wandb_refuses_is_refused_first() {
    load(&["wandb_project=a/b"]).unwrap();
    let e = error(&["enable_wandb=true", "wandb_project=a/b"]);
    assert!(
        e.contains("wandb_project=a/b: a project name has none of"),
        "{e}"
    );
    let long = format!("wandb_project={}", "p".repeat(129));
    let e = error(&["enable_wandb=true", &long]);
    assert!(e.contains("at most 128 characters"), "{e}");
    load(&["enable_wandb=true", "wandb_project=tdmpc2-walker_run.v2"]).unwrap();
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
