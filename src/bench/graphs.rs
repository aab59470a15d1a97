//! `tdmpc2 bench --cases graphs --device cuda`: milliseconds per plan and per update, eager and
//! as CUDA graphs (`compile=true`), measured in the same run on the same model: the learner's
//! update at batch 256 and the policy's plan for 1 and 16 environments, at walker-run or dog-run
//! dimensions; per model size and task, the device's peak memory and the update's matmul rate
//! beside a large matmul's.
use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

use super::agent::{flop_counts, matmul_gflops, median, task_dims, time_ms};
use super::op_count::{kernel_times, KernelTime};
use crate::actor::Policy;
use crate::agent::{AgentConfig, TorchNoise};
use crate::buffer::Batch;
use crate::config::Config;
use crate::ddp::{ProcessGroup, RankInfo};
use crate::error::{Error, Result};
use crate::learner::{Learner, LearnerSettings};

/// What to measure.
#[derive(Debug, Clone)]
pub struct GraphOptions {
    pub model_sizes: Vec<u32>,
    /// Whose dimensions the models take: walker-run, dog-run.
    pub tasks: Vec<String>,
    /// Timed calls per measurement, after the warm-up (and capture) call.
    pub repeats: usize,
    pub device: String,
    /// Also profile one call of each: the kernels the device ran and their device time.
    pub kernels: bool,
    /// The `fused_kernels` settings to measure the update and the plans with.
    pub fused_kernels: Vec<bool>,
}

