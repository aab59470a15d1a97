//! The policy `eval` and `collect` play with: built from the command's settings on the device
//! they ask for, with the weights of a checkpoint checked against the hash it recorded.
use std::path::Path;

use crate::actor::Policy;
use crate::agent::{AgentConfig, TorchNoise};
use crate::checkpoint::WeightsGiven;
use crate::config::Config;
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
            let weights =
                crate::checkpoint::model_file(Path::new(path), WeightsGiven::AsCheckpoint)?;
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
                 obs={}): give it those the checkpoint was trained with{}{}",
                config.model_size.map_or("null".into(), |m| m.to_string()),
                config.task,
                config.obs,
                super::run_settings::differing_model_settings(&weights, config),
                super::run_settings::model_size_hint(&weights, config)
            )),
            other => other.into(),
        })?;
        super::run_settings::note_playing_otherwise(&weights, config);
    }
    Ok(policy)
}
