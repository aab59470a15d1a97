//! The actor of one rank: its environments, the episodes being collected in them, and the
//! [`Policy`] that chooses actions (uniform random during seeding, MPPI afterwards).
//!
//! Every environment runs its own episodes on its own schedule. An environment whose episode
//! has ended stays paused until the trainer takes the episode and resets it; the trainer
//! pauses them all before an evaluation or a checkpoint, so those always see every
//! environment at an episode boundary.
pub mod assignment;
pub mod environments;
mod own_noise;
pub mod policy;

use rand::Rng;
use rand_pcg::Pcg64;

use envs::{Frame, VIDEO_SIZE};

use crate::buffer::{Episode, ObsLayout, StoredObs};
use crate::error::{Error, Result};
pub use assignment::TaskAssignment;
pub use environments::{env_worker_command, ActorSettings, ActorTasks, ENV_WORKER};
pub use policy::Policy;

/// What one finished episode looked like.
#[derive(Debug, Clone, Copy, Default)]
pub struct EpisodeStats {
    pub reward: f64,
    pub length: usize,
    pub success: Option<f64>,
    pub terminated: bool,
    /// The task of a multitask run's episode.
    pub task: Option<u32>,
}

/// One environment's episode in progress.
#[derive(Default)]
struct Slot {
    obs: Vec<f32>,
    episode: Episode,
    stats: EpisodeStats,
    /// Before the first episode, and after each episode's last step until the next reset.
    done: bool,
    /// Episodes started (a multitask run's task cycle follows it).
    episodes: u64,
}

pub struct Actor {
    envs: envs::VectorEnv,
    policy: Policy,
    episodic: bool,
    /// How the buffer stores observations: what episodes keep of each.
    layout: ObsLayout,
    slots: Vec<Slot>,
    /// A multitask run's tasks, environment by environment.
    tasks: Option<TaskAssignment>,
    /// The task each environment plays now (multitask).
    task_of: Vec<u32>,
    /// Each task's own action size, by task id (multitask).
    action_dims: Vec<usize>,
    /// What to do about an episode that ended early with `episodic=false`, where the default
    /// advice (`episodic=true`) does not apply.
    early_end_advice: Option<&'static str>,
    /// A worker was given up at a stop: nothing more is asked of the environments.
    given_up: bool,
}

/// How a step chooses its actions.
pub enum Acting<'r> {
    /// Uniform in [−1, 1], drawn from `rng` environment by environment.
    Random(&'r mut Pcg64),
    /// The policy's plan (exploration noise included).
    Policy,
}

impl Actor {
    pub fn new(envs: envs::VectorEnv, policy: Policy, episodic: bool) -> Result<Self> {
        if envs.num_envs() != policy.num_envs() {
            return Err(Error::Config(format!(
                "{} environments but a policy for {}",
                envs.num_envs(),
                policy.num_envs()
            )));
        }
        let slots = (0..envs.num_envs())
            .map(|_| Slot {
                done: true,
                ..Slot::default()
            })
            .collect();
        let layout = ObsLayout::new(envs.obs_kind(), envs.spec().obs_dim());
        Ok(Self {
            envs,
            policy,
            episodic,
            layout,
            slots,
            tasks: None,
            task_of: Vec::new(),
            action_dims: Vec::new(),
            early_end_advice: None,
            given_up: false,
        })
    }

    /// Gives `advice` instead of `episodic=true` when an episode ends early (`collect`, whose
    /// files hold no terminations either way).
    pub fn advise_on_early_ends(mut self, advice: &'static str) -> Self {
        self.early_end_advice = Some(advice);
        self
    }

