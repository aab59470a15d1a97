//! Timing of planning and updates against the machine's matrix-multiply throughput.
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::op_count::{count_ops, OpCount};
use crate::agent::noise::{HostNoise, Noise, TorchNoise};
use crate::agent::{AgentConfig, Error, Planner, Result, Updater, WorldModel};
use crate::buffer::Batch;

/// What to measure.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchOptions {
    pub device: String,
    /// Torch intra-op threads; `None` keeps the current setting.
    pub threads: Option<usize>,
    pub batch_size: usize,
    /// Timed repetitions (after one warm-up) per measurement.
    pub plan_repeats: usize,
    pub update_repeats: usize,
    /// Model sizes to run (1 and/or 5).
    pub model_sizes: Vec<u32>,
    /// Tasks to run: "walker-run" and/or "dog-run".
    pub tasks: Vec<String>,
    /// Environment counts (besides 1) of batched plans to time.
    pub plan_envs: Vec<usize>,
    pub seed: u64,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            device: "cpu".into(),
            threads: None,
            batch_size: 256,
            plan_repeats: 10,
            update_repeats: 10,
            model_sizes: vec![1, 5],
            tasks: vec!["walker-run".into(), "dog-run".into()],
            plan_envs: vec![4, 16],
            seed: 1,
        }
    }
}

/// Results of one (model size, task) pair.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchCase {
    pub model_size: u32,
    pub task: String,
    pub obs_dim: usize,
    pub action_dim: usize,
    pub iterations: usize,
    pub num_params: i64,
    /// Median milliseconds per call.
    pub plan_ms: f64,
    pub update_ms: f64,
    /// Fastest call (less sensitive to other load on the machine).
    pub plan_ms_min: f64,
    pub update_ms_min: f64,
    /// Matrix-multiply work per call (2 FLOP per multiply-add), in GFLOP.
    pub plan_gflop: f64,
    pub update_gflop: f64,
    /// Achieved matmul GFLOP/s, and as a fraction of the measured sgemm rate.
    pub plan_gflops: f64,
    pub update_gflops: f64,
    pub plan_fraction: f64,
    pub update_fraction: f64,
    /// One plan for several environments at once.
    pub batched_plans: Vec<BatchedPlanTime>,
    /// Operators one plan (warm-started) and one update dispatch, counted by the rule that
    /// scripts/compare_official.py applies to the official code; on the CPU only (the counts
    /// are the same on any machine, and on CUDA torch's profiler, started from the embedded
    /// interpreter after the first CUDA backward, hit an internal assert of torch's autograd
    /// engine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_ops: Option<OpCount>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_ops: Option<OpCount>,
}

/// Timing of one batched plan call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchedPlanTime {
    pub num_envs: usize,
    /// Median and fastest milliseconds per call.
    pub plan_ms: f64,
    pub plan_ms_min: f64,
    /// Median milliseconds per call divided by the number of environments.
    pub plan_ms_per_env: f64,
}

/// The whole benchmark.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchReport {
    pub device: String,
    pub threads: usize,
    pub batch_size: usize,
    /// GFLOP/s of a 2048³ float32 matmul timed in the same run (fastest of nine).
    pub matmul_gflops: f64,
    /// The 1-minute load average before and after (Linux), to spot a busy machine.
    pub load_average: Option<(f64, f64)>,
    pub cases: Vec<BenchCase>,
}

/// The tasks whose dimensions the agent and graph benches take.
pub const TASKS: [&str; 2] = ["walker-run", "dog-run"];

/// Dimensions of the benchmarked tasks: (obs_dim, action_dim).
pub fn task_dims(task: &str) -> Result<(usize, usize)> {
    match task {
        "walker-run" => Ok((24, 6)),
        "dog-run" => Ok((223, 38)),
        _ => Err(Error::Config(format!(
            "bench: unknown task `{task}` in --tasks (allowed: {})",
            TASKS.join(", ")
        ))),
    }
}

