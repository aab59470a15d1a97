//! Starting a vector env's workers: each builds its environments (all workers at once), then
//! every worker's shared region is sized for the spec they report and mapped.
use super::process::WorkerProcess;
use super::protocol::{self, Encoder, Layout};
use super::{common_spec, WorkerCommand};
use crate::family::Family;
use crate::{EnvOptions, EnvSpec, Error, Result, TaskMix};

/// Env i runs in `workers[worker]` as that worker's env `local`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) worker: usize,
    pub(super) local: usize,
}

/// The family with a venv of its own that every one of `tasks` needs and this process is not
/// (a worker of such a family has to make them); None if some task can step here.
pub(super) fn away_family<'a>(tasks: impl IntoIterator<Item = &'a String>) -> Option<Family> {
    let mut families = tasks
        .into_iter()
        .map(|task| Family::of(task).filter(|f| f.has_own_venv() && !f.steps_here()));
    let first = families.next()??;
    families.all(|f| f == Some(first)).then_some(first)
}

/// Env `i`'s options: videos are filmed in env 0 only, so only it renders for them.
pub(super) fn filming(options: EnvOptions, i: usize) -> EnvOptions {
    EnvOptions {
        videos: options.videos && i == 0,
        ..options
    }
}

/// Starts `k` workers (at most one per env), has each build its envs, all at once, and maps
/// their regions. Returns them, per env its worker and its index there, and the spec the envs
/// share.
pub(super) fn start(
    task: &str,
    mixes: &[TaskMix],
    options: EnvOptions,
    seeds: &[u64],
    k: usize,
    worker: &WorkerCommand,
) -> Result<(Vec<WorkerProcess>, Vec<Slot>, EnvSpec)> {
    let n = seeds.len();
    let k = k.min(n);
    let mut workers = Vec::with_capacity(k);
    let mut owner = Vec::with_capacity(n);
    let mut start_each = || -> Result<()> {
        for w in 0..k {
            let envs = w * n / k..(w + 1) * n / k;
            owner.extend((0..envs.len()).map(|local| Slot { worker: w, local }));
            let family = away_family(mixes[envs.clone()].iter().flat_map(|m| &m.tasks));
            let command = match family {
                Some(family) => worker.for_family(family)?,
                None => worker.clone(),
            };
            let mut process = WorkerProcess::spawn(&command, task, envs.clone())?;
            // Worker 0 holds env 0, the one that films.
            let mut init = Encoder::default()
                .u8(options.obs as u8)
                .u8(u8::from(filming(options, envs.start).videos))
                .u32(envs.len() as u32);
            for (mix, &seed) in mixes[envs.clone()].iter().zip(&seeds[envs]) {
                init = protocol::encode_mix(init.u64(seed), mix);
            }
            process.send(protocol::INIT, &init.0)?;
            workers.push(process);
        }
        Ok(())
    };
    start_each().inspect_err(|_| kill_all(&mut workers))?;
    let spec = map_regions(task, &mut workers).inspect_err(|_| kill_all(&mut workers))?;
    Ok((workers, owner, spec))
}

/// Workers that failed to start together: those still building their environments would not
/// read a closed stdin until done, so they are killed rather than waited for one by one.
fn kill_all(workers: &mut [WorkerProcess]) {
    for worker in workers.iter_mut() {
        worker.kill();
    }
}

/// Collects the workers' specs (they built their envs concurrently), then sizes and maps
/// every worker's shared region.
fn map_regions(task: &str, workers: &mut [WorkerProcess]) -> Result<EnvSpec> {
    let mut spec: Option<EnvSpec> = None;
    for worker in workers.iter_mut() {
        let reply = worker.receive()?;
        let theirs = protocol::decode_spec(&reply);
        let mismatch = match (&theirs, &spec) {
            (Err(e), _) => Some(format!("sent a malformed spec: {e}")),
            (Ok(theirs), Some(ours)) => common_spec([ours, theirs].into_iter())
                .err()
                .map(|_| format!("reports spec {theirs:?}, unlike {ours:?}")),
            _ => None,
        };
        if let Some(what) = mismatch {
            return Err(Error::Worker {
                task: task.into(),
                envs: format!("envs {:?}", worker.envs()),
                pid: worker.pid(),
                what,
            });
        }
        spec = match (spec, theirs.ok()) {
            (Some(ours), Some(theirs)) => common_spec([&ours, &theirs].into_iter()).ok(),
            (ours, theirs) => ours.or(theirs),
        };
    }
    let spec = spec.ok_or_else(|| Error::VectorInput("no worker processes".into()))?;
    let layout = Layout::new(&spec);
    for worker in workers.iter_mut() {
        worker.map(layout.size(worker.envs().len()))?;
        worker.send(protocol::MAP, &[])?;
    }
    for worker in workers.iter_mut() {
        worker.receive()?;
    }
    Ok(spec)
}
