//! The actor: an environment, the episode being collected, and the choice of each action
//! (uniform random during seeding, the agent's planner afterwards).
use rand::Rng;
use rand_pcg::Pcg64;

use crate::buffer::Episode;
use crate::error::{Error, Result};

/// What one finished episode looked like.
#[derive(Debug, Clone, Copy, Default)]
pub struct EpisodeStats {
    pub reward: f64,
    pub length: usize,
    pub success: Option<f64>,
    pub terminated: bool,
}

pub struct Actor {
    env: Box<dyn envs::Env>,
    episodic: bool,
    obs_dim: usize,
    action_dim: usize,
    obs: Vec<f32>,
    episode: Episode,
    stats: EpisodeStats,
    done: bool,
}

impl Actor {
    pub fn new(env: Box<dyn envs::Env>, episodic: bool) -> Self {
        let spec = env.spec();
        let (obs_dim, action_dim) = (spec.obs_dim(), spec.action_dim);
        Self {
            env,
            episodic,
            obs_dim,
            action_dim,
            obs: Vec::new(),
            episode: Episode::default(),
            stats: EpisodeStats::default(),
            done: true,
        }
    }

    pub fn env_mut(&mut self) -> &mut dyn envs::Env {
        self.env.as_mut()
    }

    /// True before the first episode and after each episode's last step.
    pub fn done(&self) -> bool {
        self.done
    }

    /// The current observation and whether it is the first of its episode.
    pub fn observation(&self) -> (&[f32], bool) {
        (&self.obs, self.episode.reward.is_empty())
    }

    /// Starts an episode; every episode gets its own seed so that a resumed run replays it.
    pub fn reset(&mut self, seed: u64) -> Result<()> {
        self.obs = self.env.reset(Some(seed))?;
        self.episode = Episode {
            obs: self.obs.clone(),
            ..Episode::default()
        };
        self.stats = EpisodeStats::default();
        self.done = false;
        Ok(())
    }

    pub fn random_action(&self, rng: &mut Pcg64) -> Vec<f32> {
        (0..self.action_dim)
            .map(|_| rng.random_range(-1.0f32..=1.0))
            .collect()
    }

    /// Steps the environment and records the transition.
    pub fn step(&mut self, action: &[f32]) -> Result<()> {
        let step = self.env.step(action)?;
        if step.terminated && !self.episodic {
            return Err(Error::Config(
                "the environment terminated an episode, but episodic=false; set episodic=true for \
                 tasks that can end early"
                    .into(),
            ));
        }
        debug_assert_eq!(step.obs.len(), self.obs_dim);
        self.episode.obs.extend_from_slice(&step.obs);
        self.episode.action.extend_from_slice(action);
        self.episode.reward.push(step.reward as f32);
        self.episode
            .terminated
            .push(if step.terminated { 1.0 } else { 0.0 });
        self.stats.reward += step.reward;
        self.stats.length += 1;
        self.stats.terminated = step.terminated;
        if step.success.is_some() {
            self.stats.success = step.success;
        }
        self.obs = step.obs;
        self.done = step.terminated || step.truncated;
        Ok(())
    }

    /// Whether an episode with at least one step is waiting to be handed over.
    pub fn has_episode(&self) -> bool {
        !self.episode.is_empty()
    }

    /// Hands over the finished episode and its statistics.
    pub fn take_episode(&mut self) -> (Episode, EpisodeStats) {
        (std::mem::take(&mut self.episode), self.stats)
    }
}
