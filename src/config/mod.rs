//! The run configuration: official TD-MPC2 names and defaults (configs/config.yaml), hydra-style
//! overrides, validation, and the fields derived from the task.
//!
//! In parts by job: `defaults` (the one source of every default, preset and allowed value),
//! `overrides` (files and `key=value` laid over the defaults), `validate` (range checks; the
//! numbers' in `bounds`, the trackers' environment variables in `tracker_env`), `resolve`
//! (fields derived from the task), `tasks` (one task or a multitask list) and `resources` (what
//! the settings need of the machine). The config reads no other module of
//! the crate.
mod bounds;
mod defaults;
mod hydra;
mod overrides;
mod resolve;
mod resources;
mod task_specs;
mod tasks;
mod tracker_env;
mod validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_yaml_ng::Value;

use crate::error::{Error, Result};

pub use defaults::{
    model_size_of_mlp_dim, DEFAULTS_YAML, DEVICES, DIST_BACKENDS, LAUNCHERS, LR_SCALES,
    MAX_NUM_ENVS, MAX_WORLD_SIZE, MODEL_SIZES,
};
pub use overrides::{apply_override, default_config_dir};
pub use resolve::PIXEL_FEATURES;
pub use resources::{cores, most_local_cpu_ranks, share_of_cores, split_threads};
pub use task_specs::task_specs;
pub use tasks::{is_multitask, task_list, MT30};

/// Every setting of a run. Field names follow the official TD-MPC2 config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    // environment
    pub task: String,
    pub obs: String,
    pub episodic: bool,
    // evaluation
    pub checkpoint: Option<String>,
    pub eval_episodes: usize,
    pub eval_freq: u64,
    // training
    pub steps: u64,
    pub batch_size: usize,
    pub reward_coef: f64,
    pub value_coef: f64,
    pub termination_coef: f64,
    pub consistency_coef: f64,
    pub rho: f64,
    pub lr: f64,
    pub enc_lr_scale: f64,
    pub grad_clip_norm: f64,
    pub tau: f64,
    pub discount_denom: f64,
    pub discount_min: f64,
    pub discount_max: f64,
    pub buffer_size: usize,
    pub exp_name: String,
    pub data_dir: Option<String>,
    pub verify_data: bool,
    // planning
    pub mpc: bool,
    pub iterations: usize,
    pub num_samples: usize,
    pub num_elites: usize,
    pub num_pi_trajs: usize,
    pub horizon: usize,
    pub min_std: f64,
    pub max_std: f64,
    pub temperature: f64,
    // actor
    pub log_std_min: f64,
    pub log_std_max: f64,
    pub entropy_coef: f64,
    // critic
    pub num_bins: usize,
    pub vmin: f64,
    pub vmax: f64,
    // architecture
    pub model_size: Option<u32>,
    pub num_enc_layers: usize,
    pub enc_dim: usize,
    pub num_channels: usize,
    pub mlp_dim: usize,
    pub latent_dim: usize,
    pub task_dim: usize,
    pub num_q: usize,
    pub dropout: f64,
    pub simnorm_dim: usize,
    // logging
    pub wandb_project: String,
    pub wandb_entity: Option<String>,
    pub wandb_name: Option<String>,
    pub wandb_silent: bool,
    pub enable_wandb: bool,
    pub enable_tensorboard: bool,
    pub enable_mlflow: bool,
    pub save_csv: bool,
    // misc
    pub compile: bool,
    pub fused_kernels: bool,
    pub save_video: bool,
    pub save_agent: bool,
    pub seed: u64,
    pub save_freq: u64,
    pub save_buffer: bool,
    pub keep_checkpoints: usize,
    pub resume: Option<String>,
    // distributed
    pub world_size: usize,
    pub sync_freq: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub nnodes: usize,
    pub node_rank: usize,
    pub dist_timeout: u64,
    pub dist_backend: String,
    pub dist_force_group: bool,
    pub max_restarts: usize,
    pub peer_timeout: u64,
    pub stop_grace: u64,
    pub launcher: String,
    pub lr_scale: String,
    pub lr_warmup_steps: u64,
    // throughput
    pub num_envs: usize,
    pub steps_per_update: usize,
    /// `None` for auto.
    pub env_workers: Option<usize>,
    /// Seconds.
    pub env_timeout: u64,
    pub pipeline: bool,
    /// `None` for auto.
    pub actor_threads: Option<usize>,
    // hardware
    pub device: String,
    pub num_threads: Option<usize>,
    pub tf32: bool,
    pub cpu_affinity: bool,
    // output
    pub run_dir: Option<String>,
    // derived (filled by `resolve`)
    pub discount: Option<f64>,
    pub seed_steps: Option<u64>,
    pub obs_shape: Option<Vec<usize>>,
    pub action_dim: Option<usize>,
    pub episode_length: Option<usize>,
    pub bin_size: Option<f64>,
    /// Several tasks: each task's observation size (before padding), action size and episode
    /// length, in task-id order.
    pub obs_shapes: Option<Vec<usize>>,
    pub action_dims: Option<Vec<usize>>,
    pub episode_lengths: Option<Vec<usize>>,
    /// This node's ranks when the process knows them: as the launcher (torchrun, SLURM) that
    /// started it says, or 1 for eval and collect, which play alone; otherwise world_size /
    /// nnodes. Never saved: it describes the process, not the run.
    #[serde(skip)]
    pub ranks_on_this_node: Option<usize>,
}

