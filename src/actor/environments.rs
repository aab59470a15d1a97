//! The actor's settings and its environments: `num_envs` of the task, in this process or in
//! `tdmpc2 env-worker` processes.
use std::time::Duration;

use envs::{
    EnvOptions, Padding, Placement, ReplyLimit, StopProbe, TaskMix, VectorEnv, WorkerCommand,
};

use super::TaskAssignment;

use crate::config::Config;
use crate::ddp::RankInfo;
use crate::error::{Error, Result};

/// The hidden subcommand of this binary that serves a vector env's worker process.
pub const ENV_WORKER: &str = "env-worker";

/// How a vector env starts its worker processes: this very binary's `env-worker` subcommand,
/// each of whose answers may take up to `env_timeout` (None: as long as the worker lives).
pub fn env_worker_command(env_timeout: Option<Duration>) -> Result<WorkerCommand> {
    let program = crate::this_binary::path()?;
    let mut command = WorkerCommand::new(program, &[ENV_WORKER]);
    command.reply_limit = env_timeout.map(|after| ReplyLimit {
        after,
        setting: "env_timeout".into(),
    });
    Ok(command)
}

/// What an actor is built from, taken once from the resolved config.
#[derive(Debug, Clone, PartialEq)]
pub struct ActorSettings {
    pub task: String,
    /// What the agent observes (`obs`), and whether the environments render evaluation
    /// videos too (`save_video`, on rank 0).
    pub env: EnvOptions,
    /// One seed per environment.
    pub seeds: Vec<u64>,
    pub placement: Placement,
    /// Whether an environment's termination ends its episode (`episodic`).
    pub episodic: bool,
    /// Longest wait for a worker process's answer (`env_timeout`).
    pub env_timeout: Duration,
    /// Whose environments these are, for errors (`rank 1`).
    pub owner: String,
    /// A multitask run's tasks.
    pub tasks: Option<ActorTasks>,
    /// Asked while a worker's answer is awaited: whether the run is to stop, so that a hung
    /// worker is given up rather than waited for (the trainer's stop request).
    pub stop: Option<StopProbe>,
}

/// The tasks of a multitask run's environments on one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct ActorTasks {
    /// The run's tasks, by task id.
    pub names: Vec<String>,
    pub padding: Padding,
    pub assignment: TaskAssignment,
    /// Each task's own action size, by task id (the padding's is the largest).
    pub action_dims: Vec<usize>,
}

impl ActorTasks {
    /// Environment i's tasks, in the order it plays them.
    fn mix(&self, env: usize) -> TaskMix {
        TaskMix {
            tasks: self
                .assignment
                .cycle(env)
                .iter()
                .map(|&t| self.names[t as usize].clone())
                .collect(),
            padding: Some(self.padding),
        }
    }
}

impl ActorSettings {
    /// The environments of rank `rank_info`: environment i seeded with seed + i·world_size + rank
    /// (environment 0 as a single environment always was). Python environments step in
    /// worker processes when there are several (by default one per thread of the rank); native
    /// ones always in process.
    pub fn from_config(config: &Config, rank_info: &RankInfo) -> Result<Self> {
        let rank = rank_info.rank;
        let n = config.num_envs;
        let seeds = (0..n)
            .map(|i| config.seed + (i * config.world_size + rank) as u64)
            .collect();
        let names = config.tasks()?;
        let native = names
            .iter()
            .all(|task| envs::native::TASKS.contains(&task.as_str()));
        // Tasks whose simulator lives in a family's own venv always step in a worker.
        let away = envs::TaskMix {
            tasks: names.clone(),
            padding: None,
        }
        .groups()
        .iter()
        .any(|(family, _)| family.is_some());
        // Pipelined, a new thread steps the environments each step; a renderer's GL context is
        // bound to the thread that made it current (dm_control's EGL refuses another), so
        // pixel environments then render in a worker process of their own.
        let renders_on_many_threads = config.pipeline && config.obs == "rgb";
        let workers = match config.env_workers {
            _ if native => 0,
            _ if n == 1 && !away && !renders_on_many_threads => 0,
            Some(0) if renders_on_many_threads => 1,
            Some(0) if away => 1,
            Some(k) => k,
            None => crate::device::rank_threads(config.num_threads, rank_info).min(n),
        };
        let placement = match workers {
            0 => Placement::InProcess,
            k => Placement::Workers(k),
        };
        Ok(Self {
            task: config.task.clone(),
            env: config.env_options(rank)?,
            seeds,
            placement,
            episodic: config.episodic,
            env_timeout: Duration::from_secs(config.env_timeout),
            owner: format!("rank {rank}"),
            tasks: Self::tasks(config, names, rank)?,
            stop: None,
        })
    }

