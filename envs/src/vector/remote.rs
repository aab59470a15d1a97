//! One environment slot stepped in a worker process of its own: how a process makes an
//! environment whose simulator lives in another family's venv (see [`crate::family`]).
use std::sync::RwLock;

use super::process::WorkerProcess;
use super::protocol::{self, Decoder, Encoder};
use super::{Placement, VectorEnv, WorkerCommand};
use crate::{Env, EnvOptions, EnvSpec, Error, Frame, Result, Step, TaskMix};

static DEFAULT_WORKER: RwLock<Option<WorkerCommand>> = RwLock::new(None);

/// Registers how this program starts a worker process (a program that calls
/// [`super::serve_worker`]) for an environment that must step in one when nobody asked for a
/// vector env: `envs::make("mw-reach", …)` in a process without Meta-World. The latest
/// registration counts (a program may learn its reply limit from a config read later); a
/// worker registers itself.
pub fn set_default_worker(command: WorkerCommand) {
    *DEFAULT_WORKER.write().unwrap_or_else(|e| e.into_inner()) = Some(command);
}

fn default_worker() -> Result<WorkerCommand> {
    DEFAULT_WORKER
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .ok_or_else(|| Error::WorkerStart {
            program: "(none)".into(),
            reason: "this program registered no environment worker \
                 (envs::vector::set_default_worker), and this task steps in one"
                .into(),
        })
}

/// An environment slot (one task, or a padded mix) in a worker process of its own, started
/// with its family's venv.
pub struct RemoteEnv {
    envs: VectorEnv,
}

impl RemoteEnv {
    pub fn new(mix: &TaskMix, seed: u64, options: EnvOptions) -> Result<Self> {
        let envs = VectorEnv::mixed(
            std::slice::from_ref(mix),
            options,
            &[seed],
            Placement::Workers(1),
            &default_worker()?,
        )?;
        Ok(Self { envs })
    }

    /// The worker process's id.
    pub fn pid(&self) -> Option<u32> {
        self.envs.worker_pids().first().copied()
    }
}

impl Env for RemoteEnv {
    fn spec(&self) -> &EnvSpec {
        self.envs.spec()
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>> {
        self.envs.reset(0, seed)
    }

    fn step(&mut self, action: &[f32]) -> Result<Step> {
        self.spec().check_action(action)?;
        let mut steps = self.envs.step(&[0], action)?;
        steps
            .pop()
            .ok_or_else(|| Error::VectorInput("the worker returned no step".into()))
    }

    fn render(&mut self, size: usize) -> Result<Frame> {
        self.envs.render(0, size)
    }

    fn switch_task(&mut self, task: usize) -> Result<()> {
        self.envs.switch_task(0, task)
    }
}

/// Each of `tasks`' own spec (one family's, or the project venv's), made with `seed` and
/// `options` by one worker process of the registered program, which keeps none of them.
pub fn specs_in_worker(tasks: &[String], seed: u64, options: EnvOptions) -> Result<Vec<EnvSpec>> {
    let worker = default_worker()?;
    let worker = match super::startup::away_family(tasks) {
        Some(family) => worker.for_family(family)?,
        None => worker,
    };
    let name = TaskMix {
        tasks: tasks.to_vec(),
        padding: None,
    }
    .name();
    let mut process = WorkerProcess::spawn(&worker, &name, 0..tasks.len())?;
    let mut command = Encoder::default()
        .u8(options.obs as u8)
        .u8(u8::from(options.videos))
        .u64(seed)
        .u32(tasks.len() as u32);
    for task in tasks {
        command = command.str(task);
    }
    let reply = process.call(protocol::SPECS, &command.0)?;
    process.close();
    let mut d = Decoder(&reply);
    tasks
        .iter()
        .map(|_| {
            protocol::read_spec(&mut d).map_err(|e| Error::Worker {
                task: name.clone(),
                envs: format!("envs 0-{}", tasks.len().saturating_sub(1)),
                pid: process.pid(),
                what: format!("sent malformed specs: {e}"),
            })
        })
        .collect()
}
