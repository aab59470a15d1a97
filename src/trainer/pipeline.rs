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
//! its own. On CUDA the acting thread queues its work on a stream of its own, so that its plans
//! do not wait behind the learner's updates on the default stream: each step the acting
//! stream first waits for what the default stream holds so far (the weights the policy just
//! took), and the acting thread ends with its stream idle.
use tch::Device;

use crate::config::Config;
use crate::cuda::Stream;
use crate::ddp::RankInfo;
use crate::error::{Error, Result};

#[derive(Debug)]
pub struct Pipeline {
    actor_threads: usize,
    /// The acting thread's stream, on CUDA where the build has the shim.
    stream: Option<Stream>,
}

impl Pipeline {
    /// `None` with pipeline=false. Sets the calling (learner) thread's share of the threads.
    pub fn new(config: &Config, rank: &RankInfo, device: Device) -> Result<Option<Self>> {
        if !config.pipeline {
            return Ok(None);
        }
        let (actor_threads, learner_threads) = split_threads(
            crate::device::threads(config.num_threads, rank.local_world_size),
            config.actor_threads,
        )?;
        tch::set_num_threads(learner_threads as i32);
        // The stream comes from the shim that graphs need too.
        let stream = match crate::cuda::why_no_graphs(device) {
            None => Some(Stream::new(device)?),
            Some(_) => None,
        };
        Ok(Some(Self {
            actor_threads,
            stream,
        }))
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
        let stream = self.stream.as_ref();
        if let Some(stream) = stream {
            // Before the learner queues this step's updates: only what came before is waited for.
            stream.wait_for_default()?;
        }
        std::thread::scope(|scope| {
            let acting = std::thread::Builder::new()
                .name("actor".into())
                .spawn_scoped(scope, move || {
                    tch::set_num_threads(threads);
                    let Some(stream) = stream else {
                        return act();
                    };
                    stream.make_current()?;
                    let acted = act();
                    stream.synchronize()?;
                    acted
                })
                .map_err(|e| Error::io("start the acting thread", e))?;
            let learned = learn();
            let acted = acting
                .join()
                .map_err(|_| Error::Other("the acting thread panicked".into()))?;
            Ok((acted?, learned?))
        })
    }
}

/// (acting, learning) threads out of `total`: `actor` when set (it must leave the learner at
/// least one), else half, each at least one.
fn split_threads(total: usize, actor: Option<usize>) -> Result<(usize, usize)> {
    match actor {
        Some(a) if a >= total && total > 1 => Err(Error::Config(format!(
            "actor_threads={a} leaves no thread to the learner: the rank has {total} \
             (num_threads, or cores / local ranks); use actor_threads <= {}",
            total - 1
        ))),
        Some(a) => Ok((a.max(1), total.saturating_sub(a).max(1))),
        None => {
            let actor = (total / 2).max(1);
            Ok((actor, total.saturating_sub(actor).max(1)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_split_between_acting_and_learning() {
        assert_eq!(split_threads(2, None).unwrap(), (1, 1));
        assert_eq!(split_threads(1, None).unwrap(), (1, 1));
        assert_eq!(split_threads(16, None).unwrap(), (8, 8));
        assert_eq!(split_threads(16, Some(4)).unwrap(), (4, 12));
        let err = split_threads(4, Some(4)).unwrap_err().to_string();
        assert!(
            err.contains("actor_threads=4") && err.contains("<= 3"),
            "{err}"
        );
    }

    #[test]
    fn both_sides_run_and_their_errors_come_back() {
        let pipeline = Pipeline {
            actor_threads: 1,
            stream: None,
        };
        let (a, l) = pipeline.overlap(|| Ok(2), || Ok("x")).unwrap();
        assert_eq!((a, l), (2, "x"));
        let err = pipeline
            .overlap(|| Err::<(), _>(Error::Other("env".into())), || Ok(()))
            .unwrap_err();
        assert!(err.to_string().contains("env"));
    }
}
