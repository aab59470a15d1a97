//! Checkpoints: rank 0 writes the plain model (`model.safetensors`, official state-dict keys,
//! loadable at any world size) and the learner state (`state.safetensors`: Adam moments and the
//! Q scale; `meta.json`: counters). With `save_buffer=true` every rank also saves its replay
//! buffer. Each checkpoint directory is written atomically (see [`store`]).
//!
//! Random streams are not saved: at every checkpoint point the trainer re-derives them from
//! (seed, rank, step), in an uninterrupted run and in a resumed one alike, so resuming
//! continues exactly.
pub mod store;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::agent::{AdamState, Agent};
use crate::buffer::BufferMeta;
use crate::config::Config;
use crate::dist::ProcessGroup;
use crate::error::{Error, Result};
use crate::trainer::learner::Learner;

/// Counters of a run, in global agent steps.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TrainState {
    /// Local steps taken by each rank.
    pub step: u64,
    pub episodes: u64,
    /// Seconds of training before this process started (for elapsed_time and steps/s).
    pub elapsed: f64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    global_step: u64,
    world_size: usize,
    episodes: u64,
    elapsed: f64,
    task: String,
    /// Each rank's checksum of its learner state at this step; all equal by construction.
    rank_checksums: Vec<f64>,
    model_optim_step: u64,
    policy_optim_step: u64,
}

const MODEL: &str = "model.safetensors";
const STATE: &str = "state.safetensors";
const META: &str = "meta.json";

pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

fn buffers_dir(run_dir: &Path, rank: usize) -> PathBuf {
    run_dir.join("buffers").join(format!("rank{rank}"))
}

