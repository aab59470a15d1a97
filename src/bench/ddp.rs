//! `tdmpc2 bench --cases ddp`: data-parallel scaling of the training step on this machine.
//!
//! For N ranks the bench starts N worker processes of this binary (`tdmpc2 bench-worker`, one
//! gloo group on 127.0.0.1) with cores / N threads each. Every worker runs the training loop's
//! per-step work minus the environment: one planned action on a random observation and one
//! synchronised update (UTD 1) on a buffer of random episodes, with model_size=1 and walker-run
//! dimensions. Efficiency compares the per-rank throughput of N ranks with that of one rank
//! at the same threads per rank, so it measures the cost of synchronisation, not of splitting
//! the cores. It splits into what the machine loses when all its cores are busy (N independent
//! one-rank processes at once, no synchronisation) and what synchronisation costs on top. A
//! shared machine drifts in speed over minutes, so the measurements run in rounds, each one-rank
//! baseline next to its multi-rank runs (in alternating order), and the figures reported are the
//! medians of the rounds' ratios.
use std::collections::{BTreeMap, VecDeque};
use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};
use tch::Device;

use crate::actor::Policy;
use crate::agent::bench::median;
use crate::agent::{HostNoise, TorchNoise};
use crate::buffer::Episode;
use crate::config::{Config, Source};
use crate::ddp::{affinity, ProcessGroup, RankInfo};
use crate::error::{Error, Result};
use crate::learner::{Learner, LearnerSettings};

/// walker-run's dimensions (dm_control): the discount they resolve to is 0.99.
const OBS_DIM: usize = 24;
const ACTION_DIM: usize = 6;
const EPISODE_LENGTH: usize = 500;
/// Random episodes per rank's buffer: sampling cost does not depend on the fill.
const EPISODES: usize = 4;
/// Collective timeout of the workers' group; the parent stops all ranks as soon as one fails.
const GROUP_TIMEOUT: Duration = Duration::from_secs(300);
/// Error lines of a failed worker quoted in the bench's error.
const TAIL_LINES: usize = 15;

/// What the parent measures.
#[derive(Debug, Clone)]
pub struct DdpOptions {
    /// Rank counts; threads per rank are cores / ranks.
    pub ranks: Vec<usize>,
    pub sync_freq: usize,
    /// Timed agent steps per rank, after `warmup` untimed ones.
    pub steps: usize,
    pub warmup: usize,
    /// Repetitions of the whole set of measurements; the figures reported are medians.
    pub rounds: usize,
    pub seed: u64,
}

/// The hidden `bench-worker` subcommand: one rank of a measurement (rank variables from the
/// environment, as torchrun sets them).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    pub threads: usize,
    #[arg(long)]
    pub sync_freq: usize,
    #[arg(long)]
    pub steps: usize,
    #[arg(long)]
    pub warmup: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// One rank's timings, printed by the worker as its last stdout line.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct WorkerReport {
    rank: usize,
    world_size: usize,
    threads: usize,
    steps: usize,
    /// Wall time of the timed steps.
    seconds: f64,
    /// Means per timed step.
    plan_ms: f64,
    update_ms: f64,
    /// Time inside the two gradient all-reduces of an update.
    allreduce_ms: f64,
    /// Time inside the update's other collectives (Q all-gathers, logged-info all-reduce).
    other_collectives_ms: f64,
    /// The same two all-reduces with the ranks aligned by a barrier first: the transfer alone,
    /// without waiting for a slower rank (which `allreduce_ms` includes).
    allreduce_isolated_ms: f64,
}

/// The ranks' reports of one (ranks, threads per rank) measurement, summarised.
#[derive(Debug, Clone)]
struct Summary {
    ranks: usize,
    threads: usize,
    per_rank: f64,
    aggregate: f64,
    plan_ms: f64,
    update_ms: f64,
    allreduce_ms: f64,
    other_collectives_ms: f64,
    allreduce_isolated_ms: f64,
}

