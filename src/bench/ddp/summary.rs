//! What the ranks report and what the bench makes of it: per-measurement summaries, one
//! JSON line each, and the efficiency of each rank count over the rounds.
use serde::{Deserialize, Serialize};

use super::DdpOptions;
use crate::bench::agent::median;
use crate::error::{Error, Result};

/// One rank's timings, printed by the worker as its last stdout line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct WorkerReport {
    pub(super) rank: usize,
    pub(super) world_size: usize,
    pub(super) threads: usize,
    pub(super) steps: usize,
    /// Wall time of the timed steps.
    pub(super) seconds: f64,
    /// Means per timed step.
    pub(super) plan_ms: f64,
    pub(super) update_ms: f64,
    /// Time inside the two gradient all-reduces of an update.
    pub(super) allreduce_ms: f64,
    /// Time inside the update's other collectives (Q all-gathers, logged-info all-reduce).
    pub(super) other_collectives_ms: f64,
    /// The same two all-reduces with the ranks aligned by a barrier first: the transfer alone,
    /// without waiting for a slower rank (which `allreduce_ms` includes).
    pub(super) allreduce_isolated_ms: f64,
}

/// The ranks' reports of one (ranks, threads per rank) measurement, summarised.
#[derive(Debug, Clone)]
pub(super) struct Summary {
    pub(super) ranks: usize,
    pub(super) threads: usize,
    pub(super) per_rank: f64,
    pub(super) aggregate: f64,
    pub(super) plan_ms: f64,
    pub(super) update_ms: f64,
    pub(super) allreduce_ms: f64,
    pub(super) other_collectives_ms: f64,
    pub(super) allreduce_isolated_ms: f64,
}

impl Summary {
    pub(super) fn of(ranks: usize, threads: usize, reports: &[WorkerReport]) -> Self {
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

    pub(super) fn allreduce_fraction(&self) -> f64 {
        self.allreduce_ms / self.update_ms.max(1e-12)
    }

    pub(super) fn allreduce_isolated_fraction(&self) -> f64 {
        self.allreduce_isolated_ms / self.update_ms.max(1e-12)
    }

    pub(super) fn line(
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
pub(super) struct DdpLine {
    pub(super) case: &'static str,
    pub(super) round: usize,
    /// "scaling" for a rank count asked for, "baseline" for the one-rank run at the same
    /// threads per rank.
    pub(super) role: &'static str,
    pub(super) ranks: usize,
    pub(super) threads_per_rank: usize,
    pub(super) sync_freq: usize,
    pub(super) steps: usize,
    pub(super) warmup: usize,
    pub(super) steps_per_second_per_rank: f64,
    pub(super) aggregate_steps_per_second: f64,
    pub(super) plan_ms: f64,
    pub(super) update_ms: f64,
    pub(super) allreduce_ms: f64,
    pub(super) allreduce_fraction_of_update: f64,
    pub(super) other_collectives_ms: f64,
    pub(super) allreduce_isolated_ms: f64,
    /// The 1-minute load average before the measurement: above the core count, other work
    /// shares the cores and the numbers say little.
    pub(super) load_average: Option<f64>,
}

/// How the workers of one measurement run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Layout {
    /// One process group of all workers: data-parallel training.
    Group,
    /// Each worker alone (world size 1), all at the same time: sharing the machine without
    /// any synchronisation.
    Independent,
}

/// One round's comparison of a rank count with its one-rank baseline.
#[derive(Debug, Clone)]
pub(super) struct RoundResult {
    pub(super) baseline: Summary,
    pub(super) independent: Summary,
    pub(super) multi: Summary,
}

impl RoundResult {
    /// Per-rank throughput at N ranks over the one-rank throughput at the same threads.
    pub(super) fn efficiency(&self) -> f64 {
        self.multi.per_rank / self.baseline.per_rank.max(1e-12)
    }

    /// What the machine keeps with all N processes busy: independent over alone.
    pub(super) fn machine_share(&self) -> f64 {
        self.independent.per_rank / self.baseline.per_rank.max(1e-12)
    }

    /// What synchronisation keeps: N ranks in one group over N independent processes.
    pub(super) fn sync_share(&self) -> f64 {
        self.multi.per_rank / self.independent.per_rank.max(1e-12)
    }
}

/// A rank count's figures over all rounds: medians, and every round's efficiency.
#[derive(Debug, Serialize)]
pub(super) struct Efficiency {
    pub(super) ranks: usize,
    pub(super) threads_per_rank: usize,
    pub(super) baseline_steps_per_second: f64,
    pub(super) steps_per_second_per_rank: f64,
    /// Median over rounds of steps_per_second_per_rank / baseline_steps_per_second.
    pub(super) efficiency: f64,
    pub(super) efficiency_by_round: Vec<f64>,
    /// Median over rounds of the independent processes' throughput over one alone: the part
    /// of the efficiency lost to the machine (shared caches, memory bandwidth, neighbours).
    pub(super) machine_share: f64,
    /// Median over rounds of the ranks' throughput over the independent processes': the part
    /// lost to synchronisation (collectives and waiting for the slower rank).
    pub(super) sync_share: f64,
    pub(super) aggregate_steps_per_second: f64,
    /// Time in the gradient all-reduces over update time, waiting for the slower rank included.
    pub(super) allreduce_fraction_of_update: f64,
    /// The same with the transfer alone (ranks aligned by a barrier first).
    pub(super) allreduce_isolated_fraction_of_update: f64,
}

impl Efficiency {
    pub(super) fn of(rounds: &[RoundResult]) -> Self {
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
pub(super) struct EfficiencyLine {
    pub(super) case: &'static str,
    pub(super) cores: usize,
    pub(super) sync_freq: usize,
    pub(super) steps: usize,
    pub(super) rounds: usize,
    pub(super) efficiency: Vec<Efficiency>,
}

pub(super) fn to_line(value: &impl Serialize) -> Result<String> {
    serde_json::to_string(value).map_err(|e| Error::Other(format!("cannot write JSON: {e}")))
}

pub(super) fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}