    /// A multitask run's actor: each environment plays the tasks `assignment` gives it (its
    /// environment holds exactly those, in that order); `action_dims` are the tasks' own action
    /// sizes, by task id.
    pub fn with_tasks(
        mut self,
        assignment: TaskAssignment,
        action_dims: Vec<usize>,
    ) -> Result<Self> {
        self.task_of = (0..self.slots.len())
            .map(|i| assignment.cycle(i)[0])
            .collect();
        let padded = self.envs.spec().action_dim;
        let held = (0..self.slots.len())
            .flat_map(|i| assignment.cycle(i).iter().map(|&t| t as usize))
            .max()
            .unwrap_or(0);
        if action_dims.len() <= held || action_dims.iter().any(|&own| own == 0 || own > padded) {
            return Err(Error::Config(format!(
                "task action sizes {action_dims:?}: one of 1..={padded} for each task the \
                 environments play"
            )));
        }
        self.action_dims = action_dims;
        self.policy.set_tasks(&self.task_of)?;
        self.tasks = Some(assignment);
        Ok(self)
    }

    /// The error for environment `i` ending its episode early in a run that takes no
    /// terminations (`episodic=false`).
    fn ended_early(&self, i: usize) -> Error {
        let advice = match (self.early_end_advice, &self.tasks) {
            (Some(advice), _) => advice,
            (None, Some(_)) => {
                "a task that can end early trains alone, with episodic=true (a task list trains \
                 without terminations)"
            }
            (None, None) => "set episodic=true for a task that can end early",
        };
        Error::Config(format!(
            "task={}: environment {i} ended its episode early (after {} steps: it fell, \
             crashed or reached its goal), but episodic=false; {advice}",
            self.envs.task(),
            self.slots[i].stats.length + 1
        ))
    }

    /// Zeroes the components of `actions` (one row per environment of `running`) past each
    /// environment's task's own action size: what the environment ignores is stored as zero,
    /// as the policy's masked actions have it, not as noise the model would learn from.
    fn zero_padding(&self, running: &[usize], actions: &mut [f32]) {
        if self.tasks.is_none() {
            return;
        }
        let a = self.envs.spec().action_dim;
        for (row, &env) in actions.chunks_mut(a).zip(running) {
            let own = self.action_dims[self.task_of[env] as usize];
            row[own..].fill(0.0);
        }
    }

    /// Episodes started in each environment (what a resumed run continues from).
    pub fn env_episodes(&self) -> Vec<u64> {
        self.slots.iter().map(|s| s.episodes).collect()
    }

    /// Continues from `counts` episodes started in each environment (from a checkpoint).
    pub fn set_env_episodes(&mut self, counts: &[u64]) -> Result<()> {
        if counts.len() != self.slots.len() {
            return Err(Error::Checkpoint(format!(
                "episode counts of {} environments for {}",
                counts.len(),
                self.slots.len()
            )));
        }
        for (slot, &count) in self.slots.iter_mut().zip(counts) {
            slot.episodes = count;
        }
        Ok(())
    }

    /// Makes environment `env` play `task` from its next reset, for the policy too.
    fn select_task(&mut self, env: usize, task: u32) -> Result<()> {
        let assignment = self
            .tasks
            .as_ref()
            .ok_or_else(|| Error::Other(format!("task {task} asked of a single-task actor")))?;
        let position = assignment
            .cycle(env)
            .iter()
            .position(|&t| t == task)
            .ok_or_else(|| {
                Error::Other(format!(
                    "environment {env} does not hold task {task} (it plays {:?})",
                    assignment.cycle(env)
                ))
            })?;
        self.envs.switch_task(env, position)?;
        self.task_of[env] = task;
        Ok(self.policy.set_tasks(&self.task_of)?)
    }

    pub fn num_envs(&self) -> usize {
        self.slots.len()
    }

