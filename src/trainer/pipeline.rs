//! `pipeline=true`: acting and learning overlapped, in lockstep.
//!
//! Each training step runs the actor's step (plan, environment step) on an acting thread while
//! the learner, on the rank's own thread, makes the updates the previous step owed. Both finish
//! before the step ends, and the policy then takes the learner's weights: step t plans with the
//! weights after update t−2, never "whatever is ready", so a run is reproducible from its seed
//! and resumes exactly. Only the learner's thread talks to the process group, so collectives
//! keep their order on every rank.
//!
//! On the CPU the two threads split the rank's threads (`actor_threads`, by default half):
//! torch's thread count is per thread once a thread has run an operator, so each side keeps
//! its own. On CUDA both threads queue their work on the default stream, in the order they
//! issue it: torch's default CUDA generator keeps the device tensors its graph replays read in
//! one place for every graph, so a plan replayed on a stream of its own could overwrite them
//! while an update graph was reading them (a resumed run then differed on an H200), and a
//! stream of its own gained nothing measurable there (1 environment: 171 against 178 agent
//! steps/s without the pipeline).
use crate::config::Config;
use crate::ddp::RankInfo;
use crate::error::{Error, Result};

#[derive(Debug)]
pub struct Pipeline {
    actor_threads: usize,
}

impl Pipeline {
    /// `None` with pipeline=false. Sets the calling (learner) thread's share of the threads.
    pub fn new(config: &Config, rank: &RankInfo) -> Result<Option<Self>> {
        if !config.pipeline {
            return Ok(None);
        }
        let (actor_threads, learner_threads) = crate::config::split_threads(
            crate::device::rank_threads(config.num_threads, rank),
            config.actor_threads,
        )?;
        tch::set_num_threads(learner_threads as i32);
        Ok(Some(Self { actor_threads }))
    }

    /// Runs `act` on the acting thread while `learn` runs here; both results, once both end.
    pub fn overlap<A, L>(
        &self,
        act: impl FnOnce() -> Result<A> + Send,
        learn: impl FnOnce() -> Result<L>,
    ) -> Result<(A, L)>
    where
        A: Send,
    {
        let threads = self.actor_threads as i32;
        std::thread::scope(|scope| {
            let acting = std::thread::Builder::new()
                .name("actor".into())
                .spawn_scoped(scope, move || {
                    tch::set_num_threads(threads);
                    act()
                })
                .map_err(|e| Error::io("start the acting thread", e))?;
            let learned = learn();
            let acted = acting.join().map_err(|payload| {
                Error::Other(format!(
                    "the acting thread panicked: {}",
                    crate::error::panic_message(payload.as_ref())
                ))
            })?;
            Ok((acted?, learned?))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_run_and_their_errors_come_back() {
        let pipeline = Pipeline { actor_threads: 1 };
        let (a, l) = pipeline.overlap(|| Ok(2), || Ok("x")).unwrap();
        assert_eq!((a, l), (2, "x"));
        let err = pipeline
            .overlap(|| Err::<(), _>(Error::Other("env".into())), || Ok(()))
            .unwrap_err();
        assert!(err.to_string().contains("env"));
        // A panic on the acting thread (a torch error inside tch, say) is an error that says why.
        let err = pipeline
            .overlap(
                || -> Result<()> { panic!("torch: out of memory") },
                || Ok(()),
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("acting thread panicked") && err.contains("torch: out of memory"),
            "{err}"
        );
    }
}