/// The median (the mean of the middle two for an even count); NaN for none.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        0.5 * (values[n / 2 - 1] + values[n / 2])
    }
}

fn synchronize(device: Device) {
    if let Device::Cuda(index) = device {
        tch::Cuda::synchronize(index as i64);
    }
}

/// Milliseconds of each of `repeats` calls after one warm-up call.
pub fn time_ms(
    device: Device,
    repeats: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    f()?;
    synchronize(device);
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let start = Instant::now();
        f()?;
        synchronize(device);
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(times)
}

/// Multiply-adds of one row through linear layers of the given widths.
fn mlp_macs(widths: &[usize]) -> f64 {
    widths.windows(2).map(|w| (w[0] * w[1]) as f64).sum()
}

/// Matmul FLOPs of one plan and one update (2 per multiply-add); backward counts one matmul for
/// weight gradients and one for input gradients, except where the input needs no gradient.
pub fn flop_counts(c: &AgentConfig, batch: usize) -> (f64, f64) {
    let (z, a, m, e) = (c.latent_dim, c.action_dim, c.mlp_dim, c.enc_dim);
    let mut enc_widths = vec![c.obs_dim];
    enc_widths.extend(std::iter::repeat_n(
        e,
        c.num_enc_layers.saturating_sub(1).max(1),
    ));
    enc_widths.push(z);
    let encoder = mlp_macs(&enc_widths);
    let encoder_first = (enc_widths[0] * enc_widths[1]) as f64;
    let dynamics = mlp_macs(&[z + a, m, m, z]);
    let reward = mlp_macs(&[z + a, m, m, c.num_bins]);
    let q_head = reward;
    let policy = mlp_macs(&[z, m, m, 2 * a]);
    let policy_first = (z * m) as f64;
    let (h, n, p) = (
        c.horizon as f64,
        c.num_samples as f64,
        c.num_pi_trajs as f64,
    );
    let num_q = c.num_q as f64;

    // What the planner computes: the first step's layers take the one encoded latent once
    // (its share of the first matmul) and each candidate's action; the policy trajectories are
    // rolled out in the first iteration only.
    let first_step = |mlp: f64, rows: f64| (z * m) as f64 + rows * (mlp - (z * m) as f64);
    let rollout = |rows: f64| {
        first_step(reward, rows)
            + first_step(dynamics, rows)
            + (h - 1.0) * rows * (reward + dynamics)
    };
    let policy_trajectories = policy
        + first_step(dynamics, p)
        + (h - 2.0).max(0.0) * p * dynamics
        + (h - 1.0) * p * policy;
    let iterations = c.iterations as f64;
    let plan = encoder
        + policy_trajectories
        + rollout(n)
        + (iterations - 1.0) * rollout(n - p)
        + iterations * n * (policy + 2.0 * q_head);

    let b = batch as f64;
    let rows = h * b;
    let targets = rows * (encoder + policy + 2.0 * q_head);
    let model_forward = b * encoder + rows * (dynamics + reward + num_q * q_head);
    let model_backward = 2.0 * model_forward - b * encoder_first;
    let policy_rows = (h + 1.0) * b;
    let policy_forward = policy_rows * (policy + 2.0 * q_head);
    // Q parameters are detached: only input gradients through the two heads.
    let policy_backward = policy_rows * (2.0 * policy - policy_first + 2.0 * q_head);
    let update = targets + model_forward + model_backward + policy_forward + policy_backward;
    (2.0 * plan, 2.0 * update)
}

