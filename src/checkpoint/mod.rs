//! Checkpoints: rank 0 writes the plain model (`model.safetensors`, official state-dict keys,
//! loadable at any world size) and the learner state (`state.safetensors`: Adam moments and the
//! Q scale; `meta.json`: counters). With `save_buffer=true` every rank also saves its replay
//! buffer. Each checkpoint directory is written atomically (see [`store`]).
//!
//! Integrity: `meta.json` records the crc32c of each file's bytes and of every part of the
//! learner state (see [`integrity`]). Loading checks the files first (a mismatch means the file
//! is damaged), then that the loaded state hashes to what was saved.
//!
//! Random streams are not saved: at every checkpoint point the trainer re-derives them from
//! (seed, rank, step), in an uninterrupted run and in a resumed one alike, so resuming
//! continues exactly.
pub mod integrity;
pub mod store;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::agent::AdamState;
use crate::buffer::BufferMeta;
use crate::config::Config;
use crate::ddp::ProcessGroup;
use crate::error::{Error, Result};
use crate::learner::Learner;

/// Counters of a run, in global agent steps.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TrainState {
    /// Local steps taken by each rank.
    pub step: u64,
    pub episodes: u64,
    /// Seconds of training before this process started (for elapsed_time and steps/s).
    pub elapsed: f64,
    /// Updates of the seed-data pretraining already made, when a stop interrupted it.
    pub pretrain_updates: u64,
}