/// The longest file or folder name most file systems take (NAME_MAX), in bytes.
pub(crate) const MOST_NAME_BYTES: usize = 255;

/// Where the starting file comes from: `--config-name NAME` looks in `--config-path DIR`
/// (default: the repository's `configs/`).
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub config_name: Option<String>,
    pub config_path: Option<PathBuf>,
    pub overrides: Vec<String>,
    /// Settings laid beneath the file and the overrides, over the task's own settings: those
    /// that built the model of a checkpoint `eval` or `collect` plays, from its run.
    pub beneath: Vec<String>,
}

/// The fields `resolve` derives from the task alone. A saved resolved config holds them (and is
/// derived again); a setting on the command line would be replaced, and `episode_length` would
/// be taken for the mark of a config resolved before.
pub const DERIVED_FIELDS: [&str; 7] = [
    "obs_shape",
    "action_dim",
    "episode_length",
    "bin_size",
    "obs_shapes",
    "action_dims",
    "episode_lengths",
];

/// `layer` (a config file) without the keys of `task_settings` it sets to their defaults: a
/// file that repeats the defaults (the official `config.yaml`, ours) leaves the task's own
/// settings standing; a value of its own still wins, as does every value of a file resolved
/// for its task (a run's `config.yaml`, which says what it ran with).
fn defaults_left_to_task(layer: Value, task_settings: &[String]) -> Value {
    let (Value::Mapping(mut mapping), Ok(Value::Mapping(defaults))) =
        (layer.clone(), defaults::tree())
    else {
        return layer;
    };
    if is_resolved(&layer) {
        return layer;
    }
    for key in task_settings
        .iter()
        .filter_map(|s| s.split_once('='))
        .map(|(k, _)| k)
    {
        if mapping
            .get(key)
            .is_some_and(|v| defaults.get(key) == Some(v))
        {
            mapping.remove(key);
        }
    }
    Value::Mapping(mapping)
}

/// Whether a config file was resolved for a task (a run's saved `config.yaml` holds its
/// `episode_length`; the official `config.yaml` has the field too, as "???", to be given).
fn is_resolved(layer: &Value) -> bool {
    layer
        .get("episode_length")
        .is_some_and(|v| !v.is_null() && !hydra::is_hydra_missing(v))
}

/// A config file resolved for a task (a run's saved `config.yaml`: it holds `episode_length`)
/// keeps that task's discount, seed steps and extra planning iterations: another task would
/// silently train with them.
fn refuse_a_resolved_file_for_another_task(file: &Path, layer: &Value, task: &str) -> Result<()> {
    let file_task = layer.get("task").and_then(Value::as_str);
    match (is_resolved(layer), file_task) {
        (true, Some(resolved_for)) if resolved_for != task => Err(Error::Config(format!(
            "{} is a config resolved for task={resolved_for} (a run's config.yaml: it holds \
             episode_length), whose discount, seed_steps and planning iterations were derived \
             for that task; for task={task}, start from a file without the derived fields ({}, \
             discount, seed_steps) and with the iterations you chose",
            file.display(),
            DERIVED_FIELDS.join(", ")
        ))),
        _ => Ok(()),
    }
}