fn fail(context: &str, e: impl std::fmt::Display) -> Error {
    Error::Other(format!("{context}: {e}"))
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let bytes =
        serde_json::to_vec_pretty(value).map_err(|e| fail(&path.display().to_string(), e))?;
    std::fs::write(path, bytes).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// Writes a checkpoint at the current step (every rank calls this at the same point).
pub fn save(
    config: &Config,
    run_dir: &Path,
    state: &TrainState,
    agent: &Agent,
    learner: &Learner,
    group: &ProcessGroup,
) -> Result<()> {
    let global_step = state.step * group.world_size() as u64;
    let checksums = rank_checksums(agent, group)?;
    if config.save_buffer {
        let (tensors, meta) = learner.buffer.export();
        store::save(&buffers_dir(run_dir, group.rank()), global_step, |dir| {
            Tensor::write_safetensors(&tensors, dir.join("buffer.safetensors"))?;
            write_json(&dir.join("buffer.json"), &meta)
        })?;
    }
    if group.rank() != 0 {
        return Ok(());
    }
    let optim = |prefix: &str, s: AdamState| {
        vec![
            (format!("{prefix}.exp_avg"), s.exp_avg),
            (format!("{prefix}.exp_avg_sq"), s.exp_avg_sq),
        ]
    };
    let model_state = agent.learner.model_optim.state();
    let policy_state = agent.learner.policy_optim.state();
    let meta = Meta {
        global_step,
        world_size: group.world_size(),
        episodes: state.episodes,
        elapsed: state.elapsed,
        task: config.task.clone(),
        rank_checksums: checksums,
        model_optim_step: model_state.step,
        policy_optim_step: policy_state.step,
    };
    let mut tensors = optim("model_optim", model_state);
    tensors.extend(optim("policy_optim", policy_state));
    tensors.push((
        "scale".into(),
        agent.learner.scale.value().to_device(tch::Device::Cpu),
    ));
    let tensors: Vec<(String, Tensor)> = tensors
        .into_iter()
        .map(|(n, t)| (n, t.to_device(tch::Device::Cpu)))
        .collect();
    store::save(&checkpoints_dir(run_dir), global_step, |dir| {
        Tensor::write_safetensors(&agent.model.named_tensors(), dir.join(MODEL))?;
        Tensor::write_safetensors(&tensors, dir.join(STATE))?;
        write_json(&dir.join(META), &meta)
    })?;
    Ok(())
}

/// A checksum of everything that must be identical on all ranks after an optimiser step:
/// parameters, target Qs, both optimisers' moments and steps, and the Q scale.
pub fn learner_checksum(agent: &Agent) -> Tensor {
    let model = &agent.model;
    let learner = &agent.learner;
    let (m, p) = (learner.model_optim.state(), learner.policy_optim.state());
    let parts = [
        &model.model_params.flat,
        &model.policy_params.flat,
        &model.target_params.flat,
        &m.exp_avg,
        &m.exp_avg_sq,
        &p.exp_avg,
        &p.exp_avg_sq,
        learner.scale.value(),
    ];
    let mut total = Tensor::from((m.step + 3 * p.step) as f64);
    for (i, part) in parts.into_iter().enumerate() {
        let x = part
            .detach()
            .to_device(tch::Device::Cpu)
            .to_kind(tch::Kind::Double);
        // Position weights make the sum sensitive to where values sit, not only to their total.
        let n = x.numel() as i64;
        let weights =
            Tensor::arange(n, (tch::Kind::Double, tch::Device::Cpu)).sin() + (i + 2) as f64;
        total += (x * weights).sum(tch::Kind::Double);
    }
    total.view([1])
}

/// Every rank's [`learner_checksum`], gathered; an error when they differ.
fn rank_checksums(agent: &Agent, group: &ProcessGroup) -> Result<Vec<f64>> {
    let all = group.all_gather(&learner_checksum(agent))?;
    let all = Vec::<f64>::try_from(&all)?;
    if all.iter().any(|c| c.to_bits() != all[0].to_bits()) {
        return Err(Error::Other(format!(
            "learner state diverged across ranks (checksums {all:?}); this is a bug, please report it"
        )));
    }
    Ok(all)
}

/// The model weights a path names: a `.safetensors` file, a checkpoint directory, or a run
/// (or checkpoints) directory whose latest checkpoint is taken.
pub fn model_file(path: &Path) -> Result<PathBuf> {
    if path.is_file() {
        return Ok(path.to_owned());
    }
    if path.join(MODEL).is_file() {
        return Ok(path.join(MODEL));
    }
    let latest = store::latest(path).or_else(|| store::latest(&checkpoints_dir(path)));
    match latest {
        Some((_, dir)) => Ok(dir.join(MODEL)),
        None => Err(Error::Config(format!(
            "checkpoint={}: no such file, and no checkpoint directory there",
            path.display()
        ))),
    }
}

/// Which checkpoint `resume` names: `auto` is the run directory's latest, else a path to a
/// checkpoint directory.
fn resume_source(config: &Config, run_dir: &Path) -> Result<Option<PathBuf>> {
    match config.resume.as_deref() {
        None | Some("") | Some("none") => Ok(None),
        Some("auto") => Ok(store::latest(&checkpoints_dir(run_dir)).map(|(_, dir)| dir)),
        Some(path) => {
            let dir = PathBuf::from(path);
            if dir.join(META).is_file() {
                Ok(Some(dir))
            } else if let Some((_, latest)) =
                store::latest(&dir).or_else(|| store::latest(&checkpoints_dir(&dir)))
            {
                Ok(Some(latest))
            } else {
                Err(Error::Config(format!(
                    "resume={path}: not a checkpoint directory (no {META}), nor a run or checkpoints \
                     directory holding one; use resume=auto or a path to checkpoints/step_<N>"
                )))
            }
        }
    }
}

/// Loads the learner state named by `resume` into `agent` (and this rank's buffer when it was
/// saved at the same step and world size); returns the counters to continue from.
pub fn resume(
    config: &Config,
    run_dir: &Path,
    agent: &mut Agent,
    learner: &mut Learner,
    group: &ProcessGroup,
) -> Result<Option<TrainState>> {
    let Some(dir) = resume_source(config, run_dir)? else {
        return Ok(None);
    };
    let meta: Meta = serde_json::from_slice(
        &std::fs::read(dir.join(META))
            .map_err(|e| Error::io(format!("read {}", dir.display()), e))?,
    )
    .map_err(|e| fail(&format!("{}/{META}", dir.display()), e))?;
    if meta.task != config.task {
        return Err(Error::Config(format!(
            "resume: the checkpoint was trained on task={}, this run has task={}",
            meta.task, config.task
        )));
    }
    agent.model.load(&dir.join(MODEL))?;
    let tensors = Tensor::read_safetensors(dir.join(STATE))?;
    let get = |name: &str| -> Result<Tensor> {
        tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.to_device(agent.model.device()))
            .ok_or_else(|| Error::Other(format!("{}: {STATE} lacks '{name}'", dir.display())))
    };
    let model_state = AdamState {
        step: meta.model_optim_step,
        exp_avg: get("model_optim.exp_avg")?,
        exp_avg_sq: get("model_optim.exp_avg_sq")?,
    };
    let policy_state = AdamState {
        step: meta.policy_optim_step,
        exp_avg: get("policy_optim.exp_avg")?,
        exp_avg_sq: get("policy_optim.exp_avg_sq")?,
    };
    let scale = get("scale")?;
    agent.learner.model_optim.load_state(&model_state)?;
    agent.learner.policy_optim.load_state(&policy_state)?;
    agent.learner.scale.set(&scale);
    let loaded = learner_checksum(agent).double_value(&[0]);
    match meta.rank_checksums.first() {
        Some(saved) if saved.to_bits() == loaded.to_bits() => {}
        saved => {
            return Err(Error::Other(format!(
                "resume: {} does not load back to the learner state that was saved (checksum \
                 {loaded} vs {saved:?}); the checkpoint is damaged, pick an earlier one",
                dir.display()
            )))
        }
    }

    let world = group.world_size() as u64;
    // The buffers live beside the run that wrote the checkpoint: <run>/checkpoints/step_N.
    let source_run = dir.parent().and_then(Path::parent).unwrap_or(run_dir);
    let buffer = store::at(&buffers_dir(source_run, group.rank()), meta.global_step);
    match buffer {
        Some(buffer_dir) if meta.world_size == group.world_size() => {
            let tensors = Tensor::read_safetensors(buffer_dir.join("buffer.safetensors"))?;
            let buffer_meta: BufferMeta = serde_json::from_slice(
                &std::fs::read(buffer_dir.join("buffer.json"))
                    .map_err(|e| Error::io("read buffer.json", e))?,
            )
            .map_err(|e| fail("buffer.json", e))?;
            learner.buffer.restore(&tensors, buffer_meta)?;
        }
        _ if group.rank() == 0 => eprintln!(
            "warning: resuming without replay buffers (saved with save_buffer=true at the same \
             world size); the buffer refills from new episodes"
        ),
        _ => {}
    }
    if group.rank() == 0 {
        eprintln!("Resumed from {} (step {})", dir.display(), meta.global_step);
    }
    Ok(Some(TrainState {
        step: meta.global_step / world,
        episodes: meta.episodes,
        elapsed: meta.elapsed,
    }))
}
