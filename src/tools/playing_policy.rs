//! The policy `eval` and `collect` play with: built from the command's settings on the device
//! they ask for, with the weights of a checkpoint checked against the hash it recorded.
use std::path::Path;

use crate::actor::Policy;
use crate::agent::{AgentConfig, TorchNoise};
use crate::config::{Config, Source, RUN_CONFIG_FILE};
use crate::ddp::RankInfo;
use crate::error::{Error, Result};

/// A policy for `num_envs` environments, with the weights of `checkpoint` (a checkpoint
/// directory or a file in one, a run directory, or a `.safetensors` file) when one is given.
pub fn build(
    config: &Config,
    rank: &RankInfo,
    num_envs: usize,
    checkpoint: Option<&str>,
) -> Result<Policy> {
    let weights = match checkpoint {
        Some(path) => {
            let weights = crate::checkpoint::model_file(Path::new(path))?;
            crate::checkpoint::say_which_weights(Path::new(path), &weights);
            crate::checkpoint::verify_model(&weights)?;
            // Another task with the same sizes loads (a transfer, or a mistake): say so. Lists
            // compare as lists (mt30 is its thirty tasks).
            if let Some(trained) = crate::checkpoint::trained_task(&weights) {
                let same = |a: &str, b: &str| {
                    let list = crate::config::task_list;
                    a == b || matches!((list(a), list(b)), (Ok(x), Ok(y)) if x == y)
                };
                if !same(&trained, &config.task) {
                    errln!(
                        "warning: checkpoint={path} was trained on task={trained}; playing it \
                         on task={}",
                        config.task
                    );
                }
            }
            Some(weights)
        }
        None => None,
    };
    let device = crate::device::select(&config.device, rank, false)?;
    tch::set_num_threads(crate::device::threads(config.num_threads, 1) as i32);
    tch::manual_seed(config.seed as i64);
    let mut policy = Policy::new(
        &AgentConfig::from_config(config)?,
        device,
        num_envs,
        Box::new(TorchNoise::global()),
    )?;
    if let Some(weights) = weights {
        policy.load_file(&weights).map_err(|e| match e {
            crate::agent::Error::Mismatch { .. } => Error::Config(format!(
                "{e}. The model is built from this command's settings (model_size={}, task={}, \
                 obs={}): give it those the checkpoint was trained with{}",
                config.model_size.map_or("null".into(), |m| m.to_string()),
                config.task,
                config.obs,
                settings_of_its_run(&weights, config)
            )),
            other => other.into(),
        })?;
        note_planning_otherwise(&weights, config);
    }
    Ok(policy)
}

/// `source` with the settings that built the model of its `checkpoint=`, where a run saved it,
/// laid beneath its own (from the run's config.yaml): a run's checkpoint plays without its
/// sizes given again, and a setting given here still wins. `verb` says which it took.
pub fn with_settings_of_its_run(source: Source, verb: &str) -> Result<Source> {
    let own = Config::load(&source)?;
    let Some(checkpoint) = own.checkpoint.as_deref() else {
        return Ok(source);
    };
    let weights = crate::checkpoint::model_file(Path::new(checkpoint))?;
    let Some(file) = crate::checkpoint::run_of_model(&weights).map(|run| run.join(RUN_CONFIG_FILE))
    else {
        return Ok(source);
    };
    let beneath = match model_settings_in(&file) {
        Ok(settings) => settings,
        Err(why) => {
            errln!(
                "warning: {verb} cannot read the settings of the checkpoint's run in {}: {why}; \
                 the model is built from this command's",
                file.display()
            );
            return Ok(source);
        }
    };
    let with = Source { beneath, ..source };
    let taken = Config::load(&with).map_err(|e| {
        Error::Config(format!(
            "with the model settings of the checkpoint's run ({}): {e}",
            file.display()
        ))
    })?;
    let taken_here = model_changes(&own, &taken)?;
    if !taken_here.is_empty() {
        errln!(
            "{verb}: the model is built as in its run's {} (this command's → the run's): {}",
            file.display(),
            taken_here.join("; ")
        );
    }
    Ok(with)
}

/// The model settings a run's `config.yaml` holds, as `key=value` overrides, `task_dim` aside
/// (a task list's follows the official rule).
fn model_settings_in(file: &Path) -> std::result::Result<Vec<String>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
    crate::config::refuse_deep_nesting(&text, &file.display().to_string())
        .map_err(|e| e.to_string())?;
    let run: serde_yaml_ng::Mapping = serde_yaml_ng::from_str(&text).map_err(|e| e.to_string())?;
    let mut settings = Vec::new();
    for key in MODEL_SETTINGS.into_iter().filter(|key| *key != "task_dim") {
        let Some(value) = run.get(key) else {
            continue;
        };
        let text = match value {
            serde_yaml_ng::Value::String(text) => text.clone(),
            other => serde_yaml_ng::to_string(other)
                .map_err(|e| e.to_string())?
                .trim_end()
                .to_owned(),
        };
        settings.push(format!("{key}={text}"));
    }
    Ok(settings)
}

