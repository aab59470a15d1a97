//! Resolution against the tasks' environments: derived fields, pixels, task lists.
use super::*;

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
    let resolved = |args: &[&str], length| {
        let mut c = load(args).unwrap();
        c.resolve(&spec(length)).unwrap();
        c
    };
    resolved(&["horizon=200"], 200)
        .check_training_fits()
        .unwrap();
    let e = resolved(&["horizon=201"], 200)
        .check_training_fits()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("horizon=201 is out of range") && e.contains("(200 steps)"),
        "{e}"
    );
    let mut tasks = load(&["task=[walker-run,mw-reach]", "horizon=101"]).unwrap();
    tasks.resolve_tasks(&[spec(500), spec(100)]).unwrap();
    let e = tasks.check_training_fits().unwrap_err().to_string();
    assert!(e.contains("(100 steps)"), "the shortest task's: {e}");
    // Playing takes no update: eval and collect resolve without these checks.
    let mut playing = load(&["horizon=201", "steps=5", "seed_steps=1"]).unwrap();
    playing.resolve(&spec(200)).unwrap();
}

/// Steps too few for an episode per rank: with resume, the refusal says that steps counts
/// from step 0, the checkpoint's steps included (a user who gave the steps still to go meets
/// this before the checkpoint is read).
#[test]
fn too_few_steps_say_how_resume_counts_them() {
    let spec = envs::EnvSpec {
        obs_shape: vec![3],
        action_dim: 1,
        episode_length: 500,
    };
    let refusal = |args: &[&str]| {
        let mut c = load(args).unwrap();
        c.resolve(&spec).unwrap();
        c.check_training_fits().unwrap_err().to_string()
    };
    let base = ["steps=1000", "world_size=2", "seed_steps=500"];
    let fresh = refusal(&base);
    assert!(
        fresh.contains("use steps >= world_size × 501 = 1002"),
        "{fresh}"
    );
    assert!(!fresh.contains("resume"), "{fresh}");
    let resumed = refusal(&[&base[..], &["resume=auto"]].concat());
    assert!(
        resumed.contains("with resume, steps is the whole run's total from step 0"),
        "{resumed}"
    );
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
    let tasks = crate::config::MT30[..20].join(",");
    let long = load(&[&format!("task=[{tasks}]")]).unwrap().run_dir();
    let name = long
        .components()
        .nth(1)
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    let named_by = "walker-stand+19-more-";
    assert!(
        name.starts_with(named_by) && name.len() == named_by.len() + 8,
        "{long:?}"
    );
    // Up to a folder name's 255 bytes, the tasks themselves (as runs were named before).
    let tasks = crate::config::MT30[..12].join(",");
    let spelled = load(&[&format!("task=[{tasks}]")]).unwrap().run_dir();
    assert!(spelled.starts_with(format!("runs/{}", tasks.replace(',', "+"))));
    let named = load(&["task=mt30"]).unwrap().run_dir();
    assert!(named.starts_with("runs/mt30"), "{named:?}");
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
    // A field added since the file was written, left null: no change.
    assert!(super::changed_settings("lr: 0.1\n", "lr: 0.1\nobs_shapes: null\n").is_empty());
}