/// The deepest brackets a config takes (`[[...]]` lists of lists are two): the YAML parser
/// takes time growing with the square of the depth (a 200 KB file of brackets, 19 s).
const MOST_NESTING: usize = 32;

/// Refuses `text` (a config file, or a command-line value) nested deeper than [`MOST_NESTING`]
/// in flow brackets, before it is parsed.
pub(crate) fn refuse_deep_nesting(text: &str, what: &str) -> Result<()> {
    let (mut depth, mut deepest, mut quote) = (0usize, 0usize, None);
    for c in text.chars() {
        match (c, quote) {
            ('"' | '\'', None) => quote = Some(c),
            (c, Some(q)) if c == q => quote = None,
            ('[' | '{', None) => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (']' | '}', None) => depth = depth.saturating_sub(1),
            ('\n', _) => quote = None,
            _ => {}
        }
        if deepest > MOST_NESTING {
            return Err(Error::Config(format!(
                "{what}: brackets nested more than {MOST_NESTING} deep; no setting takes that"
            )));
        }
    }
    Ok(())
}

impl Source {
    /// Refuses a command-line setting of a field derived from the task.
    pub fn refuse_derived_settings(&self) -> Result<()> {
        for arg in &self.overrides {
            let key = arg.split_once('=').map_or(arg.as_str(), |(key, _)| key);
            let key = key.trim().trim_start_matches(['+', '~']);
            if DERIVED_FIELDS.contains(&key) {
                let from = match key {
                    "bin_size" => "from vmin, vmax and num_bins",
                    "obs_shapes" | "action_dims" | "episode_lengths" => {
                        "from the tasks of a multitask run"
                    }
                    _ => "from the task's environment",
                };
                return Err(Error::Config(format!(
                    "{key} is derived ({from}): it cannot be set"
                )));
            }
        }
        Ok(())
    }
}

impl Config {
    /// Builds a config from the compiled-in defaults, an optional named file laid over them,
    /// then `key=value` overrides. Validates everything that does not need the environment.
    /// The task's own settings (see [`tasks::task_settings`]), then [`Source::beneath`], come
    /// between the defaults and the file; a file's value equal to the default leaves a task's
    /// setting standing.
    pub fn load(source: &Source) -> Result<Config> {
        let file = match source.file()? {
            Some(file) => {
                let text = std::fs::read_to_string(&file)
                    .map_err(|e| Error::Config(format!("cannot read {}: {e}", file.display())))?;
                refuse_deep_nesting(&text, &file.display().to_string())?;
                let layer: Value = serde_yaml_ng::from_str(&text)
                    .map_err(|e| Error::Config(format!("{}: {e}", file.display())))?;
                Some((file, layer))
            }
            None => None,
        };
        let config = Self::layered(&source.beneath, file.clone(), &source.overrides)?;
        if let Some((file, layer)) = &file {
            refuse_a_resolved_file_for_another_task(file, layer, &config.task)?;
        }
        let task_settings = tasks::task_settings(&config.task, config.offline());
        let config = match task_settings.is_empty() {
            true => config,
            false => {
                let file =
                    file.map(|(path, layer)| (path, defaults_left_to_task(layer, &task_settings)));
                let settings = [task_settings, source.beneath.clone()].concat();
                Self::layered(&settings, file, &source.overrides)?
            }
        };
        config.validate()?;
        config.validate_tracker_env(|key| std::env::var(key).ok())?;
        Ok(config)
    }

    /// The defaults, then `settings`, the file and the overrides, each laid over the last.
    fn layered(
        settings: &[String],
        file: Option<(PathBuf, Value)>,
        overrides: &[String],
    ) -> Result<Config> {
        let mut tree = defaults::tree()?;
        for setting in settings {
            apply_override(&mut tree, setting)?;
        }
        let mut from_file = None;
        if let Some((file, layer)) = file {
            let keys: Vec<String> = layer
                .as_mapping()
                .into_iter()
                .flat_map(|map| map.keys().filter_map(Value::as_str).map(str::to_owned))
                .collect();
            overrides::merge_file(&mut tree, layer, &file)?;
            from_file = Some((file, keys));
        }
        let mut raw = BTreeMap::new();
        for arg in overrides {
            apply_override(&mut tree, arg)?;
            if let Some((key, value)) = arg.split_once('=') {
                raw.insert(key.trim().trim_start_matches('+'), value.trim());
            }
        }
        // A value of the file's (not given again on the command line) is named with the file.
        let origin = |key: &str| match &from_file {
            Some((file, keys)) if keys.iter().any(|k| k == key) && !raw.contains_key(key) => {
                Some(file.display().to_string())
            }
            _ => None,
        };
        overrides::from_tree(tree, &raw, &origin)
    }