impl Summary {
    fn of(ranks: usize, threads: usize, reports: &[WorkerReport]) -> Self {
        let n = reports.len().max(1) as f64;
        let mean = |f: fn(&WorkerReport) -> f64| reports.iter().map(f).sum::<f64>() / n;
        let rates: Vec<f64> = reports
            .iter()
            .map(|r| r.steps as f64 / r.seconds.max(1e-12))
            .collect();
        let aggregate = rates.iter().sum::<f64>();
        Self {
            ranks,
            threads,
            per_rank: aggregate / n,
            aggregate,
            plan_ms: mean(|r| r.plan_ms),
            update_ms: mean(|r| r.update_ms),
            allreduce_ms: mean(|r| r.allreduce_ms),
            other_collectives_ms: mean(|r| r.other_collectives_ms),
            allreduce_isolated_ms: mean(|r| r.allreduce_isolated_ms),
        }
    }

    fn allreduce_fraction(&self) -> f64 {
        self.allreduce_ms / self.update_ms.max(1e-12)
    }

    fn allreduce_isolated_fraction(&self) -> f64 {
        self.allreduce_isolated_ms / self.update_ms.max(1e-12)
    }

    fn line(
        &self,
        options: &DdpOptions,
        round_index: usize,
        role: &'static str,
        load: Option<f64>,
    ) -> DdpLine {
        DdpLine {
            case: "ddp",
            round: round_index,
            role,
            ranks: self.ranks,
            threads_per_rank: self.threads,
            sync_freq: options.sync_freq,
            steps: options.steps,
            warmup: options.warmup,
            steps_per_second_per_rank: round(self.per_rank, 3),
            aggregate_steps_per_second: round(self.aggregate, 3),
            plan_ms: round(self.plan_ms, 3),
            update_ms: round(self.update_ms, 3),
            allreduce_ms: round(self.allreduce_ms, 3),
            allreduce_fraction_of_update: round(self.allreduce_fraction(), 4),
            other_collectives_ms: round(self.other_collectives_ms, 3),
            allreduce_isolated_ms: round(self.allreduce_isolated_ms, 3),
            load_average: load,
        }
    }
}

/// One measurement's JSON line (a struct, so that the keys keep this order).
#[derive(Debug, Serialize)]
struct DdpLine {
    case: &'static str,
    round: usize,
    /// "scaling" for a rank count asked for, "baseline" for the one-rank run at the same
    /// threads per rank.
    role: &'static str,
    ranks: usize,
    threads_per_rank: usize,
    sync_freq: usize,
    steps: usize,
    warmup: usize,
    steps_per_second_per_rank: f64,
    aggregate_steps_per_second: f64,
    plan_ms: f64,
    update_ms: f64,
    allreduce_ms: f64,
    allreduce_fraction_of_update: f64,
    other_collectives_ms: f64,
    allreduce_isolated_ms: f64,
    /// The 1-minute load average before the measurement: above the core count, other work
    /// shares the cores and the numbers say little.
    load_average: Option<f64>,
}

/// How the workers of one measurement run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layout {
    /// One process group of all workers: data-parallel training.
    Group,
    /// Each worker alone (world size 1), all at the same time: sharing the machine without
    /// any synchronisation.
    Independent,
}

/// One round's comparison of a rank count with its one-rank baseline.
#[derive(Debug, Clone)]
struct RoundResult {
    baseline: Summary,
    independent: Summary,
    multi: Summary,
}

impl RoundResult {
    /// Per-rank throughput at N ranks over the one-rank throughput at the same threads.
    fn efficiency(&self) -> f64 {
        self.multi.per_rank / self.baseline.per_rank.max(1e-12)
    }

    /// What the machine keeps with all N processes busy: independent over alone.
    fn machine_share(&self) -> f64 {
        self.independent.per_rank / self.baseline.per_rank.max(1e-12)
    }

    /// What synchronisation keeps: N ranks in one group over N independent processes.
    fn sync_share(&self) -> f64 {
        self.multi.per_rank / self.independent.per_rank.max(1e-12)
    }
}

