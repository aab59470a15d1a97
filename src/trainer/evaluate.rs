//! Evaluation: each rank plays its share of `eval_episodes` (of each task, in a multitask run)
//! in eval mode; the returns are gathered so that rank 0 reports over all episodes and by task. A stop request is checked before each
//! round-robin slot, on every rank (also one with no episode left in that slot), so the
//! collective check lines up across ranks.
use std::cell::{Cell, RefCell};
use std::time::Instant;

use envs::{Family, Frame};
use tch::{Kind, Tensor};

use super::countdown::Countdown;
use super::stop::StopRequest;
use crate::actor::{Actor, EvalStart, TaskAssignment};
use crate::ddp::ProcessGroup;
use crate::error::Result;

/// Summary over every rank's evaluation episodes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalSummary {
    pub episodes: usize,
    pub mean: f64,
    pub std: f64,
    pub min: f64,
    pub max: f64,
    pub mean_length: f64,
    pub success: Option<f64>,
}

/// An evaluation's summary over all episodes and, in a multitask run, task by task.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub overall: EvalSummary,
    /// By task id; empty in a single-task run.
    pub by_task: Vec<EvalSummary>,
}

impl Evaluation {
    /// A multitask evaluation's values by task, under the official keys: each task's return
    /// (`episode_reward+<task>`) and success, the DMControl and Meta-World averages
    /// (`episode_reward+avg_dmcontrol`, `episode_reward+avg_metaworld`,
    /// `episode_success+avg_metaworld`), and the normalised score of the TD-MPC2 paper
    /// (`episode_score+normalized`: DMControl return / 10 and Meta-World success × 100, averaged
    /// over the tasks of those two families).
    pub fn values_by_task(&self, tasks: &[String]) -> Vec<(String, f64)> {
        let mut values = Vec::new();
        let (mut dmc, mut mw_reward, mut mw_success, mut scores) = (vec![], vec![], vec![], vec![]);
        for (task, s) in tasks.iter().zip(&self.by_task) {
            values.push((format!("episode_reward+{task}"), s.mean));
            if let Some(success) = s.success {
                values.push((format!("episode_success+{task}"), success));
            }
            match Family::of(task) {
                Some(Family::DmControl) => {
                    dmc.push(s.mean);
                    scores.push(s.mean / 10.0);
                }
                Some(Family::MetaWorld) => {
                    mw_reward.push(s.mean);
                    let success = s.success.unwrap_or(0.0);
                    mw_success.push(success);
                    scores.push(success * 100.0);
                }
                _ => {}
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        for (key, group) in [
            ("episode_reward+avg_dmcontrol", &dmc),
            ("episode_reward+avg_metaworld", &mw_reward),
            ("episode_success+avg_metaworld", &mw_success),
            ("episode_score+normalized", &scores),
        ] {
            if !group.is_empty() {
                values.push((key.to_string(), mean(group)));
            }
        }
        values
    }
}

/// How many of `total` episodes rank `rank` of `world_size` plays (round robin).
pub fn share(total: usize, rank: usize, world_size: usize) -> usize {
    (total + world_size - 1 - rank) / world_size
}

/// What an evaluation ended with.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Done(Evaluation),
    /// A stop was requested between episodes (agreed by every rank at the same slot).
    Stopped(StopRequest),
}

/// Which episodes each rank plays and in which of its environments.
struct Plan {
    /// This rank's episodes: their tasks (None in a single-task run), in seed order.
    jobs: Vec<Option<u32>>,
    /// Rounds of episodes played at once: per environment, the index of its job.
    rounds: Vec<Vec<Option<usize>>>,
    /// The most rounds and the most episodes of any rank (equal on every rank).
    most_rounds: usize,
    most_jobs: usize,
}

impl Plan {
    /// `episodes` in all (of each task when `tasks` is the number of a multitask run's
    /// tasks). A single task's are dealt round robin; a task's go round robin to the ranks
    /// whose environments play it ([`TaskAssignment`]), and each plays them in environments
    /// that hold the task.
    fn new(episodes: usize, tasks: Option<usize>, rank: usize, world: usize, envs: usize) -> Self {
        let assignments: Vec<Option<TaskAssignment>> = (0..world)
            .map(|r| tasks.map(|t| TaskAssignment::new(t, world, r, envs)))
            .collect();
        let plays = |r: usize, env: usize, task: Option<u32>| match (&assignments[r], task) {
            (Some(a), Some(task)) => a.holds(env, task),
            _ => true,
        };
        let jobs_of = |r: usize| -> Vec<Option<u32>> {
            let Some(tasks) = tasks else {
                return vec![None; share(episodes, r, world)];
            };
            let mut jobs = Vec::new();
            for task in 0..tasks as u32 {
                let holders: Vec<usize> = (0..world)
                    .filter(|&h| (0..envs).any(|env| plays(h, env, Some(task))))
                    .collect();
                // Each task's first episode goes to the next holder, so that the ranks share
                // the extra episodes of all tasks, not the lowest ranks all of them.
                let mine = (0..episodes)
                    .filter(|e| holders[(e + task as usize) % holders.len()] == r)
                    .count();
                jobs.extend(std::iter::repeat_n(Some(task), mine));
            }
            jobs
        };
        let rounds_of = |r: usize, jobs: &[Option<u32>]| {
            let mut pending: Vec<usize> = (0..jobs.len()).collect();
            let mut rounds = Vec::new();
            while !pending.is_empty() {
                let round: Vec<Option<usize>> = (0..envs)
                    .map(|env| {
                        let at = pending.iter().position(|&j| plays(r, env, jobs[j]))?;
                        Some(pending.remove(at))
                    })
                    .collect();
                rounds.push(round);
            }
            rounds
        };
        let (mut most_rounds, mut most_jobs) = (0, 0);
        let mut mine = None;
        for r in 0..world {
            let jobs = jobs_of(r);
            let rounds = rounds_of(r, &jobs);
            most_rounds = most_rounds.max(rounds.len());
            most_jobs = most_jobs.max(jobs.len());
            if r == rank {
                mine = Some((jobs, rounds));
            }
        }
        let (jobs, rounds) = mine.unwrap_or_default();
        Self {
            jobs,
            rounds,
            most_rounds,
            most_jobs,
        }
    }
}

/// Plays this rank's share, as many episodes at once as the actor has environments, and
/// gathers every rank's results, unless a stop is requested (agreed before each round of
/// episodes and after the last, the same number of times on every rank; a rank asked to stop
/// leaves its round between two steps). `episodes` is the number of
/// episodes, of each task in a multitask run of `tasks` tasks. With `video`, this rank's
/// first episode is filmed into it; with `say`, how far a long evaluation is goes to it,
/// counted in steps of its rounds (one long episode would otherwise say nothing until done).
pub fn evaluate(
    actor: &mut Actor,
    episodes: usize,
    tasks: Option<usize>,
    seed: u64,
    group: &ProcessGroup,
    mut video: Option<&mut Vec<Frame>>,
    say: Option<&dyn Fn(&str)>,
) -> Result<Outcome> {
    let (rank, world) = (group.rank(), group.world_size());
    let plan = Plan::new(episodes, tasks, rank, world, actor.num_envs());
    let mine = plan.jobs.len();
    let what = match world {
        1 => format!("Evaluation of {mine} episode(s)"),
        _ => format!("Evaluation of rank {rank}'s {mine} episode(s)"),
    };
    let round_steps = actor.longest_episode() as u64;
    let total = plan.rounds.len() as u64 * round_steps;
    let countdown = say.map(|say| {
        let countdown = Countdown::start(what, "steps", total, Instant::now());
        (say, RefCell::new(countdown))
    });
    // One row per episode: return, length, success (NaN when the task has none), played
    // (0/1), task (-1 for none).
    let mut rows = vec![f64::NAN; plan.most_jobs.max(1) * COLUMNS];
    for round in 0..plan.most_rounds {
        if let Some(request) = super::stop::requested(group)? {
            return Ok(Outcome::Stopped(request));
        }
        let Some(jobs) = plan.rounds.get(round) else {
            continue;
        };
        let starts: Vec<Option<EvalStart>> = jobs
            .iter()
            .map(|job| {
                job.map(|j| EvalStart {
                    seed: super::streams::evaluation_episode_seed(seed, j as u64),
                    task: plan.jobs[j],
                })
            })
            .collect();
        // A stop asked on this rank ends its round at once; every rank then meets at the next
        // check, which agrees on the stop. The actor asks before each step.
        let step = Cell::new(round as u64 * round_steps);
        let before_each_step = || {
            if let Some((say, countdown)) = &countdown {
                if let Some(line) = countdown.borrow_mut().line(step.get(), Instant::now()) {
                    say(&line);
                }
            }
            step.set(step.get() + 1);
            super::stop::requested_here()
        };
        let Some(episodes) = actor.evaluate(&starts, video.take(), &before_each_step)? else {
            continue;
        };
        for (job, episode) in jobs.iter().zip(episodes) {
            let (Some(j), Some(episode)) = (job, episode) else {
                continue;
            };
            let task = plan.jobs[*j].map_or(-1.0, f64::from);
            rows[j * COLUMNS..(j + 1) * COLUMNS].copy_from_slice(&[
                episode.reward,
                episode.length as f64,
                episode.success,
                1.0,
                task,
            ]);
        }
    }
    // The stops asked during the last round (every rank checks once more).
    if let Some(request) = super::stop::requested(group)? {
        return Ok(Outcome::Stopped(request));
    }
    gather(&rows, tasks, group).map(Outcome::Done)
}

/// Every rank's episode rows (this rank's are `rows`), summarised overall and by task.
fn gather(rows: &[f64], tasks: Option<usize>, group: &ProcessGroup) -> Result<Evaluation> {
    let local = Tensor::from_slice(rows)
        .to_kind(Kind::Double)
        .view([-1, COLUMNS as i64]);
    let all = group.all_gather(&local)?;
    let all = Vec::<f64>::try_from(all.flatten(0, -1))?;
    let by_task = (0..tasks.unwrap_or(0))
        .map(|t| {
            let rows: Vec<f64> = all
                .chunks(COLUMNS)
                .filter(|r| r[4] == t as f64)
                .flatten()
                .copied()
                .collect();
            summarize(&rows)
        })
        .collect();
    Ok(Evaluation {
        overall: summarize(&all),
        by_task,
    })
}

const COLUMNS: usize = 5;

fn summarize(rows: &[f64]) -> EvalSummary {
    let played: Vec<&[f64]> = rows.chunks(COLUMNS).filter(|r| r[3] == 1.0).collect();
    let n = played.len().max(1) as f64;
    let returns: Vec<f64> = played.iter().map(|r| r[0]).collect();
    let mean = returns.iter().sum::<f64>() / n;
    let var = returns.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n;
    let successes: Vec<f64> = played
        .iter()
        .map(|r| r[2])
        .filter(|s| !s.is_nan())
        .collect();
    EvalSummary {
        episodes: played.len(),
        mean,
        std: var.sqrt(),
        min: returns.iter().copied().fold(f64::INFINITY, f64::min),
        max: returns.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        mean_length: played.iter().map(|r| r[1]).sum::<f64>() / n,
        success: (!successes.is_empty())
            .then(|| successes.iter().sum::<f64>() / successes.len() as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_every_episode_once() {
        for world in 1..6 {
            for total in 0..13 {
                let sum: usize = (0..world).map(|r| share(total, r, world)).sum();
                assert_eq!(sum, total, "total {total} over {world} ranks");
            }
        }
        assert_eq!((share(10, 0, 4), share(10, 3, 4)), (3, 2));
    }

    /// Every rank's jobs, as (task, environment) per round.
    fn plans(episodes: usize, tasks: Option<usize>, world: usize, envs: usize) -> Vec<Plan> {
        (0..world)
            .map(|rank| Plan::new(episodes, tasks, rank, world, envs))
            .collect()
    }

    #[test]
    fn a_single_task_is_dealt_round_robin_and_played_in_order() {
        for plan in plans(5, None, 2, 2) {
            assert_eq!((plan.most_jobs, plan.most_rounds), (3, 2));
            assert!(plan.jobs.iter().all(Option::is_none));
            assert_eq!(plan.rounds[0], [Some(0), Some(1)]);
        }
        let ranks = plans(5, None, 2, 2);
        assert_eq!(
            ranks[0].rounds[1],
            [Some(2), None],
            "rank 0 plays the fifth"
        );
        assert_eq!(ranks[1].rounds.len(), 1, "rank 1 waits a round");
    }

    #[test]
    fn each_task_is_played_by_the_ranks_and_environments_that_hold_it() {
        // Three tasks on three ranks: rank r plays task r's two episodes.
        for (rank, plan) in plans(2, Some(3), 3, 1).iter().enumerate() {
            assert_eq!(plan.jobs, vec![Some(rank as u32); 2]);
            assert_eq!(plan.most_rounds, 2);
        }
        // On two ranks every environment cycles all three: the episodes alternate ranks.
        let two = plans(2, Some(3), 2, 1);
        assert_eq!(two[0].jobs, [Some(0), Some(1), Some(2)]);
        assert_eq!(two[1].jobs, [Some(0), Some(1), Some(2)]);
        // One episode of each: the ranks take turns, two and one, not three and none.
        let one_each = plans(1, Some(3), 2, 1);
        assert_eq!(one_each[0].jobs, [Some(0), Some(2)]);
        assert_eq!(one_each[1].jobs, [Some(1)]);
        // One rank, three environments, one task each: each round plays every task.
        let one = &plans(2, Some(3), 1, 3)[0];
        assert_eq!(one.rounds.len(), 2);
        for round in &one.rounds {
            let tasks: Vec<Option<u32>> = round.iter().map(|j| one.jobs[j.unwrap()]).collect();
            assert_eq!(tasks, [Some(0), Some(1), Some(2)]);
        }
        // Four tasks on two ranks of one environment: rank 0's cycles tasks 0 and 2, rank 1's
        // tasks 1 and 3, and each plays all episodes of its two.
        for (rank, plan) in plans(3, Some(4), 2, 1).iter().enumerate() {
            let held = [[0, 2], [1, 3]][rank];
            assert!(
                plan.jobs.iter().all(|t| held.contains(&t.unwrap())),
                "{rank}"
            );
            assert_eq!(plan.jobs.len(), 6);
        }
    }

    #[test]
    fn summary_ignores_unplayed_slots() {
        let nan = f64::NAN;
        let rows = [
            1.0, 10.0, nan, 1.0, -1.0, 3.0, 10.0, nan, 1.0, -1.0, nan, nan, nan, nan, nan,
        ];
        let s = summarize(&rows);
        assert_eq!(
            (s.episodes, s.mean, s.std, s.min, s.max),
            (2, 2.0, 1.0, 1.0, 3.0)
        );
        assert_eq!(s.success, None);
    }
}