/// The CUDA device graphs need, or why there is none.
pub fn cuda_device(setting: &str) -> Result<Device> {
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

/// A config of `size` at `task`'s dimensions (batch 256), resolved as a run would be: the size's
/// preset sets the model's widths, and dog-run's 38 actions two more MPPI iterations.
fn config(size: u32, task: &str) -> Result<Config> {
    let (obs_dim, action_dim) = task_dims(task)?;
    Config::for_dims(Some(size), obs_dim, action_dim)
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

/// One call's timing: median and fastest ms of the timed calls, and with `--kernels` what the
/// device ran for one more call.
struct Measured {
    median: f64,
    fastest: f64,
    kernels: Option<Vec<KernelTime>>,
}

/// Times `options.repeats` calls of `call` after a warm-up call; with `options.kernels`, then
/// profiles one more.
fn measure(
    device: Device,
    options: &GraphOptions,
    mut call: impl FnMut() -> crate::agent::Result<()>,
) -> Result<Measured> {
    let times = time_ms(device, options.repeats, &mut call)?;
    let fastest = times.iter().copied().fold(f64::INFINITY, f64::min);
    let kernels = match options.kernels {
        // Synchronised inside the profile, so that every kernel of the call is recorded.
        true => {
            let synchronised = || {
                call()?;
                crate::cuda::synchronize(device)
                    .map_err(|e| crate::agent::Error::Config(e.to_string()))
            };
            Some(kernel_times(synchronised)?.1)
        }
        false => None,
    };
    Ok(Measured {
        median: median(times),
        fastest,
        kernels,
    })
}

/// The JSON line of one call's kernels (eager or as a graph): launches and device ms per call,
/// and the kinds of kernel that took the most device time.
fn kernels_line(what: &Value, mode: &str, kernels: &[KernelTime]) -> Value {
    let launches: u64 = kernels.iter().map(|k| k.launches).sum();
    let device_us: f64 = kernels.iter().map(|k| k.device_us).sum();
    let top: Vec<Value> = kernels
        .iter()
        .take(KERNELS_SHOWN)
        .map(|k| {
            let name: String = k.name.chars().take(120).collect();
            json!({"name": name, "launches": k.launches, "device_us": k.device_us})
        })
        .collect();
    let mut line = what.clone();
    line["case"] = "graph_kernels".into();
    line["mode"] = mode.into();
    line["launches"] = launches.into();
    line["device_ms"] = (device_us / 1e3).into();
    line["top"] = top.into();
    line
}

/// Kinds of kernel listed per call in a `graph_kernels` line.
const KERNELS_SHOWN: usize = 25;

/// Prints the kernel lines of one call, eager and as a graph, when they were profiled.
fn print_kernels(what: Value, call: &EagerAndGraph, print: &mut dyn FnMut(&Value)) {
    for (mode, measured) in [("eager", &call.eager), ("graph", &call.graph)] {
        if let Some(kernels) = &measured.kernels {
            print(&kernels_line(&what, mode, kernels));
        }
    }
}

/// Side of the square matmul whose rate the update's matmul work is compared with.
const MATMUL_SIDE: i64 = 8192;

pub fn run(options: &GraphOptions, print: &mut dyn FnMut(&Value)) -> Result<()> {
    let setting = crate::cuda::fused::enabled();
    let measured = measure_sizes(options, print);
    // The other cases of the same call run with the setting they were given.
    crate::cuda::fused::set_enabled(setting);
    measured
}

fn measure_sizes(options: &GraphOptions, print: &mut dyn FnMut(&Value)) -> Result<()> {
    // Every case's config first, so that a bad task is refused before anything runs.
    let mut cases = Vec::new();
    for &size in &options.model_sizes {
        for task in &options.tasks {
            cases.push((size, task.as_str(), config(size, task)?));
        }
    }
    let device = cuda_device(&options.device)?;
    let tf32 = super::trainer_precision(device)?;
    // In the trainer's precision (TF32 where it is on), as the update's matmuls run.
    let matmul_gflops = matmul_gflops(device, MATMUL_SIDE);
    for (size, task, config) in &cases {
        let case = json!({"model_size": size, "task": task, "tf32": tf32});
        measure_model(config, &case, device, matmul_gflops, options, print)?;
    }
    Ok(())
}

/// The update and the plans of one model (`case`: its size, task and precision) with each
/// `fused_kernels` setting, then its `graph_size` line.
fn measure_model(
    config: &Config,
    case: &Value,
    device: Device,
    matmul_gflops: f64,
    options: &GraphOptions,
    print: &mut dyn FnMut(&Value),
) -> Result<()> {
    peak(device, true)?;
    let agent = AgentConfig::from_config(config)?;
    let mut last_update = None;
    for &fused in &options.fused_kernels {
        crate::cuda::fused::set_enabled(fused);
        if fused {
            crate::cuda::fused::prepare(device).map_err(|e| Error::Config(e.to_string()))?;
        }
        let mut setting = case.clone();
        setting["fused_kernels"] = fused.into();
        let group = ProcessGroup::alone(RankInfo::single(config));
        let (learner, update) = measure_update(config, &agent, &group, device, options)?;
        print_kernels(with_call(&setting, "update", None), &update, print);
        for num_envs in [1usize, 16] {
            let plan = measure_plan(&agent, &learner, device, num_envs, options)?;
            let mut line = with_call(&setting, "graphs", Some(num_envs));
            line["device"] = format!("{device:?}").into();
            line["plan_ms"] = times(&plan);
            line["update_ms"] = times(&update);
            line["plan_speedup"] = (plan.eager.median / plan.graph.median).into();
            line["update_speedup"] = (update.eager.median / update.graph.median).into();
            print(&line);
            print_kernels(with_call(&setting, "plan", Some(num_envs)), &plan, print);
        }
        last_update = Some((fused, update.graph.median));
    }
    let Some((fused, update_ms_graph)) = last_update else {
        return Ok(());
    };
    let memory = peak(device, false)?;
    let update_gflop = flop_counts(&agent, config.batch_size).1 / 1e9;
    let update_gflops = update_gflop / (update_ms_graph * 1e-3);
    let mut line = case.clone();
    line["case"] = "graph_size".into();
    line["device"] = format!("{device:?}").into();
    line["fused_kernels"] = fused.into();
    line["update_ms_graph"] = update_ms_graph.into();
    line["update_gflop"] = update_gflop.into();
    line["update_gflops"] = update_gflops.into();
    line["matmul_gflops"] = matmul_gflops.into();
    line["matmul_side"] = MATMUL_SIDE.into();
    line["update_fraction_of_matmul"] = (update_gflops / matmul_gflops).into();
    line["peak_allocated_mb"] = (memory.allocated as f64 / 1048576.0).into();
    line["peak_reserved_mb"] = (memory.reserved as f64 / 1048576.0).into();
    print(&line);
    Ok(())
}

/// One call measured eagerly and as a CUDA graph.
struct EagerAndGraph {
    eager: Measured,
    graph: Measured,
}

/// `setting` with the line's case (`graphs`) or call (`update`, `plan`) and its environments.
fn with_call(setting: &Value, call: &str, num_envs: Option<usize>) -> Value {
    let mut line = setting.clone();
    match call {
        "graphs" => line["case"] = "graphs".into(),
        _ => line["call"] = call.into(),
    }
    if let Some(n) = num_envs {
        line["num_envs"] = n.into();
    }
    line
}

fn times(call: &EagerAndGraph) -> Value {
    json!({"eager": call.eager.median, "graph": call.graph.median,
           "eager_min": call.eager.fastest, "graph_min": call.graph.fastest})
}

/// A fresh learner's update at the config's batch, eager and then captured (with the fused
/// kernels as they are set now); the learner, for the plans.
fn measure_update<'g>(
    config: &Config,
    agent: &AgentConfig,
    group: &'g ProcessGroup,
    device: Device,
    options: &GraphOptions,
) -> Result<(Learner<'g>, EagerAndGraph)> {
    let settings = LearnerSettings::from_config(config)?.with_capacity(1024);
    let mut learner = Learner::new(&settings, device, group)?;
    let batch = random_batch(agent, config.batch_size as i64, device);
    let update = |learner: &mut Learner| {
        learner
            .update_on(std::slice::from_ref(&batch))
            .map(|_| ())
            .map_err(|e| crate::agent::Error::Config(e.to_string()))
    };
    let eager = measure(device, options, || update(&mut learner))?;
    learner.capture_updates().map_err(Error::Config)?;
    let graph = measure(device, options, || update(&mut learner))?;
    Ok((learner, EagerAndGraph { eager, graph }))
}

/// A plan for `num_envs` environments with the learner's model, eager and then captured.
fn measure_plan(
    agent: &AgentConfig,
    learner: &Learner,
    device: Device,
    num_envs: usize,
    options: &GraphOptions,
) -> Result<EagerAndGraph> {
    let mut policy = Policy::new(agent, device, num_envs, Box::new(TorchNoise::global()))?;
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
    let eager = measure(device, options, || plan(&mut policy))?;
    policy.capture_plans().map_err(Error::Config)?;
    let graph = measure(device, options, || plan(&mut policy))?;
    Ok(EagerAndGraph { eager, graph })
}

/// The device's peak memory (the model size's update and plans, after a reset).
fn peak(device: Device, reset: bool) -> Result<crate::cuda::MemoryPeak> {
    crate::cuda::memory_peak(device, reset).map_err(|e| Error::Other(e.to_string()))
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
    fn the_bench_models_have_the_tasks_sizes() {
        let agent = AgentConfig::from_config(&config(5, "walker-run").unwrap()).unwrap();
        assert_eq!((agent.obs_dim, agent.action_dim), (24, 6));
        assert_eq!((agent.mlp_dim, agent.latent_dim), (512, 512));
        assert_eq!(agent.iterations, 6);
        let small = AgentConfig::from_config(&config(1, "walker-run").unwrap()).unwrap();
        assert_eq!((small.mlp_dim, small.latent_dim), (384, 128));
        // dog-run's 38 actions plan with two more MPPI iterations, as the official code does.
        let dog = AgentConfig::from_config(&config(5, "dog-run").unwrap()).unwrap();
        assert_eq!((dog.obs_dim, dog.action_dim, dog.iterations), (223, 38, 8));
    }

    /// A task the bench has no dimensions for is refused by name before anything runs.
    #[test]
    fn an_unknown_task_is_refused_by_name() {
        let options = GraphOptions {
            model_sizes: vec![5],
            tasks: vec!["walker-run".into(), "humanoid-run".into()],
            repeats: 1,
            device: "cuda".into(),
            kernels: false,
            fused_kernels: vec![false],
        };
        let err = run(&options, &mut |_| {}).unwrap_err().to_string();
        assert!(
            err.contains("`humanoid-run` in --tasks") && err.contains("walker-run, dog-run"),
            "{err}"
        );
    }
}
