//! The policy `eval` and `collect` play with: built from the command's settings on the device
//! they ask for, with the weights of a checkpoint checked against the hash it recorded.
use std::path::Path;

use crate::actor::Policy;
use crate::agent::{AgentConfig, TorchNoise};
use crate::config::{Config, Source, PRESET_SETTINGS, RUN_CONFIG_FILE};
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
    let key = |change: &String| change.split(':').next().unwrap_or_default().to_owned();
    let taken_here: Vec<String> =
        crate::config::changed_settings(&own.to_yaml()?, &taken.to_yaml()?)
            .into_iter()
            .filter(|change| MODEL_SETTINGS.contains(&key(change).as_str()))
            .collect();
    if !taken_here.is_empty() {
        errln!(
            "{verb}: the model is built as in its run's {} (this command's → the run's): {}",
            file.display(),
            taken_here.join("; ")
        );
    }
    Ok(with)
}

/// The model settings a run's `config.yaml` holds, as `key=value` overrides: those its model
/// size sets only where it has none, and no `task_dim` (a task list's follows the official
/// rule).
fn model_settings_in(file: &Path) -> std::result::Result<Vec<String>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
    crate::config::refuse_deep_nesting(&text, &file.display().to_string())
        .map_err(|e| e.to_string())?;
    let run: serde_yaml_ng::Mapping = serde_yaml_ng::from_str(&text).map_err(|e| e.to_string())?;
    let sized = run.get("model_size").is_some_and(|size| !size.is_null());
    let mut settings = Vec::new();
    for key in MODEL_SETTINGS {
        let set_by_its_size = sized && PRESET_SETTINGS.contains(&key);
        let Some(value) = run
            .get(key)
            .filter(|_| key != "task_dim" && !set_by_its_size)
        else {
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

/// The settings that build the model; those a model size sets are left out when it differs.
const MODEL_SETTINGS: [&str; 13] = [
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
    "simnorm_dim",
    "task_dim",
    "episodic",
];

/// What the run that saved `weights` built its model with and this command sets otherwise,
/// from the run's `config.yaml`: the settings to give.
fn settings_of_its_run(weights: &Path, config: &Config) -> String {
    let unnamed = ", as in its run's config.yaml".to_string();
    let Some(file) = crate::checkpoint::run_of_model(weights)
        .map(|run| run.join(crate::config::RUN_CONFIG_FILE))
    else {
        return unnamed;
    };
    let (Ok(theirs), Ok(ours)) = (std::fs::read_to_string(&file), config.to_yaml()) else {
        return unnamed;
    };
    let changes = crate::config::changed_settings(&theirs, &ours);
    let key = |change: &String| change.split(':').next().unwrap_or_default().to_owned();
    let sized = changes.iter().any(|change| key(change) == "model_size");
    let preset = crate::config::PRESET_SETTINGS;
    let differ: Vec<&String> = changes
        .iter()
        .filter(|change| MODEL_SETTINGS.contains(&key(change).as_str()))
        .filter(|change| !(sized && preset.contains(&key(change).as_str())))
        .collect();
    match differ.is_empty() {
        true => format!(", as in its run's {}", file.display()),
        false => format!(
            "; its run's {} differs in (trained with → given here): {} (left out, they are \
             taken from it)",
            file.display(),
            differ
                .iter()
                .map(|change| change.as_str())
                .collect::<Vec<_>>()
                .join("; ")
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
    fn a_runs_model_settings_are_those_its_size_does_not_set() {
        let sized = "task: '[walker-run,cup-catch]'\nmodel_size: 5\nlatent_dim: 512\n\
                     task_dim: 64\nnum_bins: 101\nepisodic: false\nlr: 0.0003\n";
        assert_eq!(
            settings_in(sized),
            [
                "task=[walker-run,cup-catch]",
                "model_size=5",
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
