//! Many environments of one task (or of a multitask run's tasks, see [`TaskMix`]), stepped
//! together: in this process, or spread over worker processes so that Python environments
//! use several cores instead of queueing on one interpreter lock.
//!
//! A worker is a process of the program in [`WorkerCommand`] that calls [`serve_worker`]. It
//! builds its envs with [`crate::make`] (so an env behaves bit for bit as it would in-process)
//! and steps them on command; actions and observations pass through shared memory, the
//! commands through its stdin and stdout. Workers die with their parent, exit when it closes
//! their stdin, and are reaped when the [`VectorEnv`] is dropped.
mod process;
mod protocol;
mod remote;
mod startup;
mod worker;

use std::path::PathBuf;
use std::time::Duration;

use self::process::WorkerProcess;
use self::protocol::{Encoder, Layout};
use self::startup::Slot;
use crate::family::{Family, HOSTED_FAMILY_VAR};
use crate::{Env, EnvOptions, EnvSpec, Error, Frame, ObsKind, Result, Step, TaskMix};

pub use self::remote::{set_default_worker, specs_in_worker, RemoteEnv};
pub use self::worker::serve_worker;

/// Where a vector env's environments run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// All in this process, stepped in turn.
    InProcess,
    /// In `k` worker processes, the envs split evenly in contiguous blocks (more workers than
    /// envs: one worker per env).
    Workers(usize),
}

/// How to start a worker process (a program that calls [`serve_worker`], with its arguments)
/// and how long to wait for its replies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Longest wait for any one reply; a worker silent for longer is killed and named.
    /// `None`: wait as long as the worker lives.
    pub reply_limit: Option<ReplyLimit>,
    /// Who runs the workers, named first in their errors (`rank 1`); empty for no one.
    pub owner: String,
    /// Variables set for the worker (those that point it at a family's venv).
    pub env: Vec<(String, String)>,
}

/// How long a worker may still take to answer once its owner is to stop: a healthy one answers
/// in well under a second.
pub const STOP_PATIENCE: Duration = Duration::from_secs(10);

/// Whether this process was asked to stop.
#[derive(Clone, Copy)]
pub struct StopProbe(pub fn() -> bool);

impl StopProbe {
    pub fn asked(&self) -> bool {
        (self.0)()
    }
}

impl PartialEq for StopProbe {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::fn_addr_eq(self.0, other.0)
    }
}

impl Eq for StopProbe {}

impl std::fmt::Debug for StopProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StopProbe")
    }
}

/// How long a worker may take to answer, and the setting that says so (for its error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyLimit {
    pub after: Duration,
    pub setting: String,
}

impl WorkerCommand {
    /// `program args…`, waiting for replies as long as the worker lives.
    pub fn new(program: impl Into<PathBuf>, args: &[&str]) -> Self {
        Self {
            program: program.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            reply_limit: None,
            owner: String::new(),
            env: Vec::new(),
        }
    }

    /// The same worker, its embedded interpreter pointed at `family`'s venv: it makes that
    /// family's environments itself. An error names the command that installs the venv.
    pub fn for_family(&self, family: Family) -> Result<WorkerCommand> {
        let site = family.site_packages()?;
        let mut command = self.clone();
        command.env.retain(|(key, _)| {
            key != HOSTED_FAMILY_VAR && key != embedded_python::SITE_PACKAGES_VAR
        });
        command.env.push((
            embedded_python::SITE_PACKAGES_VAR.into(),
            site.display().to_string(),
        ));
        command
            .env
            .push((HOSTED_FAMILY_VAR.into(), family.name().into()));
        Ok(command)
    }
}

pub struct VectorEnv {
    task: String,
    obs: ObsKind,
    spec: EnvSpec,
    num_envs: usize,
    backend: Backend,
}

/// An environment must observe what its spec says (a gymnasium env may return other shapes
/// than its observation space): workers check it too.
fn check_obs(task: &str, index: usize, expected: usize, got: usize) -> Result<()> {
    match got == expected {
        true => Ok(()),
        false => Err(Error::ObsLength {
            task: task.to_string(),
            index,
            expected,
            got,
        }),
    }
}