    /// The most steps an episode of these environments takes (truncation's).
    pub fn longest_episode(&self) -> usize {
        self.envs.spec().episode_length
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn policy_mut(&mut self) -> &mut Policy {
        &mut self.policy
    }

    /// Whether every worker process still runs, asking nothing of them: one that died is named
    /// now, not at the next step. Those given up at a stop are not asked.
    pub fn check_workers(&mut self) -> Result<()> {
        match self.given_up {
            true => Ok(()),
            false => Ok(self.envs.check_workers()?),
        }
    }

    /// Whether every environment is at an episode boundary.
    pub fn all_done(&self) -> bool {
        self.slots.iter().all(|s| s.done)
    }

    /// The environments at an episode boundary, in index order.
    pub fn done(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].done)
            .collect()
    }

    /// Hands over environment `i`'s finished episode, if it made at least one step.
    pub fn take_episode(&mut self, i: usize) -> Option<(Episode, EpisodeStats)> {
        let slot = &mut self.slots[i];
        if !slot.done || slot.episode.is_empty() {
            return None;
        }
        Some((std::mem::take(&mut slot.episode), slot.stats))
    }

    /// Starts an episode in environment `i`; each episode gets its own seed so that a resumed
    /// run replays it.
    pub fn reset(&mut self, i: usize, seed: u64) -> Result<()> {
        self.reset_many(&[(i, seed)])
    }

    /// [`Self::reset`] of each (environment, seed) listed, the environments' workers at once.
    pub fn reset_many(&mut self, starts: &[(usize, u64)]) -> Result<()> {
        if self.given_up {
            return Ok(());
        }
        let started = self.start_episodes(starts);
        self.unless_given_up(started, ())
    }

    /// What `result` is, unless it gave a worker up at a stop (`envs::Error::GivenUpAtStop`,
    /// a hung worker): then nothing more is asked of the environments, and `instead` comes
    /// back. The stop ends the run at its next agreement, with its checkpoint; the episodes
    /// that ran are dropped, as a stop drops them.
    fn unless_given_up<T>(&mut self, result: Result<T>, instead: T) -> Result<T> {
        match result {
            Err(Error::Env(e)) if e.given_up_at_stop() => {
                errln!(
                    "warning: {e}; the run stops with its checkpoint (the episodes running \
                     are dropped, as at any stop)"
                );
                self.given_up = true;
                Ok(instead)
            }
            other => other,
        }
    }

    fn start_episodes(&mut self, starts: &[(usize, u64)]) -> Result<()> {
        let mut tasks = Vec::with_capacity(starts.len());
        for &(i, _) in starts {
            let task = match &self.tasks {
                Some(assignment) => Some(assignment.episode(i, self.slots[i].episodes).1),
                None => None,
            };
            if let Some(task) = task {
                self.select_task(i, task)?;
            }
            tasks.push(task);
        }
        let resets: Vec<(usize, Option<u64>)> =
            starts.iter().map(|&(i, seed)| (i, Some(seed))).collect();
        let observations = self.envs.reset_many(&resets)?;
        for ((&(i, _), obs), task) in starts.iter().zip(observations).zip(tasks) {
            self.begin_episode(i, obs, task);
        }
        Ok(())
    }

    /// Environment i's episode begins from its first observation `obs`.
    fn begin_episode(&mut self, i: usize, obs: Vec<f32>, task: Option<u32>) {
        let slot = &mut self.slots[i];
        slot.episode = Episode {
            obs: StoredObs::first(self.layout, &obs),
            task,
            ..Episode::default()
        };
        slot.obs = obs;
        slot.stats = EpisodeStats {
            task,
            ..EpisodeStats::default()
        };
        slot.done = false;
        slot.episodes += 1;
    }

    /// One step of every running environment; returns how many stepped (agent steps).
    pub fn step(&mut self, acting: Acting<'_>) -> Result<usize> {
        if self.given_up {
            return Ok(0);
        }
        let stepped = self.step_running(acting);
        self.unless_given_up(stepped, 0)
    }

    fn step_running(&mut self, acting: Acting<'_>) -> Result<usize> {
        let running: Vec<usize> = (0..self.slots.len())
            .filter(|&i| !self.slots[i].done)
            .collect();
        if running.is_empty() {
            return Ok(0);
        }
        let a = self.envs.spec().action_dim;
        let actions: Vec<f32> = match acting {
            Acting::Random(rng) => {
                let mut actions: Vec<f32> = (0..running.len() * a)
                    .map(|_| rng.random_range(-1.0f32..=1.0))
                    .collect();
                self.zero_padding(&running, &mut actions);
                actions
            }
            Acting::Policy => {
                // One batched plan for every environment; a paused one plans from its last
                // observation (fixed shapes) and its action is dropped.
                let obs: Vec<f32> = self
                    .slots
                    .iter()
                    .flat_map(|s| s.obs.iter().copied())
                    .collect();
                let t0: Vec<bool> = self.slots.iter().map(|s| s.episode.is_empty()).collect();
                let all = self.policy.act(&obs, &t0, false)?;
                running
                    .iter()
                    .flat_map(|&i| all[i * a..(i + 1) * a].to_vec())
                    .collect()
            }
        };
        let steps = self.envs.step(&running, &actions)?;
        for ((&i, step), action) in running.iter().zip(steps).zip(actions.chunks(a)) {
            if step.terminated && !self.episodic {
                return Err(self.ended_early(i));
            }
            let slot = &mut self.slots[i];
            slot.episode.obs.push(self.layout, &step.obs);
            slot.episode.action.extend_from_slice(action);
            slot.episode.reward.push(step.reward as f32);
            slot.episode
                .terminated
                .push(if step.terminated { 1.0 } else { 0.0 });
            slot.stats.reward += step.reward;
            slot.stats.length += 1;
            slot.stats.terminated = step.terminated;
            if step.success.is_some() {
                slot.stats.success = step.success;
            }
            slot.obs = step.obs;
            slot.done = step.terminated || step.truncated;
        }
        Ok(running.len())
    }
}