/// GFLOP/s of a square float32 matmul of side `n` (fastest of nine runs).
pub fn matmul_gflops(device: Device, n: i64) -> f64 {
    let x = Tensor::randn([n, n], (Kind::Float, device));
    let y = Tensor::randn([n, n], (Kind::Float, device));
    let flop = 2.0 * (n as f64).powi(3);
    let times = time_ms(device, 9, || {
        let _ = x.matmul(&y);
        Ok(())
    })
    .unwrap_or_default();
    // Other load only slows a run down, so the fastest run is the machine's rate.
    let fastest = times.iter().copied().fold(f64::INFINITY, f64::min);
    flop / (fastest * 1e-3) / 1e9
}

fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

fn parse_device(name: &str) -> Result<Device> {
    // `cuda` without a GPU is refused here rather than failing in the first kernel.
    let gpus = tch::Cuda::device_count();
    match name {
        "cuda" if gpus > 0 => Ok(Device::Cuda(0)),
        "cuda" => Err(Error::Config("device cuda: torch sees no GPU".into())),
        "auto" if gpus > 0 => Ok(Device::Cuda(0)),
        _ => Ok(Device::Cpu),
    }
}

/// `bench --cases agent`: one line per case with the run's device, threads, batch size and
/// matmul rate, at the trainer's matmul precision on CUDA.
pub fn run(
    options: &BenchOptions,
    print: &mut dyn FnMut(&serde_json::Value),
) -> crate::error::Result<()> {
    if options.device != "cpu" && tch::Cuda::is_available() {
        super::trainer_precision(Device::Cuda(0))?;
    }
    let report = bench(options)?;
    for case in &report.cases {
        let mut line =
            serde_json::to_value(case).map_err(|e| crate::error::Error::Other(e.to_string()))?;
        line["case"] = "agent".into();
        line["device"] = report.device.clone().into();
        line["threads"] = report.threads.into();
        line["batch_size"] = report.batch_size.into();
        line["matmul_gflops"] = report.matmul_gflops.into();
        print(&line);
    }
    Ok(())
}

/// Runs the benchmark.
pub fn bench(options: &BenchOptions) -> Result<BenchReport> {
    if let Some(threads) = options.threads {
        tch::set_num_threads(threads as i32);
    }
    let device = parse_device(&options.device)?;
    crate::agent::kernels::retain_freed_memory();
    let load_before = load_average();
    let matmul = matmul_gflops(device, 2048);
    let mut cases = Vec::new();
    for &size in &options.model_sizes {
        for task in &options.tasks {
            let (obs_dim, action_dim) = task_dims(task)?;
            let config = AgentConfig::defaults(Some(size), obs_dim, action_dim)
                .map_err(|e| Error::Config(e.to_string()))?;
            cases.push(bench_case(&config, size, task, options, device, matmul)?);
        }
    }
    Ok(BenchReport {
        device: format!("{device:?}"),
        threads: tch::get_num_threads() as usize,
        batch_size: options.batch_size,
        matmul_gflops: matmul,
        load_average: load_before.zip(load_average()),
        cases,
    })
}