/// The settings that build the model, or change what it computes.
const MODEL_SETTINGS: [&str; 17] = [
    "task",
    "obs",
    "model_size",
    "latent_dim",
    "enc_dim",
    "mlp_dim",
    "num_enc_layers",
    "num_q",
    "num_channels",
    "num_bins",
    "vmin",
    "vmax",
    "simnorm_dim",
    "log_std_min",
    "log_std_max",
    "task_dim",
    "episodic",
];

/// The settings of the planner, which this command's own choose.
const PLANNING_SETTINGS: [&str; 10] = [
    "mpc",
    "iterations",
    "num_samples",
    "num_elites",
    "num_pi_trajs",
    "horizon",
    "min_std",
    "max_std",
    "temperature",
    "discount",
];

/// The changes from one config (YAML) to another in the settings of `keys`.
fn changes_in(keys: &[&str], from: &str, to: &str) -> Vec<String> {
    let key = |change: &String| change.split(':').next().unwrap_or_default().to_owned();
    crate::config::changed_settings(from, to)
        .into_iter()
        .filter(|change| keys.contains(&key(change).as_str()))
        .collect()
}

/// The changes from one config to another in the settings of the model, as it is built: the
/// widths that the model size of `to` sets are left out (its `model_size` says them).
fn model_changes(from: &Config, to: &Config) -> Result<Vec<String>> {
    let (mut from, mut to) = (from.clone(), to.clone());
    from.apply_model_size()?;
    let set_by_its_size = to.apply_model_size()?;
    let changes = changes_in(&MODEL_SETTINGS, &from.to_yaml()?, &to.to_yaml()?);
    let key = |change: &String| change.split(':').next().unwrap_or_default().to_owned();
    Ok(changes
        .into_iter()
        .filter(|change| !set_by_its_size.contains(&key(change).as_str()))
        .collect())
}

/// The planner's settings (resolved, as a run saves them) where this command's differ from
/// those of the run that saved `weights`: the returns it reports are not the run's otherwise.
fn note_planning_otherwise(weights: &Path, config: &Config) {
    let Some(file) = crate::checkpoint::run_of_model(weights).map(|run| run.join(RUN_CONFIG_FILE))
    else {
        return;
    };
    let (Ok(theirs), Ok(ours)) = (std::fs::read_to_string(&file), config.to_yaml()) else {
        return;
    };
    let changes = changes_in(&PLANNING_SETTINGS, &theirs, &ours);
    if !changes.is_empty() {
        errln!(
            "note: planning otherwise than the checkpoint's run (its {} → here): {}",
            file.display(),
            changes.join("; ")
        );
    }
}

/// What the run that saved `weights` built its model with and this command sets otherwise,
/// from the run's `config.yaml`: the settings to give.
fn settings_of_its_run(weights: &Path, config: &Config) -> String {
    let unnamed = ", as in its run's config.yaml".to_string();
    let Some(file) = crate::checkpoint::run_of_model(weights)
        .map(|run| run.join(crate::config::RUN_CONFIG_FILE))
    else {
        return unnamed;
    };
    // Laid over the defaults, as a config file: a file of an older version lacks fields.
    let theirs = file.parent().and_then(|run| {
        Config::load(&Source {
            config_path: Some(run.to_path_buf()),
            config_name: Some(RUN_CONFIG_FILE.into()),
            ..Source::default()
        })
        .ok()
    });
    let Some(differ) = theirs.and_then(|theirs| model_changes(&theirs, config).ok()) else {
        return unnamed;
    };
    match differ.is_empty() {
        true => format!(", as in its run's {}", file.display()),
        false => format!(
            "; its run's {} differs in (trained with → given here): {} (the run's are taken \
             where neither the command line nor a --config-name file sets them)",
            file.display(),
            differ.join("; ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings_in(yaml: &str) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(RUN_CONFIG_FILE);
        std::fs::write(&file, yaml).unwrap();
        model_settings_in(&file).unwrap()
    }

    #[test]
    fn a_runs_model_settings_are_taken_but_its_task_dim() {
        let sized = "task: '[walker-run,cup-catch]'\nmodel_size: 5\nlatent_dim: 512\n\
                     task_dim: 64\nnum_bins: 101\nepisodic: false\nlr: 0.0003\n";
        assert_eq!(
            settings_in(sized),
            [
                "task=[walker-run,cup-catch]",
                "model_size=5",
                "latent_dim=512",
                "num_bins=101",
                "episodic=false"
            ]
        );
        let widths = "task: walker-run\nmodel_size: null\nlatent_dim: 96\nobs: rgb\n";
        assert_eq!(
            settings_in(widths),
            [
                "task=walker-run",
                "obs=rgb",
                "model_size=null",
                "latent_dim=96"
            ]
        );
    }

    #[test]
    fn a_run_config_that_is_no_mapping_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(RUN_CONFIG_FILE);
        std::fs::write(&file, "- a list\n").unwrap();
        assert!(model_settings_in(&file).is_err());
        assert!(model_settings_in(&dir.path().join("absent.yaml")).is_err());
    }
}