/// Where an evaluation episode starts: its seed, and a multitask run's task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalStart {
    pub seed: u64,
    pub task: Option<u32>,
}

/// The outcome of one evaluation episode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalEpisode {
    pub reward: f64,
    pub length: usize,
    /// NaN when the task reports none.
    pub success: f64,
}

impl Actor {
    /// Plays one evaluation episode (no exploration noise) in each environment i with a
    /// `starts[i]` (its task one that the environment holds, see [`TaskAssignment::holds`]), all
    /// at once.
    /// With `video`, environment 0's episode is filmed into it: the first frame, then one after
    /// each step. The training episodes are not touched, but their environments are reset:
    /// call it with every environment at an episode boundary (or when training is over).
    /// `interrupted` is asked before each step; once it says so the episodes
    /// are left where they are and `None` comes back (a stop must not wait for a long episode),
    /// as when a worker is given up at a stop.
    pub fn evaluate(
        &mut self,
        starts: &[Option<EvalStart>],
        video: Option<&mut Vec<Frame>>,
        interrupted: &dyn Fn() -> bool,
    ) -> Result<Option<Vec<Option<EvalEpisode>>>> {
        if self.given_up {
            return Ok(None);
        }
        let played = self.play_evaluation(starts, video, interrupted);
        self.unless_given_up(played, None)
    }