/// A rank count's figures over all rounds: medians, and every round's efficiency.
#[derive(Debug, Serialize)]
struct Efficiency {
    ranks: usize,
    threads_per_rank: usize,
    baseline_steps_per_second: f64,
    steps_per_second_per_rank: f64,
    /// Median over rounds of steps_per_second_per_rank / baseline_steps_per_second.
    efficiency: f64,
    efficiency_by_round: Vec<f64>,
    /// Median over rounds of the independent processes' throughput over one alone: the part
    /// of the efficiency lost to the machine (shared caches, memory bandwidth, neighbours).
    machine_share: f64,
    /// Median over rounds of the ranks' throughput over the independent processes': the part
    /// lost to synchronisation (collectives and waiting for the slower rank).
    sync_share: f64,
    aggregate_steps_per_second: f64,
    /// Time in the gradient all-reduces over update time, waiting for the slower rank included.
    allreduce_fraction_of_update: f64,
    /// The same with the transfer alone (ranks aligned by a barrier first).
    allreduce_isolated_fraction_of_update: f64,
}

impl Efficiency {
    fn of(rounds: &[RoundResult]) -> Self {
        let median_of = |f: &dyn Fn(&RoundResult) -> f64, digits| {
            round(median(rounds.iter().map(f).collect()), digits)
        };
        let first = &rounds[0].multi;
        Self {
            ranks: first.ranks,
            threads_per_rank: first.threads,
            baseline_steps_per_second: median_of(&|r| r.baseline.per_rank, 3),
            steps_per_second_per_rank: median_of(&|r| r.multi.per_rank, 3),
            efficiency: median_of(&|r| r.efficiency(), 4),
            efficiency_by_round: rounds.iter().map(|r| round(r.efficiency(), 4)).collect(),
            machine_share: median_of(&|r| r.machine_share(), 4),
            sync_share: median_of(&|r| r.sync_share(), 4),
            aggregate_steps_per_second: median_of(&|r| r.multi.aggregate, 3),
            allreduce_fraction_of_update: median_of(&|r| r.multi.allreduce_fraction(), 4),
            allreduce_isolated_fraction_of_update: median_of(
                &|r| r.multi.allreduce_isolated_fraction(),
                4,
            ),
        }
    }
}

#[derive(Debug, Serialize)]
struct EfficiencyLine {
    case: &'static str,
    cores: usize,
    sync_freq: usize,
    steps: usize,
    rounds: usize,
    efficiency: Vec<Efficiency>,
}

fn to_line(value: &impl Serialize) -> Result<String> {
    serde_json::to_string(value).map_err(|e| Error::Other(format!("cannot write JSON: {e}")))
}

fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// Runs every measurement, handing each JSON line to `emit` as soon as it is known; the last
/// line holds the scaling efficiency of each rank count above 1.
pub fn run(options: &DdpOptions, emit: &mut dyn FnMut(&str)) -> Result<()> {
    if options.ranks.is_empty() || options.ranks.contains(&0) {
        return Err(Error::Config(format!(
            "--ranks {:?}: give rank counts >= 1, e.g. --ranks 1,2",
            options.ranks
        )));
    }
    for (name, value) in [
        ("--sync-freq", options.sync_freq),
        ("--ddp-steps", options.steps),
        ("--ddp-rounds", options.rounds),
    ] {
        if value == 0 {
            return Err(Error::Config(format!("{name}=0: must be >= 1")));
        }
    }
    let program = std::env::current_exe().map_err(|e| Error::io("locate the tdmpc2 binary", e))?;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut by_ranks: BTreeMap<usize, Vec<RoundResult>> = BTreeMap::new();
    for round_index in 0..options.rounds {
        // Within a round a configuration is measured once (the baseline of 2 ranks on 4 cores
        // is the 1-rank run of `--ranks 1,2,4` at 2 threads).
        let mut done: BTreeMap<(usize, usize, Layout), Summary> = BTreeMap::new();
        let mut measured = |ranks: usize, threads: usize, layout: Layout| -> Result<Summary> {
            if let Some(summary) = done.get(&(ranks, threads, layout)) {
                return Ok(summary.clone());
            }
            let role = match layout {
                Layout::Independent => "independent",
                Layout::Group if ranks == 1 && !options.ranks.contains(&1) => "baseline",
                Layout::Group => "scaling",
            };
            let load = load_average();
            let reports = measure(&program, ranks, threads, layout, options)?;
            let summary = Summary::of(ranks, threads, &reports);
            emit(&to_line(&summary.line(options, round_index, role, load))?);
            done.insert((ranks, threads, layout), summary.clone());
            Ok(summary)
        };
        for &ranks in &options.ranks {
            let threads = (cores / ranks).max(1);
            if ranks == 1 {
                measured(1, threads, Layout::Group)?;
                continue;
            }
            // Baseline, independent, multi-rank; reversed in odd rounds, which cancels a steady
            // drift of the machine's speed.
            let mut plan = [
                (1, Layout::Group),
                (ranks, Layout::Independent),
                (ranks, Layout::Group),
            ];
            let odd = round_index % 2 == 1;
            if odd {
                plan.reverse();
            }
            let mut summaries = plan
                .iter()
                .map(|&(n, layout)| measured(n, threads, layout))
                .collect::<Result<Vec<_>>>()?;
            if odd {
                summaries.reverse();
            }
            let [baseline, independent, multi]: [Summary; 3] = summaries
                .try_into()
                .map_err(|_| Error::Other("a bench round measured the wrong count".into()))?;
            by_ranks.entry(ranks).or_default().push(RoundResult {
                baseline,
                independent,
                multi,
            });
        }
    }
    if !by_ranks.is_empty() {
        emit(&to_line(&EfficiencyLine {
            case: "ddp_efficiency",
            cores,
            sync_freq: options.sync_freq,
            steps: options.steps,
            rounds: options.rounds,
            efficiency: by_ranks.values().map(|r| Efficiency::of(r)).collect(),
        })?);
    }
    Ok(())
}

