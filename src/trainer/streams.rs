//! The run's random streams, re-derived from (seed, rank, step) at every checkpoint point, so
//! that a run resumed from that checkpoint draws exactly what the uninterrupted run draws. An
//! offline run derives them at every update (and each batch's from its index), so that any
//! update, a stop's included, is such a point.
use rand::SeedableRng;
use rand_pcg::Pcg64;

use crate::actor::Actor;
use crate::agent::{HostNoise, TorchNoise};
use crate::learner::Learner;

/// What each derived seed is for (part of its derivation).
#[derive(Clone, Copy)]
enum Purpose {
    Episode = 0,
    Evaluation = 1,
    LearnerSamples = 2,
    SharedBatch = 3,
    Learner = 4,
    ActingNoise = 5,
    RandomActions = 6,
    Batch = 7,
    EvaluationNoise = 8,
    CollectedEpisode = 9,
    EvaluationEpisode = 10,
}

pub(super) struct Streams {
    seed: u64,
    rank: usize,
    pipelined: bool,
    /// Batch sampling and, in the strict loop, the seeding phase's random actions.
    pub(super) learner: Pcg64,
    /// Pipelined: the seeding phase's random actions, drawn on the acting thread.
    pub(super) actor: Pcg64,
}

impl Streams {
    /// Placeholders until the first `reseed`.
    pub(super) fn new(seed: u64, rank: usize, pipelined: bool) -> Self {
        Self {
            seed,
            rank,
            pipelined,
            learner: Pcg64::seed_from_u64(0),
            actor: Pcg64::seed_from_u64(0),
        }
    }

    /// The seed of the `episode`-th episode this rank starts.
    pub(super) fn episode_seed(&self, episode: u64) -> u64 {
        environment_seed(derive_seed(self.seed, self.rank, episode, Purpose::Episode))
    }

    /// The seed of the evaluation at `global_step`, from which its episodes' are derived.
    pub(super) fn evaluation_seed(&self, global_step: u64) -> u64 {
        derive_seed(self.seed, self.rank, global_step, Purpose::Evaluation)
    }

    /// Re-derives every stream at `global_step`: the learner's, the policy's and the loop's own.
    pub(super) fn reseed(
        &mut self,
        global_step: u64,
        learner: &mut Learner,
        actor: &mut Actor,
    ) -> crate::error::Result<()> {
        let seed = |rank, purpose| derive_seed(self.seed, rank, global_step, purpose);
        self.reseed_learner(global_step, learner);
        self.learner = Pcg64::seed_from_u64(seed(self.rank, Purpose::Learner));
        // In the strict loop acting shares torch's generator and the random actions share the
        // learner's stream, as they always did. Pipelined, the two threads draw concurrently:
        // each needs streams of its own for a run to be reproducible (the acting thread's is a
        // torch generator of its own, reseeded in place).
        if self.pipelined {
            actor
                .policy_mut()
                .draw_on_its_own(seed(self.rank, Purpose::ActingNoise))?;
            self.actor = Pcg64::seed_from_u64(seed(self.rank, Purpose::RandomActions));
        } else {
            actor.policy_mut().draw_from_torch();
        }
        Ok(())
    }
}

impl Streams {
    /// Re-derives the learner's noise at `counter`: torch's generator with the learner's own
    /// CPU dropout-mask stream, and the per-batch stream (Q heads), shared by all ranks (no rank
    /// in its seed).
    pub(super) fn reseed_learner(&self, counter: u64, learner: &mut Learner) {
        let seed = |rank, purpose| derive_seed(self.seed, rank, counter, purpose);
        learner.set_noise(
            Box::new(TorchNoise::seeded(seed(self.rank, Purpose::LearnerSamples))),
            Box::new(HostNoise::seeded(seed(0, Purpose::SharedBatch))),
        );
    }

