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
        derive_seed(self.seed, self.rank, episode, Purpose::Episode)
    }

    /// The seed of the evaluation at `global_step`.
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

/// A seed for stream `purpose` of `rank` at `counter` (SplitMix64 mixing; dm_control takes 32 bits).
fn derive_seed(seed: u64, rank: usize, counter: u64, purpose: Purpose) -> u64 {
    let mut x = seed ^ (rank as u64).rotate_left(40) ^ counter.rotate_left(8) ^ purpose as u64;
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) & 0xffff_ffff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_differ_by_rank_counter_and_purpose_and_fit_32_bits() {
        let base = derive_seed(1, 0, 0, Purpose::Episode);
        for other in [
            derive_seed(2, 0, 0, Purpose::Episode),
            derive_seed(1, 1, 0, Purpose::Episode),
            derive_seed(1, 0, 1, Purpose::Episode),
            derive_seed(1, 0, 0, Purpose::Evaluation),
        ] {
            assert_ne!(base, other);
        }
        assert!(base <= u64::from(u32::MAX));
        let streams = Streams::new(1, 0, false);
        assert_eq!(streams.episode_seed(0), base);
    }
}