/// The 1-minute load average (Linux), to spot a machine busy with other work.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Workers of one measurement; dropping it kills those still running.
struct Workers {
    children: Vec<Child>,
    outputs: Vec<(JoinHandle<String>, JoinHandle<String>)>,
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.children {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn read_all(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

fn measure(
    program: &Path,
    ranks: usize,
    threads: usize,
    layout: Layout,
    options: &DdpOptions,
) -> Result<Vec<WorkerReport>> {
    let group_port = free_port()?;
    // As the launcher does: each of several ranks on its own slice of the CPUs.
    let cpu_slices = match ranks {
        1 => None,
        _ => affinity::split(&affinity::allowed_cpus()?, ranks),
    };
    let mut workers = Workers {
        children: Vec::with_capacity(ranks),
        outputs: Vec::with_capacity(ranks),
    };
    for rank in 0..ranks {
        let (rank_in_group, world_size, port) = match layout {
            Layout::Group => (rank, ranks, group_port),
            Layout::Independent => (0, 1, free_port()?),
        };
        let mut child = Command::new(program)
            .arg("bench-worker")
            .envs(crate::ddp::launcher::rank_env_defaults())
            .args(["--threads", &threads.to_string()])
            .args(["--sync-freq", &options.sync_freq.to_string()])
            .args(["--steps", &options.steps.to_string()])
            .args(["--warmup", &options.warmup.to_string()])
            .args(["--seed", &options.seed.to_string()])
            .env("RANK", rank_in_group.to_string())
            .env("WORLD_SIZE", world_size.to_string())
            .env("LOCAL_RANK", rank_in_group.to_string())
            .env("LOCAL_WORLD_SIZE", world_size.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .envs(
                cpu_slices
                    .as_ref()
                    .map(|slices| (affinity::CPUS_ENV, affinity::format_list(&slices[rank]))),
            )
            .env("OMP_NUM_THREADS", threads.to_string())
            .env("MKL_NUM_THREADS", threads.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::io(format!("start bench worker {}", program.display()), e))?;
        let stdout = child.stdout.take().map(read_all);
        let stderr = child.stderr.take().map(read_all);
        workers.children.push(child);
        match (stdout, stderr) {
            (Some(out), Some(err)) => workers.outputs.push((out, err)),
            _ => return Err(Error::Other("bench worker pipes missing".into())),
        }
    }
    let mut exited = vec![false; ranks];
    while exited.contains(&false) {
        let mut failed = None;
        for (rank, child) in workers.children.iter_mut().enumerate() {
            if exited[rank] {
                continue;
            }
            let status = child
                .try_wait()
                .map_err(|e| Error::io(format!("wait for bench worker rank {rank}"), e))?;
            if let Some(status) = status {
                exited[rank] = true;
                if !status.success() {
                    failed = Some((rank, status));
                    break;
                }
            }
        }
        if let Some((rank, status)) = failed {
            return Err(worker_failed(workers, rank, ranks, threads, status));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let outputs = std::mem::take(&mut workers.outputs);
    let mut reports = Vec::with_capacity(ranks);
    for (rank, (out, err)) in outputs.into_iter().enumerate() {
        let stdout = out.join().unwrap_or_default();
        let stderr = err.join().unwrap_or_default();
        let last = stdout.lines().rev().find(|l| !l.trim().is_empty());
        let report = last
            .and_then(|l| serde_json::from_str::<WorkerReport>(l).ok())
            .ok_or_else(|| {
                Error::Other(format!(
                    "bench worker rank {rank} of {ranks} printed no report; its output:\n{}{}",
                    tail(&stdout),
                    tail(&stderr)
                ))
            })?;
        reports.push(report);
    }
    Ok(reports)
}

/// Stops the other workers and describes the failed one with the tail of its stderr.
fn worker_failed(
    mut workers: Workers,
    rank: usize,
    ranks: usize,
    threads: usize,
    status: ExitStatus,
) -> Error {
    let outputs = std::mem::take(&mut workers.outputs);
    drop(workers);
    let stderr = outputs
        .into_iter()
        .nth(rank)
        .and_then(|(_, err)| err.join().ok())
        .unwrap_or_default();
    Error::Other(format!(
        "bench worker rank {rank} of {ranks} ({threads} threads) failed ({status}); the other \
         ranks were stopped. Its last error lines:\n{}",
        tail(&stderr)
    ))
}

fn tail(text: &str) -> String {
    let lines: VecDeque<&str> = text.lines().fold(VecDeque::new(), |mut kept, line| {
        if kept.len() == TAIL_LINES {
            kept.pop_front();
        }
        kept.push_back(line);
        kept
    });
    if lines.is_empty() {
        return "  (none)\n".into();
    }
    lines.iter().map(|l| format!("  {l}\n")).collect()
}

/// A port free now on 127.0.0.1 for rank 0's rendezvous store.
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| Error::io("find a free port for the bench's process group", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::io("find a free port for the bench's process group", e))?
        .port();
    Ok(port)
}

/// The resolved config of the measurement: official settings, model_size=1, walker-run dims.
fn worker_config(args: &WorkerArgs) -> Result<Config> {
    let overrides = vec![
        "model_size=1".to_owned(),
        "device=cpu".to_owned(),
        format!("sync_freq={}", args.sync_freq),
        format!("num_threads={}", args.threads),
        format!("seed={}", args.seed),
    ];
    let mut config = Config::load(&Source {
        overrides,
        ..Source::default()
    })?;
    config.resolve(&envs::EnvSpec {
        obs_shape: vec![OBS_DIM],
        action_dim: ACTION_DIM,
        episode_length: EPISODE_LENGTH,
    })?;
    Ok(config)
}

fn random_episode(rng: &mut Pcg64) -> Episode {
    let mut uniform = |n: usize, low: f32| -> Vec<f32> {
        (0..n).map(|_| rng.random_range(low..=1.0f32)).collect()
    };
    Episode {
        obs: uniform((EPISODE_LENGTH + 1) * OBS_DIM, -1.0),
        action: uniform(EPISODE_LENGTH * ACTION_DIM, -1.0),
        reward: uniform(EPISODE_LENGTH, 0.0),
        terminated: vec![0.0; EPISODE_LENGTH],
    }
}

/// The training loop's work per agent step minus the environment: seconds planning, updating.
fn agent_step(
    policy: &mut Policy,
    learner: &mut Learner,
    rng: &mut Pcg64,
    t0: bool,
) -> Result<(f64, f64)> {
    let obs: Vec<f32> = (0..OBS_DIM)
        .map(|_| rng.random_range(-1.0f32..=1.0))
        .collect();
    let started = Instant::now();
    policy.act(&obs, &[t0], false)?;
    let planned = Instant::now();
    learner.update(rng)?;
    policy.load_weights(learner.model())?;
    Ok((
        (planned - started).as_secs_f64(),
        planned.elapsed().as_secs_f64(),
    ))
}

/// Milliseconds of the update's two gradient all-reduces, each repeat started after a barrier.
fn isolated_all_reduce_ms(group: &ProcessGroup, learner: &Learner) -> Result<f64> {
    const REPEATS: usize = 10;
    if group.world_size() == 1 {
        return Ok(0.0);
    }
    let model = learner.model();
    let mut grads = [
        model.model_params.flat.zeros_like(),
        model.policy_params.flat.zeros_like(),
    ];
    let mut seconds = 0.0;
    for _ in 0..REPEATS {
        group.barrier()?;
        let started = Instant::now();
        for grad in &mut grads {
            group.all_reduce_mean(grad)?;
        }
        seconds += started.elapsed().as_secs_f64();
    }
    Ok(seconds * 1e3 / REPEATS as f64)
}

/// One rank: warm-up, then `steps` timed (plan + update) steps; prints its report on stdout.
pub fn worker(args: &WorkerArgs) -> Result<()> {
    if args.threads == 0 || args.steps == 0 {
        return Err(Error::Config(
            "bench-worker needs --threads >= 1 and --steps >= 1".into(),
        ));
    }
    let config = worker_config(args)?;
    let (rank, _) = RankInfo::from_env(&config, &|key| std::env::var(key).ok())?;
    tch::set_num_threads(args.threads as i32);
    let group = ProcessGroup::init(
        rank.clone(),
        crate::ddp::Backend::Gloo,
        Device::Cpu,
        GROUP_TIMEOUT,
        false,
    )?;
    crate::ddp::affinity::apply_from_env()?;
    let device = Device::Cpu;
    let mut learner = Learner::new(
        &LearnerSettings::from_config(&config)?.with_capacity(EPISODES * (EPISODE_LENGTH + 1)),
        device,
        &group,
    )?;
    learner.broadcast_parameters()?;
    let mut policy = Policy::new(
        &crate::agent::AgentConfig::from_config(&config)?,
        device,
        1,
        Box::new(TorchNoise::global()),
    )?;
    policy.load_weights(learner.model())?;
    // As in training: per-sample draws differ by rank, the per-batch draws (Q heads) are shared.
    learner.set_noise(
        Box::new(TorchNoise::seeded(config.seed + 1 + rank.rank as u64)),
        Box::new(HostNoise::seeded(config.seed)),
    );
    let mut rng = Pcg64::seed_from_u64(config.seed.wrapping_mul(1000) + rank.rank as u64);
    for _ in 0..EPISODES {
        learner.add_episode(&random_episode(&mut rng))?;
    }
    if !learner.ready()? {
        return Err(Error::Other("bench buffer cannot be sampled from".into()));
    }

    for i in 0..args.warmup {
        agent_step(&mut policy, &mut learner, &mut rng, i == 0)?;
    }
    group.barrier()?;
    let comm_before = learner.comm_times();
    let (mut plan, mut update) = (0.0, 0.0);
    let started = Instant::now();
    for i in 0..args.steps {
        let t0 = args.warmup == 0 && i == 0;
        let (p, u) = agent_step(&mut policy, &mut learner, &mut rng, t0)?;
        plan += p;
        update += u;
    }
    let seconds = started.elapsed().as_secs_f64();
    let comm = learner.comm_times();
    let allreduce_isolated_ms = isolated_all_reduce_ms(&group, &learner)?;
    let per_step_ms = 1e3 / args.steps as f64;
    let report = WorkerReport {
        rank: rank.rank,
        world_size: rank.world_size,
        threads: args.threads,
        steps: args.steps,
        seconds,
        plan_ms: plan * per_step_ms,
        update_ms: update * per_step_ms,
        allreduce_ms: (comm.grad_all_reduce - comm_before.grad_all_reduce) * per_step_ms,
        other_collectives_ms: (comm.other - comm_before.other) * per_step_ms,
        allreduce_isolated_ms,
    };
    let line = serde_json::to_string(&report)
        .map_err(|e| Error::Other(format!("cannot write the bench report: {e}")))?;
    println!("{line}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_and_tail() {
        let report = |rank, seconds| WorkerReport {
            rank,
            world_size: 2,
            threads: 1,
            steps: 10,
            seconds,
            plan_ms: 10.0,
            update_ms: 40.0,
            allreduce_ms: 2.0,
            other_collectives_ms: 1.0,
            allreduce_isolated_ms: 0.5,
        };
        let s = Summary::of(2, 1, &[report(0, 1.0), report(1, 2.0)]);
        assert!((s.aggregate - 15.0).abs() < 1e-9);
        assert!((s.per_rank - 7.5).abs() < 1e-9);
        assert!((s.allreduce_fraction() - 0.05).abs() < 1e-9);
        let text: String = (0..40).map(|i| format!("line {i}\n")).collect();
        let kept = tail(&text);
        assert_eq!(kept.lines().count(), TAIL_LINES);
        assert!(kept.ends_with("line 39\n"));
        assert_eq!(tail(""), "  (none)\n");
    }

    #[test]
    fn efficiency_is_the_median_over_rounds() {
        let summary = |ranks, per_rank, allreduce_ms| Summary {
            ranks,
            threads: 1,
            per_rank,
            aggregate: per_rank * ranks as f64,
            plan_ms: 100.0,
            update_ms: 100.0,
            allreduce_ms,
            other_collectives_ms: 1.0,
            allreduce_isolated_ms: allreduce_ms / 2.0,
        };
        let round = |baseline, independent, multi, allreduce_ms| RoundResult {
            baseline: summary(1, baseline, 0.0),
            independent: summary(2, independent, 0.0),
            multi: summary(2, multi, allreduce_ms),
        };
        // A slow round (a busy neighbour) does not move the median.
        let e = Efficiency::of(&[
            round(2.0, 2.0, 1.9, 8.0),
            round(2.0, 1.5, 1.2, 30.0),
            round(1.0, 0.96, 0.92, 6.0),
        ]);
        assert_eq!(e.efficiency_by_round, vec![0.95, 0.6, 0.92]);
        assert_eq!(e.efficiency, 0.92);
        assert_eq!(e.machine_share, 0.96);
        // 1.9 / 2.0, 1.2 / 1.5, 0.92 / 0.96
        assert_eq!(e.sync_share, 0.95);
        assert_eq!(e.allreduce_fraction_of_update, 0.08);
        assert_eq!(e.allreduce_isolated_fraction_of_update, 0.04);
        assert_eq!((e.ranks, e.threads_per_rank), (2, 1));
    }

    #[test]
    fn bad_options_are_config_errors() {
        let options = DdpOptions {
            ranks: vec![0],
            sync_freq: 1,
            steps: 1,
            warmup: 0,
            rounds: 1,
            seed: 1,
        };
        let e = run(&options, &mut |_| {}).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        let zero_steps = DdpOptions {
            ranks: vec![1],
            steps: 0,
            ..options.clone()
        };
        let zero_rounds = DdpOptions {
            ranks: vec![1],
            rounds: 0,
            ..options
        };
        for (bad, name) in [(zero_steps, "--ddp-steps"), (zero_rounds, "--ddp-rounds")] {
            let e = run(&bad, &mut |_| {}).unwrap_err();
            assert!(e.to_string().contains(name), "{e}");
        }
    }

    #[test]
    fn worker_config_is_walker_run_model_size_1() {
        let config = worker_config(&WorkerArgs {
            threads: 1,
            sync_freq: 2,
            steps: 1,
            warmup: 0,
            seed: 1,
        })
        .unwrap();
        assert_eq!(config.discount, Some(0.99));
        assert_eq!((config.mlp_dim, config.latent_dim), (384, 128));
        assert_eq!(
            (
                config.batch_size,
                config.horizon,
                config.num_samples,
                config.num_elites,
                config.num_pi_trajs,
                config.iterations,
                config.sync_freq
            ),
            (256, 3, 512, 64, 24, 6, 2)
        );
    }
}
