//! Settings refused for what they are (ranges, names, seeds) or for the machine they would
//! run on.
use super::*;

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

/// A run directory no file system could make is refused with the config, not when made.
#[test]
fn a_folder_name_longer_than_file_systems_take_is_refused() {
    let long = "x".repeat(256);
    let e = error(&[&format!("run_dir=/tmp/{long}/1")]);
    assert!(e.contains("has a folder name of 256 bytes"), "{e}");
    let e = error(&[&format!("exp_name=a/{long}")]);
    assert!(e.contains("give a shorter run_dir (or exp_name)"), "{e}");
    assert!(load(&[&format!("run_dir=/tmp/{}", "x".repeat(255))]).is_ok());
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
fn every_environment_seed_fits_32_bits() {
    let e = load(&["seed=4294967295", "num_envs=2"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("seed + num_envs × world_size - 1"), "{e}");
    load(&["seed=4294967294", "num_envs=2"]).unwrap();
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

/// `dist_timeout` alone below `peer_timeout`'s default is blamed on both, the default as such.
#[test]
fn a_dist_timeout_below_peer_timeout_names_both() {
    let e = error(&["dist_timeout=10"]);
    assert!(
        e.contains("dist_timeout=10 is below peer_timeout (30, its default)"),
        "{e}"
    );
    let e = error(&["dist_timeout=10", "peer_timeout=20"]);
    assert!(
        e.contains("dist_timeout=10 is below peer_timeout=20"),
        "{e}"
    );
    load(&["dist_timeout=10", "peer_timeout=10"]).unwrap();
}

#[test]
fn an_empty_task_is_named_as_empty() {
    let e = error(&["task="]);
    assert!(e.contains("task= is empty (an unset variable?)"), "{e}");
}
