//! `tdmpc2 bench --cases graphs --device cuda`: milliseconds per plan and per update, eager and
//! as CUDA graphs (`compile=true`), measured in the same run on the same model: the learner's
//! update at batch 256 and the policy's plan for 1 and 16 environments, walker-run dimensions.
use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

use crate::actor::Policy;
use crate::agent::bench::{median, time_ms};
use crate::agent::{AgentConfig, TorchNoise};
use crate::buffer::Batch;
use crate::config::{Config, Source};
use crate::ddp::{ProcessGroup, RankInfo};
use crate::error::{Error, Result};
use crate::learner::{Learner, LearnerSettings};

/// What to measure.
#[derive(Debug, Clone)]
pub struct GraphOptions {
    pub model_sizes: Vec<u32>,
    /// Timed calls per measurement, after the warm-up (and capture) call.
    pub repeats: usize,
    pub device: String,
}

/// The CUDA device graphs need, or why there is none.
fn cuda_device(setting: &str) -> Result<Device> {
    let device = match setting {
        "cpu" => Device::Cpu,
        _ => Device::Cuda(0),
    };
    match crate::cuda::why_no_graphs(device) {
        None => Ok(device),
        Some(why) => Err(Error::Config(format!(
            "bench graphs: --device {setting}: CUDA graphs are unavailable ({why})"
        ))),
    }
}

/// A walker-run sized config of `size` (obs 24, action 6, batch 256).
fn config(size: u32) -> Result<Config> {
    let overrides = [
        format!("model_size={size}"),
        "obs_shape=[24]".into(),
        "action_dim=6".into(),
        "discount=0.99".into(),
        "batch_size=256".into(),
    ];
    Config::load(&Source {
        overrides: overrides.to_vec(),
        ..Source::default()
    })
}

fn random_batch(config: &AgentConfig, batch: i64, device: Device) -> Batch {
    let (h, f) = (config.horizon as i64, (Kind::Float, device));
    Batch {
        obs: Tensor::randn([h + 1, batch, config.obs_dim as i64], f),
        action: Tensor::rand([h, batch, config.action_dim as i64], f) * 2.0 - 1.0,
        reward: Tensor::randn([h, batch, 1], f),
        terminated: Tensor::zeros([h, batch, 1], f),
        task: None,
    }
}

/// Median and fastest of `times`.
fn summary(times: Vec<f64>) -> (f64, f64) {
    let fastest = times.iter().copied().fold(f64::INFINITY, f64::min);
    (median(times), fastest)
}

pub fn run(options: &GraphOptions, print: &mut dyn FnMut(&Value)) -> Result<()> {
    let device = cuda_device(&options.device)?;
    let tf32 = super::trainer_precision(device)?;
    for &size in &options.model_sizes {
        let config = config(size)?;
        let agent = AgentConfig::from_config(&config)?;
        let group = ProcessGroup::alone(RankInfo::single(&config));
        let settings = LearnerSettings::from_config(&config)?.with_capacity(1024);
        let mut learner = Learner::new(&settings, device, &group)?;
        let batch = random_batch(&agent, config.batch_size as i64, device);
        let update = |learner: &mut Learner| {
            learner
                .update_on(std::slice::from_ref(&batch))
                .map(|_| ())
                .map_err(|e| crate::agent::Error::Config(e.to_string()))
        };
        let eager_update = summary(time_ms(device, options.repeats, || update(&mut learner))?);
        learner.capture_updates().map_err(Error::Config)?;
        let graph_update = summary(time_ms(device, options.repeats, || update(&mut learner))?);
        for num_envs in [1usize, 16] {
            let mut policy = Policy::new(&agent, device, num_envs, Box::new(TorchNoise::global()))?;
            policy.load_weights(learner.model())?;
            let obs: Vec<f32> = (0..num_envs * agent.obs_dim)
                .map(|i| (i as f32 * 0.37).sin())
                .collect();
            let t0 = vec![false; num_envs];
            let plan = |policy: &mut Policy| {
                policy
                    .act(&obs, &t0, false)
                    .map(|_| ())
                    .map_err(|e| crate::agent::Error::Config(e.to_string()))
            };
            let eager_plan = summary(time_ms(device, options.repeats, || plan(&mut policy))?);
            policy.capture_plans().map_err(Error::Config)?;
            let graph_plan = summary(time_ms(device, options.repeats, || plan(&mut policy))?);
            print(&json!({
                "case": "graphs",
                "device": format!("{device:?}"),
                "model_size": size,
                "num_envs": num_envs,
                "tf32": tf32,
                "plan_ms": {"eager": eager_plan.0, "graph": graph_plan.0,
                            "eager_min": eager_plan.1, "graph_min": graph_plan.1},
                "update_ms": {"eager": eager_update.0, "graph": graph_update.0,
                              "eager_min": eager_update.1, "graph_min": graph_update.1},
                "plan_speedup": eager_plan.0 / graph_plan.0,
                "update_speedup": eager_update.0 / graph_update.0,
            }));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where graphs cannot run the bench says so, naming the device setting.
    #[test]
    fn without_cuda_the_bench_says_why() {
        let err = cuda_device("cpu").unwrap_err().to_string();
        assert!(
            err.contains("--device cpu") && err.contains("CUDA only"),
            "{err}"
        );
        if !crate::cuda::cuda_graphs_available() {
            let err = cuda_device("cuda").unwrap_err().to_string();
            assert!(err.contains("unavailable"), "{err}");
        }
    }

    #[test]
    fn the_bench_model_has_walker_run_sizes() {
        let agent = AgentConfig::from_config(&config(5).unwrap()).unwrap();
        assert_eq!((agent.obs_dim, agent.action_dim), (24, 6));
        assert_eq!(agent.mlp_dim, 512);
    }
}