/// An environment must return finite numbers: a NaN would reach the replay buffer (every later
/// update then diverges) or the planner (its actions then blamed).
fn check_finite(task: &str, index: usize, obs: &[f32], reward: Option<f64>) -> Result<()> {
    let refuse = |what: String| {
        Err(Error::NonFiniteStep {
            task: task.to_string(),
            index,
            what,
            after: match reward {
                Some(_) => "a step",
                None => "a reset",
            },
        })
    };
    if let Some(reward) = reward.filter(|r| !r.is_finite()) {
        return refuse(format!("reward ({reward})"));
    }
    match obs.iter().position(|x| !x.is_finite()) {
        Some(at) => refuse(format!("observation component {at} ({})", obs[at])),
        None => Ok(()),
    }
}

/// What an env returned after a reset, checked.
fn checked_obs(task: &str, index: usize, expected: usize, obs: Vec<f32>) -> Result<Vec<f32>> {
    check_obs(task, index, expected, obs.len())?;
    check_finite(task, index, &obs, None)?;
    Ok(obs)
}

/// What an env returned after a step, checked.
fn checked_step(task: &str, index: usize, expected: usize, step: Step) -> Result<Step> {
    check_obs(task, index, expected, step.obs.len())?;
    check_finite(task, index, &step.obs, Some(step.reward))?;
    Ok(step)
}

enum Backend {
    InProcess(Vec<Box<dyn Env>>),
    Workers {
        workers: Vec<WorkerProcess>,
        layout: Layout,
        /// Where each env runs.
        owner: Vec<Slot>,
    },
}

impl VectorEnv {
    /// `seeds[i]` is env i's construction seed, as `envs::make(task, seeds[i])`.
    /// `worker` = how to start a worker process (program + args); unused for InProcess.
    pub fn new(
        task: &str,
        seeds: &[u64],
        placement: Placement,
        worker: &WorkerCommand,
    ) -> Result<Self> {
        Self::observed(task, ObsKind::State, seeds, placement, worker)
    }

    /// [`Self::new`] with the observation the agent gets, and whether the envs also render
    /// videos (as `envs::make_observed`).
    pub fn observed(
        task: &str,
        options: impl Into<EnvOptions>,
        seeds: &[u64],
        placement: Placement,
        worker: &WorkerCommand,
    ) -> Result<Self> {
        let mixes = vec![TaskMix::single(task); seeds.len()];
        Self::mixed(&mixes, options, seeds, placement, worker)
    }

    /// Env i runs the tasks of `mixes[i]` (a multitask run's slots), made with `seeds[i]`.
    /// They share one observation and action shape; the spec's episode length is the longest.
    pub fn mixed(
        mixes: &[TaskMix],
        options: impl Into<EnvOptions>,
        seeds: &[u64],
        placement: Placement,
        worker: &WorkerCommand,
    ) -> Result<Self> {
        let options = options.into();
        if seeds.is_empty() {
            return Err(Error::VectorInput(
                "no environments: give at least one seed".into(),
            ));
        }
        if mixes.len() != seeds.len() {
            return Err(Error::VectorInput(format!(
                "{} task mixes for {} seeds: give one per environment",
                mixes.len(),
                seeds.len()
            )));
        }
        let task = run_name(mixes);
        // A MuJoCo backend that cannot render here fails in every worker: say so once, here.
        if mixes
            .iter()
            .flat_map(|m| &m.tasks)
            .any(|t| crate::registry::uses_mujoco(t))
        {
            crate::renderer::check_for(options.renders())?;
        }
        let (spec, backend) = match placement {
            Placement::InProcess => {
                let envs = mixes
                    .iter()
                    .zip(seeds)
                    .enumerate()
                    .map(|(i, (mix, &seed))| mix.make(seed, startup::filming(options, i)))
                    .collect::<Result<Vec<_>>>()?;
                let spec = common_spec(envs.iter().map(|e| e.spec()))
                    .map_err(|(a, b)| different_shapes(&a, &b))?;
                (spec, Backend::InProcess(envs))
            }
            Placement::Workers(0) => {
                return Err(Error::VectorInput(
                    "Placement::Workers(0): at least one worker process is needed".into(),
                ))
            }
            Placement::Workers(k) => {
                let (workers, owner, spec) =
                    startup::start(&task, mixes, options, seeds, k, worker)?;
                let layout = Layout::new(&spec);
                let backend = Backend::Workers {
                    workers,
                    layout,
                    owner,
                };
                (spec, backend)
            }
        };
        Ok(Self {
            task,
            obs: options.obs,
            spec,
            num_envs: seeds.len(),
            backend,
        })
    }

