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
mod summary;
mod worker;

use std::collections::{BTreeMap, VecDeque};
use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::ddp::affinity;
use crate::error::{Error, Result};

use summary::{to_line, Efficiency, EfficiencyLine, Layout, RoundResult, Summary, WorkerReport};
pub use worker::{worker, WorkerArgs};

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

impl DdpOptions {
    /// Rank counts and counts of steps and rounds of at least one.
    pub(crate) fn check(&self) -> Result<()> {
        if self.ranks.is_empty() || self.ranks.contains(&0) {
            return Err(Error::Config(format!(
                "--ranks {:?}: give rank counts >= 1, e.g. --ranks 1,2",
                self.ranks
            )));
        }
        let most = crate::config::most_local_cpu_ranks();
        if let Some(many) = self.ranks.iter().find(|&&ranks| ranks > most) {
            return Err(Error::Config(format!(
                "--ranks {many}: at most {most} on this machine's cores, as world_size allows"
            )));
        }
        for (name, value) in [
            ("--sync-freq", self.sync_freq),
            ("--ddp-steps", self.steps),
            ("--ddp-rounds", self.rounds),
        ] {
            if value == 0 {
                return Err(Error::Config(format!("{name}=0: must be >= 1")));
            }
        }
        Ok(())
    }
}

/// Runs every measurement, handing each JSON line to `emit` as soon as it is known; the last
/// line holds the scaling efficiency of each rank count above 1.
pub fn run(options: &DdpOptions, emit: &mut dyn FnMut(&str)) -> Result<()> {
    options.check()?;
    let program = crate::this_binary::path()?;
    let cores = crate::device::cores();
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

/// One measurement: `ranks` workers of `threads` threads each, in a group or independent; the
/// report of each.
fn measure(
    program: &Path,
    ranks: usize,
    threads: usize,
    layout: Layout,
    options: &DdpOptions,
) -> Result<Vec<WorkerReport>> {
    let mut workers = spawn_workers(program, ranks, threads, layout, options)?;
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
    outputs
        .into_iter()
        .enumerate()
        .map(|(rank, (out, err))| {
            let stdout = out.join().unwrap_or_default();
            let stderr = err.join().unwrap_or_default();
            let last = stdout.lines().rev().find(|l| !l.trim().is_empty());
            last.and_then(|l| serde_json::from_str::<WorkerReport>(l).ok())
                .ok_or_else(|| {
                    Error::Other(format!(
                        "bench worker rank {rank} of {ranks} printed no report; its output:\n{}{}",
                        tail(&stdout),
                        tail(&stderr)
                    ))
                })
        })
        .collect()
}

/// Starts the workers of one measurement, each of several ranks on its own slice of the CPUs
/// (as the launcher does), their output read on threads of their own.
fn spawn_workers(
    program: &Path,
    ranks: usize,
    threads: usize,
    layout: Layout,
    options: &DdpOptions,
) -> Result<Workers> {
    let group_port = free_port()?;
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
            // The bench starts its workers as our launcher does, so they pin to their slices
            // (and only to those: not to a list the bench inherited).
            .env_remove(affinity::CPUS_ENV)
            .env_remove(crate::ddp::lifeline::LAUNCHER_PID_ENV)
            .envs(
                cpu_slices
                    .as_ref()
                    .map(|slices| {
                        [
                            (affinity::CPUS_ENV, affinity::format_list(&slices[rank])),
                            (
                                crate::ddp::lifeline::LAUNCHER_PID_ENV,
                                std::process::id().to_string(),
                            ),
                        ]
                    })
                    .into_iter()
                    .flatten(),
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
    Ok(workers)
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
         ranks were stopped. Its last lines on stderr:\n{}",
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
}