    /// Seeds torch's generators, which the playing policy draws from, for an offline run's
    /// evaluation at update `counter`: redone after a stop during it, it draws the same.
    pub(super) fn reseed_evaluation_noise(&self, counter: u64) {
        let seed = derive_seed(self.seed, self.rank, counter, Purpose::EvaluationNoise);
        tch::manual_seed(seed as i64);
    }

    /// The stream that samples this rank's `batch`-th batch of an offline run.
    pub(super) fn batches(&self) -> impl Fn(u64) -> Pcg64 + Send + 'static {
        let (seed, rank) = (self.seed, self.rank);
        move |batch| Pcg64::seed_from_u64(derive_seed(seed, rank, batch, Purpose::Batch))
    }
}

/// The seed of the `episode`-th episode `collect` starts with `seed`.
pub fn collected_episode_seed(seed: u64, episode: u64) -> u64 {
    environment_seed(derive_seed(seed, 0, episode, Purpose::CollectedEpisode))
}

/// The seed of episode `j` of the evaluation seeded `evaluation`.
pub(super) fn evaluation_episode_seed(evaluation: u64, j: u64) -> u64 {
    environment_seed(derive_seed(evaluation, 0, j, Purpose::EvaluationEpisode))
}

/// Environments take 32-bit seeds (dm_control); the generators of our own take all 64 bits, so
/// that a long offline run's many derived seeds do not repeat.
fn environment_seed(derived: u64) -> u64 {
    derived & 0xffff_ffff
}

/// A seed for stream `purpose` of `rank` at `counter`: each part absorbed in turn by
/// SplitMix64's mixing, so that no two of them share a stream by their bits lining up (as an XOR
/// of the parts did: seed 256's first episode was seed 0's second).
fn derive_seed(seed: u64, rank: usize, counter: u64, purpose: Purpose) -> u64 {
    let mix = |x: u64| {
        let x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    };
    let parts = [rank as u64, counter, purpose as u64];
    parts.into_iter().fold(mix(seed), |x, part| mix(x ^ part))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_differ_by_rank_counter_and_purpose_and_environments_get_32_bits() {
        let base = derive_seed(1, 0, 0, Purpose::Episode);
        for other in [
            derive_seed(2, 0, 0, Purpose::Episode),
            derive_seed(1, 1, 0, Purpose::Episode),
            derive_seed(1, 0, 1, Purpose::Episode),
            derive_seed(1, 0, 0, Purpose::Evaluation),
        ] {
            assert_ne!(base, other);
        }
        assert!(derive_seed(1, 0, 0, Purpose::Learner) > u64::from(u32::MAX));
        // Parts whose bits would cancel under an XOR of them.
        let pairs = [
            ((256, 0, 0, Purpose::Episode), (0, 0, 1, Purpose::Episode)),
            (
                (1, 0, 7, Purpose::LearnerSamples),
                (3, 0, 7, Purpose::Episode),
            ),
            (
                (1 << 40, 0, 0, Purpose::Episode),
                (0, 1, 0, Purpose::Episode),
            ),
        ];
        for ((s, r, c, p), (s2, r2, c2, p2)) in pairs {
            assert_ne!(derive_seed(s, r, c, p), derive_seed(s2, r2, c2, p2));
        }
        let streams = Streams::new(1, 0, false);
        assert_eq!(streams.episode_seed(0), environment_seed(base));
        assert!(streams.episode_seed(0) <= u64::from(u32::MAX));
    }

    #[test]
    fn neighbouring_seeds_play_no_episode_alike() {
        type Episodes = fn(u64, u64) -> u64;
        for seed_of in [collected_episode_seed as Episodes, evaluation_episode_seed] {
            let episodes = |seed| (0..1000).map(move |n| seed_of(seed, n));
            let first: std::collections::HashSet<u64> = episodes(0).collect();
            assert_eq!(first.len(), 1000);
            assert!(episodes(1).all(|s| !first.contains(&s) && s <= u64::from(u32::MAX)));
        }
    }
}