    /// Environments already made, stepped in this process (they must share one spec).
    pub fn from_envs(task: &str, envs: Vec<Box<dyn Env>>) -> Result<Self> {
        if envs.is_empty() {
            return Err(Error::VectorInput(
                "no environments: give at least one".into(),
            ));
        }
        let spec = common_spec(envs.iter().map(|e| e.spec()))
            .map_err(|(a, b)| different_shapes(&a, &b))?;
        Ok(Self {
            task: task.into(),
            obs: ObsKind::State,
            spec,
            num_envs: envs.len(),
            backend: Backend::InProcess(envs),
        })
    }

    pub fn num_envs(&self) -> usize {
        self.num_envs
    }

    pub fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    pub fn task(&self) -> &str {
        &self.task
    }

    /// What the environments' observations are.
    pub fn obs_kind(&self) -> ObsKind {
        self.obs
    }

    /// The process ids of the worker processes, in env order (empty in-process).
    pub fn worker_pids(&self) -> Vec<u32> {
        match &self.backend {
            Backend::InProcess(_) => Vec::new(),
            Backend::Workers { workers, .. } => workers.iter().map(WorkerProcess::pid).collect(),
        }
    }

    /// Whether every worker process still runs (for long work that steps no environment):
    /// one that died is an error naming it, as a step would be.
    pub fn check_workers(&mut self) -> Result<()> {
        match &mut self.backend {
            Backend::InProcess(_) => Ok(()),
            Backend::Workers { workers, .. } => {
                workers.iter_mut().try_for_each(WorkerProcess::check_alive)
            }
        }
    }

    /// From now on (the workers started: starting may take long), a worker that stays silent
    /// [`STOP_PATIENCE`] after `probe` says this process is to stop is given up (killed,
    /// [`Error::GivenUpAtStop`]), so that a hung worker does not hold the stop's checkpoint up
    /// to its reply limit, past a launcher's grace.
    pub fn give_up_hung_workers_at_stop(&mut self, probe: StopProbe) {
        if let Backend::Workers { workers, .. } = &mut self.backend {
            for worker in workers {
                worker.watch_stops(probe);
            }
        }
    }

    /// Resets env i only (each env resets on its own schedule). Returns its observation.
    pub fn reset(&mut self, i: usize, seed: Option<u64>) -> Result<Vec<f32>> {
        let mut observations = self.reset_many(&[(i, seed)])?;
        Ok(observations.pop().unwrap_or_default())
    }