    fn play_evaluation(
        &mut self,
        starts: &[Option<EvalStart>],
        mut video: Option<&mut Vec<Frame>>,
        interrupted: &dyn Fn() -> bool,
    ) -> Result<Option<Vec<Option<EvalEpisode>>>> {
        let (n, a) = (self.slots.len(), self.envs.spec().action_dim);
        if starts.len() > n {
            return Err(Error::Other(format!(
                "{} evaluation episodes at once with {n} environments",
                starts.len()
            )));
        }
        let obs_dim = self.envs.spec().obs_dim();
        let (mut obs, mut running) = self.start_evaluation(starts)?;
        if running.first() != Some(&0) {
            video = None;
        }
        if let Some(frames) = video.as_deref_mut() {
            frames.push(self.envs.render(0, VIDEO_SIZE)?);
        }
        let mut results: Vec<Option<EvalEpisode>> = starts
            .iter()
            .map(|s| {
                s.map(|_| EvalEpisode {
                    reward: 0.0,
                    length: 0,
                    success: f64::NAN,
                })
            })
            .collect();
        while !running.is_empty() {
            if interrupted() {
                return Ok(None);
            }
            let t0: Vec<bool> = (0..n)
                .map(|i| {
                    results
                        .get(i)
                        .copied()
                        .flatten()
                        .is_some_and(|r| r.length == 0)
                })
                .collect();
            let all = self.policy.act(&obs, &t0, true)?;
            let actions: Vec<f32> = running
                .iter()
                .flat_map(|&i| all[i * a..(i + 1) * a].to_vec())
                .collect();
            let steps = self.envs.step(&running, &actions)?;
            let mut still = Vec::with_capacity(running.len());
            for (&i, step) in running.iter().zip(steps) {
                let Some(result) = results[i].as_mut() else {
                    continue;
                };
                result.reward += step.reward;
                result.length += 1;
                if let Some(s) = step.success {
                    result.success = s;
                }
                obs[i * obs_dim..(i + 1) * obs_dim].copy_from_slice(&step.obs);
                if !(step.terminated || step.truncated) {
                    still.push(i);
                }
            }
            if let (Some(frames), Some(&0)) = (video.as_deref_mut(), running.first()) {
                frames.push(self.envs.render(0, VIDEO_SIZE)?);
            }
            running = still;
        }
        Ok(Some(results))
    }