    /// The resolved config as YAML (what `--cfg job` prints and each run saves).
    pub fn to_yaml(&self) -> Result<String> {
        serde_yaml_ng::to_string(self)
            .map_err(|e| Error::Config(format!("cannot write config: {e}")))
    }

    /// The settings every node of a job must share (YAML), [`NODE_SETTINGS`] aside: nodes
    /// given another `lr` drift apart, another `batch_size` or `sync_freq` hang in a
    /// collective.
    pub fn job_settings(&self) -> Result<String> {
        let mut settings = serde_yaml_ng::to_value(self)
            .map_err(|e| Error::Config(format!("cannot write config: {e}")))?;
        if let Value::Mapping(map) = &mut settings {
            for key in NODE_SETTINGS {
                map.remove(key);
            }
            // Where each node keeps the dataset is its own; whether it trains on one is not.
            map.insert("offline".into(), self.offline().into());
        }
        serde_yaml_ng::to_string(&settings)
            .map_err(|e| Error::Config(format!("cannot write config: {e}")))
    }
}

/// The file a run's resolved config is saved as, in its run directory.
pub const RUN_CONFIG_FILE: &str = "config.yaml";

/// The settings each node of a job may give its own: its rank, how it reaches node 0, its
/// paths, and how it uses its own cores.
pub const NODE_SETTINGS: [&str; 12] = [
    "node_rank",
    "master_addr",
    "run_dir",
    "data_dir",
    "checkpoint",
    "resume",
    "verify_data",
    "num_threads",
    "cpu_affinity",
    "env_workers",
    "actor_threads",
    "env_timeout",
];

/// Where a run resumes from and where its nodes meet: they change with every resume or requeue.
pub const PLACEMENT_SETTINGS: [&str; 4] = ["resume", "master_addr", "master_port", "node_rank"];

/// The settings that change how a run executes, reports and keeps its files, not what it
/// learns: runs that differ only in these (and their seed) are seeds of one configuration.
pub const EXECUTION_SETTINGS: [&str; 27] = [
    "resume",
    "master_addr",
    "master_port",
    "node_rank",
    "run_dir",
    "checkpoint",
    "verify_data",
    "wandb_project",
    "wandb_entity",
    "wandb_name",
    "wandb_silent",
    "enable_wandb",
    "enable_tensorboard",
    "enable_mlflow",
    "save_csv",
    "save_video",
    "save_agent",
    "save_freq",
    "save_buffer",
    "keep_checkpoints",
    "dist_timeout",
    "launcher",
    "peer_timeout",
    "stop_grace",
    "max_restarts",
    "env_timeout",
    "cpu_affinity",
];

/// The settings whose values differ from one saved config (YAML) to another, `key: old → new`
/// in key order; [`PLACEMENT_SETTINGS`] aside. None where either does not parse.
pub fn changed_settings(old: &str, new: &str) -> Vec<String> {
    let parse = |text: &str| serde_yaml_ng::from_str::<BTreeMap<String, Value>>(text).ok();
    let (Some(old), Some(new)) = (parse(old), parse(new)) else {
        return Vec::new();
    };
    let show = |value: Option<&Value>| match value {
        None => "(absent)".to_owned(),
        Some(value) => serde_yaml_ng::to_string(value)
            .map(|text| text.trim_end().replace('\n', " "))
            .unwrap_or_default(),
    };
    // A field a later version added is absent from an earlier file: as null, its default.
    fn set<'a>(map: &'a BTreeMap<String, Value>, key: &str) -> Option<&'a Value> {
        map.get(key).filter(|v| !v.is_null())
    }
    let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    keys.into_iter()
        .filter(|key| {
            !PLACEMENT_SETTINGS.contains(&key.as_str()) && set(&old, key) != set(&new, key)
        })
        .map(|key| format!("{key}: {} → {}", show(old.get(key)), show(new.get(key))))
        .collect()
}

#[cfg(test)]
mod tests;