    /// Resets every env listed in `resets` (env, seed), workers concurrently (a worker's own
    /// envs one after another); returns their observations, in order. An episode of every
    /// environment often ends at the same step (a fixed length): resetting them one by one
    /// would leave all workers but one idle, for as long as the resets take.
    ///
    /// If a worker fails, the other workers' envs have still been reset; the error names it.
    pub fn reset_many(&mut self, resets: &[(usize, Option<u64>)]) -> Result<Vec<Vec<f32>>> {
        let mut listed = vec![false; self.num_envs];
        for &(i, _) in resets {
            self.check_index(i)?;
            if std::mem::replace(&mut listed[i], true) {
                return Err(Error::VectorInput(format!(
                    "env {i} is listed twice in one reset"
                )));
            }
        }
        let (workers, layout, owner) = match &mut self.backend {
            Backend::InProcess(envs) => {
                let (task, obs_dim) = (&self.task, self.spec.obs_dim());
                let mut reset = |&(i, seed): &(usize, Option<u64>)| {
                    checked_obs(task, i, obs_dim, envs[i].reset(seed)?)
                };
                return resets.iter().map(&mut reset).collect();
            }
            Backend::Workers {
                workers,
                layout,
                owner,
            } => (workers, layout, owner),
        };
        // Each worker's resets in turn; one of each worker's at a time, all workers at once.
        let mut queues = vec![std::collections::VecDeque::new(); workers.len()];
        for (at, &(i, seed)) in resets.iter().enumerate() {
            queues[owner[i].worker].push_back((at, owner[i].local, seed));
        }
        let mut observations = vec![Vec::new(); resets.len()];
        let mut failure = None;
        while queues.iter().any(|q| !q.is_empty()) {
            let mut asked = Vec::new();
            for (w, queue) in queues.iter_mut().enumerate() {
                let Some((at, local, seed)) = queue.pop_front() else {
                    continue;
                };
                let command = Encoder::default().u32(local as u32);
                let command = match seed {
                    Some(seed) => command.u8(1).u64(seed),
                    None => command.u8(0),
                };
                match workers[w].send(protocol::RESET, &command.0) {
                    Ok(()) => asked.push((w, at, local)),
                    Err(e) => {
                        failure.get_or_insert(e);
                        queue.clear();
                    }
                }
            }
            for (w, at, local) in asked {
                match workers[w].receive() {
                    Ok(_) => observations[at] = layout.read_obs(workers[w].region(), local),
                    Err(e) => {
                        failure.get_or_insert(e);
                        queues[w].clear();
                    }
                }
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        resets
            .iter()
            .zip(observations)
            .map(|(&(i, _), obs)| checked_obs(&self.task, i, self.spec.obs_dim(), obs))
            .collect()
    }

    /// Makes env i's next reset start its task `task` (an index into its [`TaskMix`]).
    pub fn switch_task(&mut self, i: usize, task: usize) -> Result<()> {
        self.check_index(i)?;
        match &mut self.backend {
            Backend::InProcess(envs) => envs[i].switch_task(task),
            Backend::Workers { workers, owner, .. } => {
                let Slot { worker: w, local } = owner[i];
                let command = Encoder::default().u32(local as u32).u32(task as u32);
                workers[w].call(protocol::SWITCH, &command.0).map(|_| ())
            }
        }
    }

    /// Steps every env listed in `which` with its action (flat, `which.len() * action_dim`),
    /// all workers concurrently; returns one `Step` per listed env, in order.
    ///
    /// If a worker fails, the other workers' envs have still stepped; the error names the
    /// task and the env (or the worker's envs when it died).
    pub fn step(&mut self, which: &[usize], actions: &[f32]) -> Result<Vec<Step>> {
        let action_dim = self.spec.action_dim;
        let mut listed = vec![false; self.num_envs];
        for &i in which {
            self.check_index(i)?;
            if std::mem::replace(&mut listed[i], true) {
                return Err(Error::VectorInput(format!(
                    "env {i} is listed twice in one step"
                )));
            }
        }
        if actions.len() != which.len() * action_dim {
            return Err(Error::VectorInput(format!(
                "{} action components for {} envs, expected {} (action_dim {action_dim} each)",
                actions.len(),
                which.len(),
                which.len() * action_dim
            )));
        }
        let actions = actions.chunks_exact(action_dim.max(1));
        match &mut self.backend {
            Backend::InProcess(envs) => which
                .iter()
                .zip(actions)
                .map(|(&i, action)| {
                    checked_step(&self.task, i, self.spec.obs_dim(), envs[i].step(action)?)
                })
                .collect(),
            Backend::Workers {
                workers,
                layout,
                owner,
            } => {
                let mut lists = vec![Vec::new(); workers.len()];
                for (&i, action) in which.iter().zip(actions) {
                    let Slot { worker: w, local } = owner[i];
                    layout.write_action(workers[w].region_mut(), local, action);
                    lists[w].push(local as u32);
                }
                let mut failure = None;
                let mut sent = vec![false; workers.len()];
                for (w, list) in lists.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
                    let mut command = Encoder::default().u32(list.len() as u32);
                    for &local in list {
                        command = command.u32(local);
                    }
                    match workers[w].send(protocol::STEP, &command.0) {
                        Ok(()) => sent[w] = true,
                        Err(e) => {
                            failure.get_or_insert(e);
                        }
                    }
                }
                for (worker, _) in workers.iter_mut().zip(&sent).filter(|(_, &s)| s) {
                    if let Err(e) = worker.receive() {
                        failure.get_or_insert(e);
                    }
                }
                if let Some(e) = failure {
                    return Err(e);
                }
                which
                    .iter()
                    .map(|&i| {
                        let Slot { worker: w, local } = owner[i];
                        let step = layout.read_step(workers[w].region(), local);
                        checked_step(&self.task, i, self.spec.obs_dim(), step)
                    })
                    .collect()
            }
        }
    }

    /// Env i's current image, `size`×`size` where the env can choose (see [`Env::render`]).
    /// Envs render only when made to ([`EnvOptions::renders`]); with `videos`, env 0 does.
    pub fn render(&mut self, i: usize, size: usize) -> Result<Frame> {
        self.check_index(i)?;
        match &mut self.backend {
            Backend::InProcess(envs) => envs[i].render(size),
            Backend::Workers { workers, owner, .. } => {
                let Slot { worker: w, local } = owner[i];
                let command = Encoder::default().u32(local as u32).u32(size as u32);
                let reply = workers[w].call(protocol::RENDER, &command.0)?;
                protocol::decode_frame(&reply).map_err(|e| Error::Worker {
                    task: self.task.clone(),
                    envs: format!("env {i}"),
                    pid: workers[w].pid(),
                    what: format!("sent a malformed frame: {e}"),
                })
            }
        }
    }

    fn check_index(&self, i: usize) -> Result<()> {
        if i < self.num_envs {
            Ok(())
        } else {
            Err(Error::VectorInput(format!(
                "env index {i} is out of range: there are {} envs (0..{})",
                self.num_envs, self.num_envs
            )))
        }
    }
}

impl Drop for VectorEnv {
    /// Ends every worker together, within one grace for all.
    fn drop(&mut self) {
        if let Backend::Workers { workers, .. } = &mut self.backend {
            process::end_all(workers);
        }
    }
}

/// The run's tasks in the order they first appear, named as a run names them.
fn run_name(mixes: &[TaskMix]) -> String {
    let mut tasks: Vec<String> = Vec::new();
    for task in mixes.iter().flat_map(|m| &m.tasks) {
        if !tasks.contains(task) {
            tasks.push(task.clone());
        }
    }
    TaskMix {
        tasks,
        padding: None,
    }
    .name()
}

/// The spec the envs share: the same observation and action shapes, the longest episode.
/// Err: two specs whose shapes differ.
pub(crate) fn common_spec<'a>(
    mut specs: impl Iterator<Item = &'a EnvSpec>,
) -> std::result::Result<EnvSpec, (EnvSpec, EnvSpec)> {
    let Some(first) = specs.next() else {
        return Ok(EnvSpec {
            obs_shape: Vec::new(),
            action_dim: 0,
            episode_length: 0,
        });
    };
    let mut common = first.clone();
    for spec in specs {
        if (&spec.obs_shape, spec.action_dim) != (&common.obs_shape, common.action_dim) {
            return Err((common, spec.clone()));
        }
        common.episode_length = common.episode_length.max(spec.episode_length);
    }
    Ok(common)
}

fn different_shapes(a: &EnvSpec, b: &EnvSpec) -> Error {
    Error::VectorInput(format!("environments of different shapes: {a:?} and {b:?}"))
}

#[cfg(test)]
mod tests;