    /// Resets each environment that has a start for its evaluation episode: the first
    /// observations (zeros for the others) and the environments that run.
    fn start_evaluation(&mut self, starts: &[Option<EvalStart>]) -> Result<(Vec<f32>, Vec<usize>)> {
        let obs_dim = self.envs.spec().obs_dim();
        let mut obs = vec![0.0f32; self.slots.len() * obs_dim];
        let mut resets = Vec::new();
        for (i, start) in starts.iter().enumerate() {
            let Some(start) = start else { continue };
            if let Some(task) = start.task {
                self.select_task(i, task)?;
            }
            resets.push((i, Some(start.seed)));
        }
        let firsts = self.envs.reset_many(&resets)?;
        for (&(i, _), first) in resets.iter().zip(firsts) {
            obs[i * obs_dim..(i + 1) * obs_dim].copy_from_slice(&first);
        }
        let running = resets.iter().map(|&(i, _)| i).collect();
        Ok((obs, running))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{AgentConfig, TorchNoise};
    use envs::{Env, EnvSpec, Step};
    use rand::SeedableRng;

    fn starts(seeds: &[u64]) -> Vec<Option<EvalStart>> {
        seeds
            .iter()
            .map(|&seed| Some(EvalStart { seed, task: None }))
            .collect()
    }

    /// Counts its steps: the observation is the step index; it terminates after `ends_after`
    /// steps (truncation after 10).
    struct Countdown {
        spec: EnvSpec,
        ends_after: usize,
        t: usize,
        resets: usize,
    }

    impl Env for Countdown {
        fn spec(&self) -> &EnvSpec {
            &self.spec
        }
        fn reset(&mut self, _seed: Option<u64>) -> envs::Result<Vec<f32>> {
            self.t = 0;
            self.resets += 1;
            Ok(vec![0.0, self.resets as f32])
        }
        fn step(&mut self, action: &[f32]) -> envs::Result<Step> {
            self.spec.check_action(action)?;
            self.t += 1;
            Ok(Step {
                obs: vec![self.t as f32, self.resets as f32],
                reward: 1.0,
                terminated: self.t == self.ends_after,
                truncated: self.t == self.spec.episode_length,
                success: None,
            })
        }
        /// One pixel: the step index and the reset count.
        fn render(&mut self, _size: usize) -> envs::Result<Frame> {
            Ok(Frame {
                height: 1,
                width: 1,
                rgb: vec![self.t as u8, self.resets as u8, 0],
            })
        }
    }

    fn actor(ends_after: &[usize], episodic: bool) -> Actor {
        let spec = EnvSpec {
            obs_shape: vec![2],
            action_dim: 1,
            episode_length: 10,
        };
        let envs = ends_after
            .iter()
            .map(|&ends_after| {
                Box::new(Countdown {
                    spec: spec.clone(),
                    ends_after,
                    t: 0,
                    resets: 0,
                }) as Box<dyn Env>
            })
            .collect();
        let envs = envs::VectorEnv::from_envs("countdown", envs).unwrap();
        let config = AgentConfig {
            num_samples: 16,
            num_elites: 4,
            num_pi_trajs: 2,
            iterations: 1,
            ..AgentConfig::defaults(Some(1), 2, 1).unwrap()
        };
        let policy = Policy::new(
            &config,
            tch::Device::Cpu,
            ends_after.len(),
            Box::new(TorchNoise::seeded(0)),
        )
        .unwrap();
        Actor::new(envs, policy, episodic).unwrap()
    }

    /// An episode that ends early in a run without terminations is named, with what to do:
    /// `episodic=true`, or the advice of whoever made the actor.
    #[test]
    fn an_early_end_without_terminations_names_the_environment_and_what_to_do() {
        let mut rng = Pcg64::seed_from_u64(1);
        let mut run = |actor: &mut Actor| {
            (0..2).for_each(|i| actor.reset(i, 0).unwrap());
            let mut steps = 0;
            loop {
                steps += 1;
                if let Err(e) = actor.step(Acting::Random(&mut rng)) {
                    return (e.to_string(), steps);
                }
            }
        };
        let (e, steps) = run(&mut actor(&[20, 3], false));
        assert_eq!(steps, 3);
        assert!(
            e.contains("task=countdown: environment 1 ended its episode early (after 3 steps")
                && e.contains("set episodic=true"),
            "{e}"
        );
        let mut collecting = actor(&[20, 3], false).advise_on_early_ends("collect another");
        let (e, _) = run(&mut collecting);
        assert!(
            e.contains("but episodic=false; collect another") && !e.contains("episodic=true"),
            "{e}"
        );
    }

    #[test]
    fn environments_end_and_restart_on_their_own_schedules() {
        let mut actor = actor(&[3, 5, 20], true);
        let mut rng = Pcg64::seed_from_u64(1);
        assert_eq!(actor.done(), vec![0, 1, 2], "nothing started yet");
        for i in 0..3 {
            assert!(actor.take_episode(i).is_none(), "no step, no episode");
            actor.reset(i, i as u64).unwrap();
        }
        let mut finished = Vec::new();
        for step in 0..12 {
            let acting = if step % 2 == 0 {
                Acting::Random(&mut rng)
            } else {
                Acting::Policy
            };
            let stepped = actor.step(acting).unwrap();
            assert_eq!(stepped, 3, "every environment was restarted at once");
            for i in actor.done() {
                let (episode, stats) = actor.take_episode(i).unwrap();
                finished.push((
                    i,
                    stats.length,
                    stats.terminated,
                    episode.terminated.clone(),
                ));
                assert_eq!(episode.obs.len(), (episode.len() + 1) * 2);
                actor.reset(i, 100 + step).unwrap();
            }
        }
        // Env 0 terminates every 3 steps, env 1 every 5, env 2 is truncated at 10.
        let lengths = |env| {
            finished
                .iter()
                .filter(|f| f.0 == env)
                .map(|f| (f.1, f.2))
                .collect::<Vec<_>>()
        };
        assert_eq!(lengths(0), vec![(3, true); 4]);
        assert_eq!(lengths(1), vec![(5, true); 2]);
        assert_eq!(lengths(2), vec![(10, false)]);
        let (_, _, _, flags) = finished.iter().find(|f| f.0 == 1).unwrap();
        assert_eq!(flags, &vec![0.0, 0.0, 0.0, 0.0, 1.0]);
    }

    /// Random seeding actions keep only each task's own components; the padding is stored as
    /// zero (what a masked policy action holds there). Two environments of two tasks with one
    /// and three actions.
    #[test]
    fn random_actions_of_a_multitask_actor_are_zero_past_the_tasks_own_size() {
        let countdown = |action_dim| {
            Box::new(Countdown {
                spec: EnvSpec {
                    obs_shape: vec![2],
                    action_dim,
                    episode_length: 10,
                },
                ends_after: 100,
                t: 0,
                resets: 0,
            }) as Box<dyn Env>
        };
        let names = ["one".to_string(), "three".to_string()];
        let padding = envs::Padding {
            obs_dim: 2,
            action_dim: 3,
        };
        let env = |_| {
            let tasks = vec![countdown(1), countdown(3)];
            Box::new(
                envs::multitask::Multitask::new(&names, tasks, padding, envs::ObsKind::State)
                    .unwrap(),
            ) as Box<dyn Env>
        };
        let tasks = crate::agent::task::Tasks {
            task_dim: 4,
            action_dims: vec![1, 3],
            discounts: vec![0.9, 0.9],
        };
        let config = AgentConfig {
            num_samples: 16,
            num_elites: 4,
            num_pi_trajs: 2,
            iterations: 1,
            tasks: Some(tasks),
            ..AgentConfig::defaults(Some(1), 2, 3).unwrap()
        };
        let with_action_dims = |action_dims: Vec<usize>| {
            let envs = envs::VectorEnv::from_envs("mixed", (0..2).map(env).collect()).unwrap();
            let noise = Box::new(TorchNoise::seeded(0));
            let policy = Policy::new(&config, tch::Device::Cpu, 2, noise).unwrap();
            let assignment = TaskAssignment::new(2, 1, 0, 2);
            Actor::new(envs, policy, false)
                .unwrap()
                .with_tasks(assignment, action_dims)
        };
        let err = with_action_dims(vec![1])
            .err()
            .expect("a task without its action size is refused");
        assert!(err.to_string().contains("task action sizes [1]"), "{err}");

        let mut actor = with_action_dims(vec![1, 3]).unwrap();
        let mut rng = Pcg64::seed_from_u64(3);
        actor.reset(0, 0).unwrap();
        actor.reset(1, 1).unwrap();
        for _ in 0..4 {
            actor.step(Acting::Random(&mut rng)).unwrap();
        }
        actor.step(Acting::Policy).unwrap();
        let actions = |env: usize| actor.slots[env].episode.action.clone();
        for row in actions(0).chunks(3) {
            assert!(row[0] != 0.0 && row[1..] == [0.0, 0.0], "task one: {row:?}");
        }
        assert!(
            actions(1).iter().all(|&a| a != 0.0),
            "task three: {:?}",
            actions(1)
        );
    }

    #[test]
    fn a_paused_environment_waits_while_the_others_step() {
        let mut actor = actor(&[2, 6], true);
        let mut rng = Pcg64::seed_from_u64(2);
        actor.reset(0, 0).unwrap();
        actor.reset(1, 1).unwrap();
        assert_eq!(actor.step(Acting::Random(&mut rng)).unwrap(), 2);
        assert_eq!(actor.step(Acting::Random(&mut rng)).unwrap(), 2);
        assert_eq!(actor.done(), vec![0]);
        // Env 0 stays at its boundary (not reset): only env 1 steps, and planning for both
        // still works with env 0's last observation.
        assert_eq!(actor.step(Acting::Policy).unwrap(), 1);
        assert_eq!(actor.step(Acting::Random(&mut rng)).unwrap(), 1);
        assert!(!actor.all_done());
        for _ in 0..2 {
            actor.step(Acting::Random(&mut rng)).unwrap();
        }
        assert!(actor.all_done());
        assert_eq!(actor.step(Acting::Random(&mut rng)).unwrap(), 0);
        assert_eq!(actor.take_episode(0).unwrap().1.length, 2);
        assert_eq!(actor.take_episode(1).unwrap().1.length, 6);
    }

    #[test]
    fn a_termination_without_episodic_is_a_config_error() {
        let mut actor = actor(&[1], false);
        actor.reset(0, 0).unwrap();
        let mut rng = Pcg64::seed_from_u64(3);
        let err = actor.step(Acting::Random(&mut rng)).unwrap_err();
        assert!(matches!(err, Error::Config(_)) && err.to_string().contains("episodic=true"));
    }

    /// Evaluation episodes played to their ends.
    fn played(
        actor: &mut Actor,
        starts: &[Option<EvalStart>],
        video: Option<&mut Vec<Frame>>,
    ) -> Vec<Option<EvalEpisode>> {
        actor
            .evaluate(starts, video, &|| false)
            .unwrap()
            .expect("not interrupted")
    }

    /// An interruption ends the episodes where they are: after as many steps as it allowed.
    #[test]
    fn an_interrupted_evaluation_stops_between_steps() {
        let mut actor = actor(&[4, 7], true);
        let asked = std::cell::Cell::new(0);
        let interrupted = || {
            asked.set(asked.get() + 1);
            asked.get() > 3
        };
        let outcome = actor
            .evaluate(&starts(&[5, 6]), None, &interrupted)
            .unwrap();
        assert!(outcome.is_none());
        assert_eq!(asked.get(), 4, "asked before each step, three steps played");
        assert_eq!(
            played(&mut actor, &starts(&[5, 6]), None)[1].map(|r| r.length),
            Some(7)
        );
    }

    #[test]
    fn evaluation_plays_several_episodes_at_once_without_touching_training() {
        let mut actor = actor(&[4, 7, 20], true);
        let results: Vec<EvalEpisode> = played(&mut actor, &starts(&[5, 6]), None)
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(
            results
                .iter()
                .map(|r| (r.length, r.reward))
                .collect::<Vec<_>>(),
            vec![(4, 4.0), (7, 7.0)]
        );
        assert!(results.iter().all(|r| r.success.is_nan()));
        assert!(
            actor
                .evaluate(&starts(&[1, 2, 3, 4]), None, &|| false)
                .is_err(),
            "more than num_envs"
        );
        assert_eq!(actor.done(), vec![0, 1, 2], "training slots untouched");
        let results = played(
            &mut actor,
            &[
                None,
                Some(EvalStart {
                    seed: 1,
                    task: None,
                }),
            ],
            None,
        );
        assert_eq!(results[0], None);
        assert_eq!(results[1].map(|r| r.length), Some(7), "environment 1 alone");
    }

    #[test]
    fn the_video_films_the_first_environment_from_reset_to_its_last_step() {
        // Env 0 ends after 4 steps while env 1 plays on to 7: 5 frames, env 0's only.
        let mut actor = actor(&[4, 7], true);
        let mut frames = Vec::new();
        let results = played(&mut actor, &starts(&[5, 6]), Some(&mut frames));
        let length = |i: usize| results[i].map(|r| r.length);
        assert_eq!((length(0), length(1)), (Some(4), Some(7)));
        let steps: Vec<u8> = frames.iter().map(|f| f.rgb[0]).collect();
        assert_eq!(steps, [0, 1, 2, 3, 4]);
        assert!(frames.iter().all(|f| f.rgb[1] == 1), "env 0, first reset");
        let mut none = Vec::new();
        played(&mut actor, &starts(&[]), Some(&mut none));
        assert!(none.is_empty(), "no episode, no video");
    }
}
