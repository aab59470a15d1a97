//! The one source of every default, preset and allowed value: `configs/config.yaml` for the
//! defaults (compiled in), the official model-size presets, and the lists of values that
//! string settings accept.
use std::collections::BTreeMap;

use serde_yaml_ng::Value;

use super::{overrides, Config, Source};
use crate::error::{Error, Result};

/// The defaults, compiled in so the binary works from any directory.
pub const DEFAULTS_YAML: &str = include_str!("../../configs/config.yaml");

/// Model-size presets of the official code (MODEL_SIZE); a preset overrides these keys.
pub const MODEL_SIZES: [u32; 5] = [1, 5, 19, 48, 317];

/// `device`: these, or `cuda:N`.
pub const DEVICES: [&str; 3] = ["auto", "cpu", "cuda"];
/// `dist_backend`.
pub const DIST_BACKENDS: [&str; 3] = ["auto", "gloo", "nccl"];
/// `launcher`.
pub const LAUNCHERS: [&str; 4] = ["auto", "builtin", "torchrun", "slurm"];
/// `lr_scale`.
pub const LR_SCALES: [&str; 3] = ["none", "linear", "sqrt"];
/// The most ranks a run may have (`world_size`).
pub const MAX_WORLD_SIZE: usize = 1 << 16;
/// The most environments a rank may play (`num_envs`).
pub const MAX_NUM_ENVS: usize = 4096;

/// The widths a model-size preset sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Preset {
    pub enc_dim: usize,
    pub mlp_dim: usize,
    pub latent_dim: usize,
    pub num_enc_layers: usize,
    /// Only sizes 1 and 317 set it, as in the official table: at the others, `num_q` is the
    /// user's (default 5).
    pub num_q: Option<usize>,
}

pub(super) fn preset(size: u32) -> Option<Preset> {
    let p = |enc_dim, mlp_dim, latent_dim, num_enc_layers, num_q| Preset {
        enc_dim,
        mlp_dim,
        latent_dim,
        num_enc_layers,
        num_q,
    };
    Some(match size {
        1 => p(256, 384, 128, 2, Some(2)),
        5 => p(256, 512, 512, 2, None),
        19 => p(1024, 1024, 768, 3, None),
        48 => p(1792, 1792, 768, 4, None),
        317 => p(4096, 4096, 1376, 5, Some(8)),
        _ => return None,
    })
}

/// The model size whose preset sets `mlp_dim` (each sets another): what built a checkpoint.
pub fn model_size_of_mlp_dim(mlp_dim: usize) -> Option<u32> {
    MODEL_SIZES
        .into_iter()
        .find(|&size| preset(size).is_some_and(|p| p.mlp_dim == mlp_dim))
}

/// The defaults as a YAML tree, the base every file and override is laid over.
pub(super) fn tree() -> Result<Value> {
    serde_yaml_ng::from_str(DEFAULTS_YAML)
        .map_err(|e| Error::Config(format!("built-in defaults: {e}")))
}

impl Config {
    /// The compiled-in defaults, unvalidated.
    pub(crate) fn defaults() -> Result<Config> {
        overrides::from_tree(tree()?, &BTreeMap::new(), &|_| None)
    }

    /// `env_timeout`'s default: the longest wait for an environment worker's answer before a
    /// run's own config says otherwise (reading a task's spec, `doctor`).
    pub fn default_env_timeout() -> Result<std::time::Duration> {
        Ok(std::time::Duration::from_secs(
            Self::defaults()?.env_timeout,
        ))
    }

    /// The defaults with a model-size preset, resolved for a task of the given dimensions and
    /// 500-step episodes (as DMControl's): the settings benchmarks and tests build agents from.
    pub fn for_dims(model_size: Option<u32>, obs_dim: usize, action_dim: usize) -> Result<Config> {
        let size = model_size.map_or("null".to_owned(), |s| s.to_string());
        let mut config = Config::load(&Source {
            overrides: vec![format!("model_size={size}")],
            ..Source::default()
        })?;
        config.resolve(&envs::EnvSpec {
            obs_shape: vec![obs_dim],
            action_dim,
            episode_length: 500,
        })?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file's comment says its widths are model size 5; the preset table may not drift
    /// from it.
    #[test]
    fn the_file_and_the_presets_agree() {
        let defaults = Config::defaults().unwrap();
        assert_eq!(defaults.model_size, None);
        let file_widths = Preset {
            enc_dim: defaults.enc_dim,
            mlp_dim: defaults.mlp_dim,
            latent_dim: defaults.latent_dim,
            num_enc_layers: defaults.num_enc_layers,
            num_q: None,
        };
        assert_eq!(file_widths, preset(5).unwrap());
        assert!(DEFAULTS_YAML.contains("model_size null keeps these, which equal size 5"));
        for size in MODEL_SIZES {
            let preset = preset(size).unwrap_or_else(|| panic!("size {size} has no preset"));
            assert_eq!(model_size_of_mlp_dim(preset.mlp_dim), Some(size));
        }
    }

    /// Every string setting's default is one of the values it allows.
    #[test]
    fn the_defaults_are_allowed_values() {
        let d = Config::defaults().unwrap();
        assert!(DEVICES.contains(&d.device.as_str()), "{}", d.device);
        assert!(DIST_BACKENDS.contains(&d.dist_backend.as_str()));
        assert!(LAUNCHERS.contains(&d.launcher.as_str()));
        assert!(LR_SCALES.contains(&d.lr_scale.as_str()));
        d.validate().unwrap();
    }

    /// Every key of the file is a field of the config and every field is in the file.
    #[test]
    fn the_file_names_every_field() {
        let file: Value = tree().unwrap();
        let saved: Value =
            serde_yaml_ng::from_str(&Config::defaults().unwrap().to_yaml().unwrap()).unwrap();
        let keys = |v: &Value| -> Vec<String> {
            let mut keys: Vec<String> = v
                .as_mapping()
                .unwrap()
                .keys()
                .map(|k| k.as_str().unwrap().to_owned())
                .collect();
            keys.sort();
            keys
        };
        assert_eq!(keys(&file), keys(&saved));
    }
}