/// `meta.json`'s format: 2 since checksums are crc32c of bytes and files carry hashes (format
/// 1 held float sums of the learner state, which depended on the thread count).
const FORMAT: u32 = 2;

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    #[serde(default)]
    format: u32,
    global_step: u64,
    world_size: usize,
    episodes: u64,
    elapsed: f64,
    task: String,
    /// Each rank's checksum of its learner state at this step; all equal by construction.
    #[serde(default)]
    rank_checksums: Vec<u32>,
    /// The checksum of each part of the learner state, to say what differs on a mismatch.
    #[serde(default)]
    learner_parts: BTreeMap<String, u32>,
    /// crc32c of each file's bytes.
    #[serde(default)]
    files: BTreeMap<String, u32>,
    model_optim_step: u64,
    policy_optim_step: u64,
    #[serde(default)]
    pretrain_updates: u64,
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
    Error::Checkpoint(format!("{context}: {e}"))
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
    learner: &Learner,
    group: &ProcessGroup,
) -> Result<()> {
    let global_step = state.step * group.world_size() as u64;
    // Never a checkpoint of a diverged state: the last one written stays the last good one.
    crate::trainer::finite::check_parameters(learner, global_step)?;
    let (parts, checksums) = rank_checksums(learner, group)?;
    if config.save_buffer {
        let (tensors, meta) = learner.buffer().export();
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
    let model_state = learner.updater().model_optim.state();
    let policy_state = learner.updater().policy_optim.state();
    let mut meta = Meta {
        format: FORMAT,
        global_step,
        world_size: group.world_size(),
        episodes: state.episodes,
        elapsed: state.elapsed,
        task: config.task.clone(),
        rank_checksums: checksums,
        learner_parts: parts.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
        files: BTreeMap::new(),
        model_optim_step: model_state.step,
        policy_optim_step: policy_state.step,
        pretrain_updates: state.pretrain_updates,
    };
    let mut tensors = optim("model_optim", model_state);
    tensors.extend(optim("policy_optim", policy_state));
    tensors.push((
        "scale".into(),
        learner.updater().scale.value().to_device(tch::Device::Cpu),
    ));
    let tensors: Vec<(String, Tensor)> = tensors
        .into_iter()
        .map(|(n, t)| (n, t.to_device(tch::Device::Cpu)))
        .collect();
    store::save(&checkpoints_dir(run_dir), global_step, |dir| {
        Tensor::write_safetensors(&learner.model().named_tensors(), dir.join(MODEL))?;
        Tensor::write_safetensors(&tensors, dir.join(STATE))?;
        for name in [MODEL, STATE] {
            meta.files
                .insert(name.into(), integrity::file_crc(&dir.join(name))?);
        }
        write_json(&dir.join(META), &meta)
    })?;
    Ok(())
}

/// Every rank's [`integrity::learner_parts`], gathered; an error naming the parts that differ
/// when ranks disagree. Returns this rank's parts and every rank's combined checksum.
fn rank_checksums(learner: &Learner, group: &ProcessGroup) -> Result<(integrity::Parts, Vec<u32>)> {
    let parts = integrity::learner_parts(learner);
    let local: Vec<i64> = parts.iter().map(|(_, crc)| *crc as i64).collect();
    let all = Vec::<i64>::try_from(&group.all_gather(&Tensor::from_slice(&local))?)?;
    let n = parts.len();
    let mut combined = Vec::new();
    let mut differing = Vec::new();
    for (rank, row) in all.chunks(n).enumerate() {
        let named: Vec<(&str, u32)> = parts
            .iter()
            .zip(row)
            .map(|((name, _), crc)| (*name, *crc as u32))
            .collect();
        for ((name, mine), (_, theirs)) in parts.iter().zip(&named) {
            if mine != theirs {
                differing.push(format!("{name} on rank {rank}"));
            }
        }
        combined.push(integrity::combine(&named));
    }
    if !differing.is_empty() {
        return Err(Error::Checkpoint(format!(
            "learner state diverged across ranks (differs from rank {}: {}); this is a bug, \
             please report it",
            group.rank(),
            differing.join(", ")
        )));
    }
    Ok((parts, combined))
}

/// The model weights a path names: `model.safetensors` of a checkpoint directory (the
/// directory itself or any file in it), the latest checkpoint of a run (or checkpoints)
/// directory, or any other `.safetensors` file (an imported one).
pub fn model_file(path: &Path) -> Result<PathBuf> {
    if path.is_file() {
        let dir = path.parent().unwrap_or(Path::new("."));
        let in_checkpoint = dir.join(MODEL).is_file() && dir.join(META).is_file();
        if in_checkpoint && path.file_name() != Some(MODEL.as_ref()) {
            eprintln!(
                "checkpoint={}: taking the weights of its checkpoint, {}",
                path.display(),
                dir.join(MODEL).display()
            );
            return Ok(dir.join(MODEL));
        }
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

/// Checks a weights file against the hash its checkpoint's `meta.json` recorded. A file outside
/// a checkpoint directory (an imported one) has nothing to check against; a checkpoint written
/// before hashes were recorded loads with a warning.
pub fn verify_model(path: &Path) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    if path.file_name() != Some(MODEL.as_ref()) || !dir.join(META).is_file() {
        return Ok(());
    }
    let meta = read_meta(dir)?;
    verify_files(dir, &meta, &[MODEL])
}

/// Reads `meta.json`; a checkpoint of format 1 (float checksums, no file hashes) reads with its
/// checksums left out, and [`Meta::format`] says it cannot be verified.
fn read_meta(dir: &Path) -> Result<Meta> {
    let path = dir.join(META);
    let bytes =
        std::fs::read(&path).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    let mut value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| fail(&path.display().to_string(), e))?;
    let format = value.get("format").and_then(|f| f.as_u64()).unwrap_or(1);
    if format > FORMAT as u64 {
        return Err(Error::Checkpoint(format!(
            "{}: written by a newer tdmpc2 (format {format}; this one reads up to {FORMAT})",
            path.display()
        )));
    }
    if format < FORMAT as u64 {
        if let Some(object) = value.as_object_mut() {
            object.remove("rank_checksums");
        }
    }
    serde_json::from_value(value).map_err(|e| fail(&path.display().to_string(), e))
}

/// Compares each of `names` in `dir` with the hash `meta` recorded when it was saved.
fn verify_files(dir: &Path, meta: &Meta, names: &[&str]) -> Result<()> {
    for name in names {
        let path = dir.join(name);
        let Some(saved) = meta.files.get(*name) else {
            eprintln!(
                "warning: {} records no hash of {name} (written by an older tdmpc2): its bytes \
                 cannot be verified",
                dir.join(META).display()
            );
            continue;
        };
        let now = integrity::file_crc(&path)?;
        if now != *saved {
            return Err(Error::Checkpoint(format!(
                "{} is damaged: its bytes do not match the hash recorded when it was saved \
                 (crc32c {now:08x}, saved {saved:08x}); use another checkpoint",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Which checkpoint `resume` names: `auto` is the run directory's latest, else a path to a
/// checkpoint directory.
fn resume_source(config: &Config, run_dir: &Path) -> Result<Option<PathBuf>> {
    match config.resume.as_deref() {
        None | Some("") | Some("none") => Ok(None),
        Some("auto") => Ok(store::latest(&checkpoints_dir(run_dir)).map(|(_, dir)| dir)),
        Some(path) => {
            let given = PathBuf::from(path);
            // Any file of a checkpoint names its directory.
            let dir = match given.parent() {
                Some(parent) if given.is_file() && parent.join(META).is_file() => parent.into(),
                _ => given,
            };
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
///
/// Rank 0 alone reads and verifies the checkpoint; every other rank receives its state over the
/// process group, so ranks on other nodes need no copy of the run directory, and all ranks agree
/// on whether the run resumes (a restarted multi-node job re-forms from rank 0's checkpoint).
pub fn resume(
    config: &Config,
    run_dir: &Path,
    learner: &mut Learner,
    group: &ProcessGroup,
) -> Result<Option<TrainState>> {
    let loaded = if group.rank() == 0 {
        load_on_root(config, run_dir, learner)
    } else {
        Ok(None)
    };
    // What rank 0 found: status (0 fresh, 1 resumed, 2 failed), then the counters.
    let (status, counters) = match &loaded {
        Ok(None) => (0.0, Counters::default()),
        Ok(Some(meta)) => (1.0, Counters::of(meta)),
        Err(_) => (2.0, Counters::default()),
    };
    let mut header = Tensor::from_slice(&counters.header(status));
    group.broadcast_from_root(&mut header)?;
    let header = Vec::<f64>::try_from(header)?;
    let meta = match (loaded, header[0] as u8) {
        (Err(e), _) => return Err(e),
        (_, 2) => {
            return Err(Error::Checkpoint(
                "resume: rank 0 could not load the checkpoint (see its error)".into(),
            ))
        }
        (_, 0) => return Ok(None),
        (Ok(Some(meta)), _) => Counters::of(&meta),
        (Ok(None), _) => Counters::from_header(&header),
    };
    share_learner_state(
        learner,
        group,
        meta.model_optim_step,
        meta.policy_optim_step,
    )?;

    let world = group.world_size() as u64;
    // The buffers live beside the run that wrote the checkpoint (<run>/checkpoints/step_N), or,
    // on a rank that cannot see it, in its own run directory.
    let source_run = resume_source(config, run_dir)
        .ok()
        .flatten()
        .and_then(|dir| dir.parent().and_then(Path::parent).map(Path::to_path_buf))
        .unwrap_or_else(|| run_dir.to_path_buf());
    let buffer = store::at(&buffers_dir(&source_run, group.rank()), meta.global_step);
    match buffer {
        Some(buffer_dir) if meta.world_size == group.world_size() => {
            let tensors = Tensor::read_safetensors(buffer_dir.join("buffer.safetensors"))?;
            let buffer_meta: BufferMeta = serde_json::from_slice(
                &std::fs::read(buffer_dir.join("buffer.json"))
                    .map_err(|e| Error::io("read buffer.json", e))?,
            )
            .map_err(|e| fail("buffer.json", e))?;
            learner.buffer_mut().restore(&tensors, buffer_meta)?;
        }
        _ if group.rank() == 0 => eprintln!(
            "warning: resuming without replay buffers (saved with save_buffer=true at the same \
             world size); the buffer refills from new episodes"
        ),
        _ => {}
    }
    Ok(Some(TrainState {
        step: meta.global_step / world,
        episodes: meta.episodes,
        elapsed: meta.elapsed,
        pretrain_updates: meta.pretrain_updates,
    }))
}

/// The counters a resumed run continues from, as rank 0 sends them to the others.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Counters {
    global_step: u64,
    world_size: usize,
    episodes: u64,
    elapsed: f64,
    pretrain_updates: u64,
    model_optim_step: u64,
    policy_optim_step: u64,
}

impl Counters {
    fn of(meta: &Meta) -> Self {
        Self {
            global_step: meta.global_step,
            world_size: meta.world_size,
            episodes: meta.episodes,
            elapsed: meta.elapsed,
            pretrain_updates: meta.pretrain_updates,
            model_optim_step: meta.model_optim_step,
            policy_optim_step: meta.policy_optim_step,
        }
    }

    /// `status` then the counters, as float64 (exact for counts below 2^53).
    fn header(&self, status: f64) -> [f64; 8] {
        [
            status,
            self.global_step as f64,
            self.world_size as f64,
            self.episodes as f64,
            self.elapsed,
            self.pretrain_updates as f64,
            self.model_optim_step as f64,
            self.policy_optim_step as f64,
        ]
    }

    fn from_header(header: &[f64]) -> Self {
        let n = |i: usize| header.get(i).copied().unwrap_or(0.0);
        Self {
            global_step: n(1) as u64,
            world_size: n(2) as usize,
            episodes: n(3) as u64,
            elapsed: n(4),
            pretrain_updates: n(5) as u64,
            model_optim_step: n(6) as u64,
            policy_optim_step: n(7) as u64,
        }
    }
}

/// Rank 0's part of [`resume`]: finds, verifies and loads the checkpoint into `agent`.
fn load_on_root(config: &Config, run_dir: &Path, learner: &mut Learner) -> Result<Option<Meta>> {
    let Some(dir) = resume_source(config, run_dir)? else {
        return Ok(None);
    };
    let meta = read_meta(&dir)?;
    if meta.task != config.task {
        return Err(Error::Config(format!(
            "resume: the checkpoint was trained on task={}, this run has task={}",
            meta.task, config.task
        )));
    }
    if meta.format < FORMAT {
        eprintln!(
            "warning: {} was written by an older tdmpc2 (float checksums, no file hashes): \
             resuming from it without verifying what it loads",
            dir.display()
        );
    }
    if meta.format == FORMAT {
        verify_files(&dir, &meta, &[MODEL, STATE])?;
    }
    learner.model_mut().load(&dir.join(MODEL))?;
    let device = learner.model().device();
    let tensors = Tensor::read_safetensors(dir.join(STATE))?;
    let get = |name: &str| -> Result<Tensor> {
        tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.to_device(device))
            .ok_or_else(|| Error::Checkpoint(format!("{}: {STATE} lacks '{name}'", dir.display())))
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
    let updater = learner.updater_mut();
    updater.model_optim.load_state(&model_state)?;
    updater.policy_optim.load_state(&policy_state)?;
    updater.scale.set(&scale);
    if meta.format == FORMAT {
        let differing: Vec<&str> = integrity::learner_parts(learner)
            .into_iter()
            .filter(|(name, crc)| meta.learner_parts.get(*name) != Some(crc))
            .map(|(name, _)| name)
            .collect();
        if !differing.is_empty() {
            return Err(Error::Checkpoint(format!(
                "resume: {}: its files are intact, but the learner state does not load back to \
                 what was saved ({} differ{}); this tdmpc2 reads the checkpoint differently \
                 from the one that wrote it",
                dir.display(),
                differing.join(", "),
                if differing.len() == 1 { "s" } else { "" }
            )));
        }
    }
    eprintln!("Resumed from {} (step {})", dir.display(), meta.global_step);
    Ok(Some(meta))
}

/// Makes every rank's learner state rank 0's: parameters, target Qs, Adam moments and step
/// counts, the Q scale.
fn share_learner_state(
    learner: &mut Learner,
    group: &ProcessGroup,
    model_step: u64,
    policy_step: u64,
) -> Result<()> {
    let model = learner.model();
    let updater = learner.updater();
    let (m, p) = (updater.model_optim.state(), updater.policy_optim.state());
    for tensor in [
        &model.model_params.flat,
        &model.policy_params.flat,
        &model.target_params.flat,
        &m.exp_avg,
        &m.exp_avg_sq,
        &p.exp_avg,
        &p.exp_avg_sq,
        updater.scale.value(),
    ] {
        // A shallow clone shares the storage: the broadcast lands in the learner's own tensor.
        group.broadcast_from_root(&mut tensor.shallow_clone())?;
    }
    let updater = learner.updater_mut();
    updater.model_optim.load_state(&AdamState {
        step: model_step,
        ..m
    })?;
    updater.policy_optim.load_state(&AdamState {
        step: policy_step,
        ..p
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Source;
    use crate::ddp::RankInfo;
    use tch::{Device, Kind};

    fn config(run_dir: &Path) -> Config {
        let overrides = [
            "model_size=1",
            "obs_shape=[5]",
            "action_dim=2",
            "discount=0.99",
            "num_threads=1",
        ];
        let mut overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        overrides.push(format!("run_dir={}", run_dir.display()));
        Config::load(&Source {
            overrides,
            ..Source::default()
        })
        .unwrap()
    }

    /// A learner whose every part holds distinct values (moments and scale included).
    fn learner<'g>(config: &Config, seed: u64, group: &'g ProcessGroup) -> Learner<'g> {
        let config = Config {
            seed,
            ..config.clone()
        };
        let mut learner = Learner::new(&config, 100, Device::Cpu, group).unwrap();
        tch::manual_seed(seed as i64);
        let updater = learner.updater_mut();
        for (optim, steps) in [
            (&mut updater.model_optim, 7),
            (&mut updater.policy_optim, 5),
        ] {
            let shape = optim.state().exp_avg;
            let state = AdamState {
                step: steps,
                exp_avg: shape.randn_like(),
                exp_avg_sq: shape.rand_like(),
            };
            optim.load_state(&state).unwrap();
        }
        updater
            .scale
            .set(&Tensor::from_slice(&[3.25f32]).to_kind(Kind::Float));
        learner
    }

    #[test]
    fn counters_cross_the_group_unchanged() {
        let counters = Counters {
            global_step: 123_456_789,
            world_size: 8,
            episodes: 4321,
            elapsed: 3600.25,
            pretrain_updates: 17,
            model_optim_step: 99_999,
            policy_optim_step: 99_998,
        };
        let header = counters.header(1.0);
        assert_eq!(header[0], 1.0);
        assert_eq!(Counters::from_header(&header), counters);
    }

    #[test]
    fn the_learner_checksum_ignores_the_thread_count() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let group = ProcessGroup::alone(RankInfo::single(&config));
        let agent = learner(&config, 3, &group);
        let threads = tch::get_num_threads();
        tch::set_num_threads(1);
        let one = integrity::learner_parts(&agent);
        tch::set_num_threads(2);
        let two = integrity::learner_parts(&agent);
        tch::set_num_threads(threads);
        assert_eq!(one, two);
        assert!(
            agent.model().model_params.flat.numel() > 100_000,
            "large enough for a parallel reduction"
        );
    }

    /// Resumes a fresh agent from `dir`; on success its learner state must hash to `expected`.
    fn resume_into(
        config: &Config,
        dir: &Path,
        expected: &[(&str, u32)],
    ) -> Result<Option<TrainState>> {
        let mut config = config.clone();
        config.resume = Some(dir.display().to_string());
        let group = ProcessGroup::alone(RankInfo::single(&config));
        let mut fresh = learner(&config, 11, &group);
        let resumed = resume(&config, dir, &mut fresh, &group)?;
        assert_eq!(integrity::learner_parts(&fresh), expected);
        Ok(resumed)
    }

    fn rewrite_meta(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
        let path = dir.join(META);
        let mut meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        edit(&mut meta);
        std::fs::write(&path, serde_json::to_vec(&meta).unwrap()).unwrap();
    }

    #[test]
    fn a_saved_state_loads_back_and_damage_is_named() {
        let run = tempfile::tempdir().unwrap();
        let config = config(run.path());
        let group = ProcessGroup::alone(RankInfo::single(&config));
        let saved = learner(&config, 3, &group);
        let state = TrainState {
            step: 40,
            pretrain_updates: 9,
            ..TrainState::default()
        };
        tch::set_num_threads(1);
        let expected = integrity::learner_parts(&saved);
        save(&config, run.path(), &state, &saved, &group).unwrap();
        let dir = store::latest(&checkpoints_dir(run.path())).unwrap().1;

        // The same parts hash the same after a round trip through the files, at any threads.
        tch::set_num_threads(2);
        let resumed = resume_into(&config, &dir, &expected).unwrap().unwrap();
        assert_eq!((resumed.step, resumed.pretrain_updates), (40, 9));
        verify_model(&dir.join(MODEL)).unwrap();
        // Any file of the checkpoint names its weights.
        assert_eq!(model_file(&dir.join(STATE)).unwrap(), dir.join(MODEL));
        assert_eq!(model_file(&dir.join(META)).unwrap(), dir.join(MODEL));
        assert_eq!(model_file(run.path()).unwrap(), dir.join(MODEL));

        // Intact files that do not load back: the message names the part, not damage.
        let original = std::fs::read(dir.join(META)).unwrap();
        rewrite_meta(&dir, |m| m["learner_parts"]["scale"] = 1.into());
        let err = resume_into(&config, &dir, &expected)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("scale differs") && !err.contains("damaged"),
            "{err}"
        );

        // An older checkpoint (float checksums, no hashes) loads with a warning.
        rewrite_meta(&dir, |m| {
            m.as_object_mut().unwrap().remove("format");
            m.as_object_mut().unwrap().remove("files");
            m["rank_checksums"] = serde_json::json!([15656.840652986819]);
        });
        assert!(resume_into(&config, &dir, &expected).unwrap().is_some());
        verify_model(&dir.join(MODEL)).unwrap();
        std::fs::write(dir.join(META), &original).unwrap();

        // Flipped bytes in the middle of the weights: the file is named as damaged.
        let model = dir.join(MODEL);
        let mut bytes = std::fs::read(&model).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        std::fs::write(&model, &bytes).unwrap();
        for err in [
            verify_model(&model).unwrap_err().to_string(),
            resume_into(&config, &dir, &expected)
                .unwrap_err()
                .to_string(),
        ] {
            assert!(
                err.contains(&model.display().to_string()) && err.contains("damaged"),
                "{err}"
            );
        }
    }
}