fn bench_case(
    config: &AgentConfig,
    size: u32,
    task: &str,
    options: &BenchOptions,
    device: Device,
    matmul: f64,
) -> Result<BenchCase> {
    let mut sample_noise = TorchNoise::seeded(options.seed);
    let mut batch_noise = HostNoise::seeded(options.seed);
    let mut model = WorldModel::new(config, device)?;
    let mut learner = Updater::new(config, &model)?;
    let mut planner = Planner::new(config, device, 1)?;
    let (h, b) = (config.horizon as i64, options.batch_size as i64);
    let options_f = (Kind::Float, device);
    let batch = Batch {
        obs: Tensor::randn([h + 1, b, config.obs_dim as i64], options_f),
        action: Tensor::rand([h, b, config.action_dim as i64], options_f) * 2.0 - 1.0,
        reward: Tensor::randn([h, b, 1], options_f),
        terminated: Tensor::zeros([h, b, 1], options_f),
        task: None,
    };
    let obs = Tensor::randn([1, config.obs_dim as i64], options_f);

    let update_times = time_ms(device, options.update_repeats, || {
        learner
            .update(&mut model, &batch, &mut sample_noise, &mut batch_noise)
            .map(|_| ())
    })?;
    let mut first = true;
    let plan_times = time_ms(device, options.plan_repeats, || {
        let t0 = std::mem::take(&mut first);
        planner
            .plan(&model, &obs, t0, false, &mut sample_noise)
            .map(|_| ())
    })?;
    let (mut plan_ops, mut update_ops) = (None, None);
    if device == Device::Cpu {
        let plan = || planner.plan(&model, &obs, false, false, &mut sample_noise);
        plan_ops = Some(count_ops(plan)?.1);
        let update = || learner.update(&mut model, &batch, &mut sample_noise, &mut batch_noise);
        update_ops = Some(count_ops(update)?.1);
    }
    let batched_plans = options
        .plan_envs
        .iter()
        .map(|&envs| time_batched_plan(config, &model, envs, options, &mut sample_noise))
        .collect::<Result<Vec<_>>>()?;
    let (plan_ms_min, update_ms_min) = (fastest(&plan_times), fastest(&update_times));
    let plan_ms = median(plan_times);
    let update_ms = median(update_times);
    let (plan_flop, update_flop) = flop_counts(config, options.batch_size);
    let plan_gflops = plan_flop / (plan_ms * 1e-3) / 1e9;
    let update_gflops = update_flop / (update_ms * 1e-3) / 1e9;
    Ok(BenchCase {
        model_size: size,
        task: task.to_string(),
        obs_dim: config.obs_dim,
        action_dim: config.action_dim,
        iterations: config.iterations,
        num_params: model.num_params(),
        plan_ms,
        update_ms,
        plan_ms_min,
        update_ms_min,
        plan_gflop: plan_flop / 1e9,
        update_gflop: update_flop / 1e9,
        plan_gflops,
        update_gflops,
        plan_fraction: plan_gflops / matmul,
        update_fraction: update_gflops / matmul,
        batched_plans,
        plan_ops,
        update_ops,
    })
}

fn fastest(times: &[f64]) -> f64 {
    times.iter().copied().fold(f64::INFINITY, f64::min)
}

/// One plan for `envs` environments at once.
fn time_batched_plan(
    config: &AgentConfig,
    model: &WorldModel,
    envs: usize,
    options: &BenchOptions,
    noise: &mut dyn Noise,
) -> Result<BatchedPlanTime> {
    let device = model.device();
    let mut planner = Planner::new(config, device, envs)?;
    let obs = Tensor::randn([envs as i64, config.obs_dim as i64], (Kind::Float, device));
    let mut first = true;
    let times = time_ms(device, options.plan_repeats, || {
        let t0 = vec![std::mem::take(&mut first); envs];
        planner
            .plan_batch(model, &obs, &t0, false, noise)
            .map(|_| ())
    })?;
    let plan_ms_min = fastest(&times);
    let plan_ms = median(times);
    Ok(BatchedPlanTime {
        num_envs: envs,
        plan_ms,
        plan_ms_min,
        plan_ms_per_env: plan_ms / envs as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flop_counts_scale_with_the_work() {
        let small = AgentConfig::defaults(Some(1), 24, 6).unwrap();
        let large = AgentConfig::defaults(Some(5), 24, 6).unwrap();
        let (plan_small, update_small) = flop_counts(&small, 256);
        let (plan_large, update_large) = flop_counts(&large, 256);
        assert!(plan_large > 2.0 * plan_small && update_large > 2.0 * update_small);
        // Size 5 walker-run: ~3 G multiply-adds per iteration → ~33 GFLOP per plan.
        assert!(
            (30.0..36.0).contains(&(plan_large / 1e9)),
            "{}",
            plan_large / 1e9
        );
        let (_, update_double) = flop_counts(&large, 512);
        assert!((update_double / update_large - 2.0).abs() < 1e-9);
    }

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