    fn tasks(config: &Config, names: Vec<String>, rank: usize) -> Result<Option<ActorTasks>> {
        if !config.multitask() {
            return Ok(None);
        }
        let unresolved = || Error::Config("the multitask config is not resolved".into());
        let obs_dim = config
            .obs_shape
            .as_ref()
            .ok_or_else(unresolved)?
            .iter()
            .product();
        let action_dim = config.action_dim.ok_or_else(unresolved)?;
        let assignment = TaskAssignment::new(names.len(), config.world_size, rank, config.num_envs);
        Ok(Some(ActorTasks {
            names,
            padding: Padding {
                obs_dim,
                action_dim,
            },
            assignment,
            action_dims: config.action_dims.clone().ok_or_else(unresolved)?,
        }))
    }

    /// The actor: its environments started, acting with `policy`.
    pub fn make_actor(&self, policy: super::Policy) -> Result<super::Actor> {
        let actor = super::Actor::new(self.make_envs()?, policy, self.episodic)?;
        match &self.tasks {
            Some(tasks) => actor.with_tasks(tasks.assignment.clone(), tasks.action_dims.clone()),
            None => Ok(actor),
        }
    }

    /// The environments, started.
    pub fn make_envs(&self) -> Result<VectorEnv> {
        let mut worker = env_worker_command(Some(self.env_timeout))?;
        worker.owner = self.owner.clone();
        let mixes: Vec<TaskMix> = (0..self.seeds.len())
            .map(|i| match &self.tasks {
                Some(tasks) => tasks.mix(i),
                None => TaskMix::single(&self.task),
            })
            .collect();
        let mut envs = VectorEnv::mixed(&mixes, self.env, &self.seeds, self.placement, &worker)?;
        if let Some(probe) = self.stop {
            envs.give_up_hung_workers_at_stop(probe);
        }
        Ok(envs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Source;

    fn settings(overrides: &[&str], rank: usize) -> ActorSettings {
        let config = Config::load(&Source {
            overrides: overrides.iter().map(|s| s.to_string()).collect(),
            ..Source::default()
        })
        .unwrap();
        let rank = RankInfo {
            rank,
            world_size: config.world_size,
            ..RankInfo::single(&config)
        };
        ActorSettings::from_config(&config, &rank).unwrap()
    }

    /// Environment workers default to the rank's threads: its share of the node's cores, not
    /// all of them, when its node's ranks share their CPUs (torchrun, or no pinning).
    #[test]
    fn workers_default_to_the_ranks_share_of_the_cores() {
        let config = Config::load(&Source {
            overrides: vec!["task=walker-run".into(), "num_envs=8".into()],
            ..Source::default()
        })
        .unwrap();
        let sharing = |local_world_size, own_cpus| RankInfo {
            local_world_size,
            own_cpus,
            ..RankInfo::single(&config)
        };
        let placement = |rank| {
            ActorSettings::from_config(&config, &rank)
                .unwrap()
                .placement
        };
        assert_eq!(placement(sharing(10_000, None)), Placement::Workers(1));
        let own = crate::device::cores().min(2);
        assert_eq!(placement(sharing(10_000, Some(2))), Placement::Workers(own));
        let alone = crate::device::cores().min(8);
        assert_eq!(placement(sharing(1, None)), Placement::Workers(alone));
    }

    #[test]
    fn environments_are_seeded_across_ranks_and_placed_by_kind() {
        let s = settings(
            &["task=walker-run", "num_envs=3", "world_size=2", "seed=10"],
            1,
        );
        assert_eq!(s.seeds, vec![11, 13, 15]);
        assert!(matches!(s.placement, Placement::Workers(_)));
        let s = settings(&["task=walker-run", "num_envs=3", "env_workers=0"], 0);
        assert_eq!(s.placement, Placement::InProcess);
        let s = settings(&["task=Pendulum-v1", "num_envs=4", "env_workers=2"], 0);
        assert_eq!(
            s.placement,
            Placement::InProcess,
            "native tasks step in process"
        );
        assert_eq!(s.env_timeout, Config::default_env_timeout().unwrap());
        for overrides in [
            &["task=mw-reach"][..],
            &["task=mw-reach", "num_envs=3", "env_workers=0"],
        ] {
            assert_eq!(
                settings(overrides, 0).placement,
                Placement::Workers(1),
                "{overrides:?}: a family with its own venv steps in a worker"
            );
        }
        assert_eq!(s.owner, "rank 0");
        assert!(!s.env.videos);
        let videos = |rank| settings(&["save_video=true"], rank).env.videos;
        assert_eq!((videos(0), videos(1)), (true, false), "rank 0 films");
        let s = settings(&["env_timeout=5"], 1);
        assert_eq!(
            (s.env_timeout, s.owner.as_str()),
            (Duration::from_secs(5), "rank 1")
        );
    }
}
