//! Evaluation: each rank plays its share of `eval_episodes` in eval mode; the returns are
//! gathered so that rank 0 reports over all episodes. A stop request is checked before each
//! round-robin slot, on every rank (also one with no episode left in that slot), so the
//! collective check lines up across ranks.
use envs::Frame;
use tch::{Kind, Tensor};

use super::stop::StopRequest;
use crate::actor::Actor;
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

/// How many of `total` episodes rank `rank` of `world_size` plays (round robin).
pub fn share(total: usize, rank: usize, world_size: usize) -> usize {
    (total + world_size - 1 - rank) / world_size
}

/// What an evaluation ended with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    Done(EvalSummary),
    /// A stop was requested between episodes (agreed by every rank at the same slot).
    Stopped(StopRequest),
}

/// Plays this rank's share, as many episodes at once as the actor has environments, and
/// gathers every rank's results, unless a stop is requested (checked before each round of
/// episodes, the same number of times on every rank). With `video`, this rank's first
/// episode is filmed into it.
pub fn evaluate(
    actor: &mut Actor,
    total: usize,
    seed: u64,
    group: &ProcessGroup,
    mut video: Option<&mut Vec<Frame>>,
) -> Result<Outcome> {
    let (rank, world) = (group.rank(), group.world_size());
    let slots = total.div_ceil(world);
    // One row per slot: return, length, success (NaN when the task has none), played (0/1).
    let mut rows = vec![f64::NAN; slots * 4];
    let mine = share(total, rank, world);
    let at_once = actor.num_envs();
    for first in (0..slots).step_by(at_once) {
        if let Some(request) = super::stop::requested(group)? {
            return Ok(Outcome::Stopped(request));
        }
        let round: Vec<usize> = (first..slots.min(first + at_once))
            .filter(|&slot| slot < mine)
            .collect();
        let seeds: Vec<u64> = round
            .iter()
            .map(|&slot| (seed + slot as u64) & 0xffff_ffff)
            .collect();
        for (slot, episode) in round.iter().zip(actor.evaluate(&seeds, video.take())?) {
            rows[slot * 4..slot * 4 + 4].copy_from_slice(&[
                episode.reward,
                episode.length as f64,
                episode.success,
                1.0,
            ]);
        }
    }
    let local = Tensor::from_slice(&rows)
        .to_kind(Kind::Double)
        .view([slots as i64, 4]);
    let all = group.all_gather(&local)?;
    let all = Vec::<f64>::try_from(all.flatten(0, -1))?;
    Ok(Outcome::Done(summarize(&all)))
}

fn summarize(rows: &[f64]) -> EvalSummary {
    let played: Vec<&[f64]> = rows.chunks(4).filter(|r| r[3] == 1.0).collect();
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

    #[test]
    fn summary_ignores_unplayed_slots() {
        let nan = f64::NAN;
        let rows = [1.0, 10.0, nan, 1.0, 3.0, 10.0, nan, 1.0, nan, nan, nan, nan];
        let s = summarize(&rows);
        assert_eq!(
            (s.episodes, s.mean, s.std, s.min, s.max),
            (2, 2.0, 1.0, 1.0, 3.0)
        );
        assert_eq!(s.success, None);
    }
}
