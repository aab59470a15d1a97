//! The settings of the run that saved a checkpoint `eval` or `collect` plays: those that build
//! its model are taken beneath the command's own, and those the command plays otherwise with
//! are said.
use std::path::{Path, PathBuf};

use crate::checkpoint::WeightsGiven;
use crate::config::{Config, Source, RUN_CONFIG_FILE};
use crate::error::{Error, Result};

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

/// The settings of the planner, which stay the command's.
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

/// `source` with the settings that built the model of its `checkpoint=`, where a run saved it,
/// laid beneath its own: a run's checkpoint plays without its sizes given again, and a setting
/// the command sets (on its command line or in its `--config-name` file) still wins. `verb`
/// says which it took.
pub fn taken_beneath(source: Source, verb: &str) -> Result<Source> {
    let own = Config::load(&source)?;
    let Some(checkpoint) = own.checkpoint.as_deref() else {
        return Ok(source);
    };
    let weights = crate::checkpoint::model_file(Path::new(checkpoint), WeightsGiven::AsCheckpoint)?;
    // Without its run's settings, a checkpoint still says which task it was trained on: the
    // default task would not fit it.
    let trained_task = || {
        let task = crate::checkpoint::trained_task(&weights)?;
        Some(Source {
            beneath: vec![format!("task={task}")],
            ..source.clone()
        })
    };
    let Some(file) = config_file_of_run(&weights) else {
        return Ok(trained_task().unwrap_or(source));
    };
    let beneath = match model_settings_in(&file) {
        Ok(settings) => settings,
        Err(why) => {
            let with_task = trained_task();
            let task = match &with_task {
                Some(with) => format!(", on the task it was trained on ({})", with.beneath[0]),
                None => String::new(),
            };
            errln!(
                "warning: {verb} cannot read the settings of the checkpoint's run in {}: {why}; \
                 the model is built from this command's settings{task}",
                file.display()
            );
            return Ok(with_task.unwrap_or(source));
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
        // `key: ours → the run's` as the setting taken.
        let taken: Vec<String> = taken_here
            .iter()
            .map(|change| match change.split_once(": ") {
                Some((key, values)) => {
                    format!("{key}={}", values.rsplit(" → ").next().unwrap_or(values))
                }
                None => change.clone(),
            })
            .collect();
        errln!(
            "{verb}: the model is built with its run's settings ({}): {}",
            file.display(),
            taken.join(" ")
        );
    }
    Ok(with)
}

/// What the run that saved `weights` built its model with and `config` (the command's, resolved)
/// sets otherwise: the end of the message of a checkpoint that does not fit the model.
pub fn differing_model_settings(weights: &Path, config: &Config) -> String {
    let unnamed = ", as in its run's config.yaml".to_string();
    let Some(file) = config_file_of_run(weights) else {
        return unnamed;
    };
    let differ = match run_config(&file) {
        Some(theirs) => model_changes(&theirs, config).ok(),
        // A file this version no longer loads: compared as written.
        None => std::fs::read_to_string(&file)
            .ok()
            .zip(config.to_yaml().ok())
            .map(|(theirs, ours)| changes_in(&MODEL_SETTINGS, &theirs, &ours)),
    };
    match differ {
        None => unnamed,
        Some(differ) if differ.is_empty() => format!(", as in its run's {}", file.display()),
        Some(differ) => format!(
            "; its run's {} differs in (trained with → given here): {} (the run's are taken \
             where neither the command line nor a --config-name file sets them)",
            file.display(),
            differ.join("; ")
        ),
    }
}

/// The model size whose widths the checkpoint `weights` has, where `config` builds another (the
/// dynamics' hidden width: each size's preset sets another): the end of the message of a
/// checkpoint that does not fit the model.
pub fn model_size_hint(weights: &Path, config: &Config) -> String {
    use crate::agent::world_model::DYNAMICS;
    let mlp_dim = crate::checkpoint::tensor_file::TensorFile::open(weights)
        .ok()
        .and_then(|file| file.describe(&format!("{DYNAMICS}.0.weight")))
        .and_then(|(shape, _)| shape.first().copied());
    let Some(mlp_dim) = mlp_dim.filter(|&dim| dim as usize != config.mlp_dim) else {
        return String::new();
    };
    match crate::config::model_size_of_mlp_dim(mlp_dim as usize) {
        Some(size) => format!(
            " (its widths are model_size={size}'s: mlp_dim {mlp_dim}, here {})",
            config.mlp_dim
        ),
        None => format!(" (its mlp_dim is {mlp_dim}, here {})", config.mlp_dim),
    }
}

/// Says where `config` (the command's, resolved) plays the checkpoint of a run otherwise than
/// the run did: another planner, or model settings that change no shape (`vmax`, ...). The
/// returns are then not what the run's evaluations measured.
pub fn note_playing_otherwise(weights: &Path, config: &Config) {
    let Some(file) = config_file_of_run(weights) else {
        return;
    };
    let (Ok(theirs), Ok(ours)) = (std::fs::read_to_string(&file), config.to_yaml()) else {
        return;
    };
    // The task is warned of where the checkpoint is loaded.
    let keys: Vec<&str> = (MODEL_SETTINGS.iter().filter(|key| **key != "task"))
        .chain(&PLANNING_SETTINGS)
        .copied()
        .collect();
    let changes = changes_in(&keys, &theirs, &ours);
    if !changes.is_empty() {
        errln!(
            "note: playing otherwise than the checkpoint's run (its {} → here): {}",
            file.display(),
            changes.join("; ")
        );
    }
}

/// The `config.yaml` of the run that saved `weights`, when a run did.
fn config_file_of_run(weights: &Path) -> Option<PathBuf> {
    crate::checkpoint::run_of_model(weights).map(|run| run.join(RUN_CONFIG_FILE))
}

/// A run's config file laid over the defaults (a file of an older version lacks fields); None
/// where it does not load.
fn run_config(file: &Path) -> Option<Config> {
    Config::load(&Source {
        config_path: Some(file.parent()?.to_path_buf()),
        config_name: Some(file.file_name()?.to_string_lossy().into_owned()),
        ..Source::default()
    })
    .ok()
}

/// The model settings a run's `config.yaml` holds, as `key=value` overrides: not `task_dim` (a
/// task list's follows the official rule), nor the widths its model size set (another model
/// size given to the command sets its own).
fn model_settings_in(file: &Path) -> std::result::Result<Vec<String>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
    crate::config::refuse_deep_nesting(&text, &file.display().to_string())
        .map_err(|e| e.to_string())?;
    let run: serde_yaml_ng::Mapping = serde_yaml_ng::from_str(&text).map_err(|e| e.to_string())?;
    let set_by_its_size = run_config(file)
        .and_then(|mut config| config.apply_model_size().ok())
        .unwrap_or_default();
    let mut settings = Vec::new();
    for key in MODEL_SETTINGS {
        let Some(value) = run.get(key) else {
            continue;
        };
        if key == "task_dim" || set_by_its_size.contains(&key) {
            continue;
        }
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

/// The changes from one config (YAML) to another in the settings of `keys`.
fn changes_in(keys: &[&str], from: &str, to: &str) -> Vec<String> {
    crate::config::changed_settings(from, to)
        .into_iter()
        .filter(|change| keys.contains(&key_of(change)))
        .collect()
}

/// The changes from one config to another in the settings of the model, as it is built: the
/// widths that the model size of `to` sets are left out (its `model_size` says them).
fn model_changes(from: &Config, to: &Config) -> Result<Vec<String>> {
    let (mut from, mut to) = (from.clone(), to.clone());
    from.apply_model_size()?;
    let set_by_its_size = to.apply_model_size()?;
    let changes = changes_in(&MODEL_SETTINGS, &from.to_yaml()?, &to.to_yaml()?);
    Ok(changes
        .into_iter()
        .filter(|change| !set_by_its_size.contains(&key_of(change)))
        .collect())
}

/// The setting a change (`key: old → new`) is of.
fn key_of(change: &str) -> &str {
    change.split(':').next().unwrap_or_default()
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
    fn a_runs_model_settings_are_taken_but_those_its_size_set() {
        // Size 5 sets no num_q: the run's own is taken.
        let sized = "task: '[walker-run,cup-catch]'\nmodel_size: 5\nlatent_dim: 512\n\
                     num_q: 2\ntask_dim: 64\nnum_bins: 101\nepisodic: false\nlr: 0.0003\n";
        assert_eq!(
            settings_in(sized),
            [
                "task=[walker-run,cup-catch]",
                "model_size=5",
                "num_q=2",
                "num_bins=101",
                "episodic=false"
            ]
        );
        // With pixels no model size sets the latent width.
        let pixels = "task: walker-run\nobs: rgb\nmodel_size: 1\nlatent_dim: 256\n\
                      num_channels: 16\nnum_q: 2\n";
        assert_eq!(
            settings_in(pixels),
            [
                "task=walker-run",
                "obs=rgb",
                "model_size=1",
                "latent_dim=256",
                "num_channels=16"
            ]
        );
        let widths = "task: walker-run\nmodel_size: null\nlatent_dim: 96\nvmax: 5.0\n";
        assert_eq!(
            settings_in(widths),
            [
                "task=walker-run",
                "model_size=null",
                "latent_dim=96",
                "vmax=5.0"
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
