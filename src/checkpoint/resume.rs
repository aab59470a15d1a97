//! Resuming: rank 0 finds, verifies and loads the checkpoint `resume` names and sends the learner
//! state to every other rank; each rank restores its share of the replay buffers when they were
//! saved.
use std::path::{Path, PathBuf};

use tch::{Kind, Tensor};

use super::buffers::SavedBuffers;
use super::{
    checkpoints_dir, integrity, rank_rows, read_meta, store, verify_files, CheckpointSettings,
    Meta, TrainState, CARRIED_TASK_GRAD, FORMAT, META, MODEL, STATE, WARM_START,
};
use crate::agent::AdamState;
use crate::buffer::Dealing;
use crate::ddp::ProcessGroup;
use crate::error::{Error, Result, BAD_INPUT_EXIT_CODE};
use crate::learner::Learner;

/// Whether a `resume` setting asks for a checkpoint (`auto` or a path), not a fresh run.
pub fn resumes(setting: Option<&str>) -> bool {
    !matches!(setting, None | Some("") | Some("none"))
}

/// The checkpoint `config`'s `resume` names (None: a fresh run, or `auto` with none yet), or
/// a path that names none refused: checked before a run makes its directory, so that a
/// mistyped path leaves nothing behind.
pub fn resume_source_of(config: &crate::config::Config) -> Result<Option<PathBuf>> {
    resume_source(&CheckpointSettings::from_config(config))
}

/// Refuses, from its `meta.json` alone, a checkpoint `resume` names that this run cannot
/// continue (another task, online against offline, past `steps`): a launcher checks it before
/// starting any rank.
pub fn check_resume_source(config: &crate::config::Config) -> Result<()> {
    let settings = CheckpointSettings::from_config(config);
    match resume_source(&settings)? {
        None => Ok(()),
        Some(dir) => check_continues(&read_meta(&dir)?, &settings, &dir),
    }
}

/// That the checkpoint in `dir` is whole and its model and train state are the bytes saved (its
/// replay buffers are checked as a resume reads them).
pub fn verify_checkpoint(dir: &Path) -> Result<()> {
    let meta = read_meta(dir)?;
    if meta.format == FORMAT {
        verify_files(dir, &meta, &[MODEL, STATE])?;
    }
    Ok(())
}

/// Whether the checkpoint `settings` resume from is the run directory's own of `global_step`,
/// not another run's of the same step: only its own makes a save of that step redundant.
pub fn resumes_own_checkpoint(settings: &CheckpointSettings, global_step: u64) -> bool {
    let canonical = |dir: PathBuf| dir.canonicalize().ok();
    let own = store::at(&checkpoints_dir(&settings.run_dir), global_step).and_then(canonical);
    let source = resume_source(settings).ok().flatten().and_then(canonical);
    own.is_some() && own == source
}

/// Which checkpoint `resume` names: `auto` is the run directory's latest, else a path to a
/// checkpoint directory.
fn resume_source(settings: &CheckpointSettings) -> Result<Option<PathBuf>> {
    let run_dir = &settings.run_dir;
    let Some(setting) = settings.resume.as_deref().filter(|s| resumes(Some(s))) else {
        return Ok(None);
    };
    match setting {
        "auto" => Ok(store::latest(&checkpoints_dir(run_dir)).map(|(_, dir)| dir)),
        path => {
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

/// Loads the learner state named by `resume` into `agent` (and this rank's share of the replay
/// buffers when they were saved); returns the counters to continue from, and the checkpoint's
/// global step.
///
/// Rank 0 alone reads and verifies the checkpoint; every other rank receives its state over the
/// process group, so ranks on other nodes need no copy of the run directory, and all ranks agree
/// on whether the run resumes (a restarted multi-node job re-forms from rank 0's checkpoint).
pub fn resume(
    settings: &CheckpointSettings,
    learner: &mut Learner,
    group: &ProcessGroup,
) -> Result<Option<(TrainState, u64)>> {
    let loaded = if group.rank() == 0 {
        load_on_root(settings, learner)
    } else {
        Ok(None)
    };
    // What rank 0 found: status (0 fresh, 1 resumed, 2 failed, 3 refused as bad input), then
    // the counters.
    let (status, counters) = match &loaded {
        Ok(None) => (0.0, Counters::default()),
        Ok(Some((meta, _))) => (1.0, Counters::of(meta)),
        Err(e) if e.exit_code() == BAD_INPUT_EXIT_CODE => (3.0, Counters::default()),
        Err(_) => (2.0, Counters::default()),
    };
    let mut header = Tensor::from_slice(&counters.header(status));
    group.broadcast_from_root(&mut header)?;
    let header = Vec::<f64>::try_from(header)?;
    let (meta, env_episodes, warm_starts, buffer_hashes) = match (loaded, header[0] as u8) {
        (Err(e), _) => return Err(e),
        (_, 2) => {
            return Err(Error::Checkpoint(
                "resume: rank 0 could not load the checkpoint (see its error)".into(),
            ))
        }
        // Exit 2 on every rank, so that a launcher restarts no refusal.
        (_, 3) => {
            return Err(Error::Config(
                "resume: rank 0 refused the checkpoint for these settings (see its error)".into(),
            ))
        }
        (_, 0) => return Ok(None),
        (Ok(Some((meta, warm_starts))), _) => (
            Counters::of(&meta),
            meta.env_episodes,
            warm_starts,
            meta.buffer_hashes,
        ),
        (Ok(None), _) => (Counters::from_header(&header), Vec::new(), None, None),
    };
    let env_episodes = share_env_episodes(&env_episodes, settings.num_envs, group)?;
    let warm_start = share_warm_start(warm_starts.as_ref(), settings.warm_start_len, group)?;
    share_learner_state(
        learner,
        group,
        meta.model_optim_step,
        meta.policy_optim_step,
    )?;

    // An offline run has no replay buffer: its batches come from the dataset files.
    if !settings.counts_updates {
        let buffer_hashes = share_buffer_hashes(buffer_hashes.as_deref(), meta.world_size, group)?;
        restore_buffer(settings, learner, group, &meta, buffer_hashes)?;
    }
    // A checkpoint that does not say how many each environment started (an older one, or
    // another world size) continues from the counters' (the most any saved rank started).
    let episodes = match env_episodes.is_empty() {
        true => meta.episodes,
        false => env_episodes.iter().sum(),
    };
    let state = TrainState {
        step: settings.local_step(meta.global_step, group.world_size()),
        episodes,
        // The run's end or a stop saves its checkpoint with episodes started that it never
        // finishes: their seeds are spent, but rank 0 logs the finished ones it saved.
        cut: match group.rank() {
            0 => episodes.saturating_sub(meta.finished),
            _ => 0,
        },
        elapsed: meta.elapsed,
        pretrain_updates: meta.pretrain_updates,
        eval_due: meta.eval_due,
        save_due: meta.save_due,
        env_episodes,
        warm_start,
        batches_read: meta.batches_read,
    };
    Ok(Some((state, meta.global_step)))
}

/// Restores this rank's share of the replay buffers saved with the checkpoint. They live beside
/// the run that wrote it (<run>/checkpoints/step_N), or, on a rank that cannot see it, in its
/// own run directory.
fn restore_buffer(
    settings: &CheckpointSettings,
    learner: &mut Learner,
    group: &ProcessGroup,
    meta: &Counters,
    hashes: Option<Vec<u32>>,
) -> Result<()> {
    let source_run = resume_source(settings)
        .ok()
        .flatten()
        .and_then(|dir| dir.parent().and_then(Path::parent).map(Path::to_path_buf))
        .unwrap_or_else(|| settings.run_dir.clone());
    let saved = SavedBuffers {
        source_run: &source_run,
        run_dir: &settings.run_dir,
        step: meta.global_step,
        dealing: Dealing {
            from: meta.world_size,
            to: group.world_size(),
        },
        hashes,
    };
    saved.restore(learner.buffer_mut(), group)
}

/// The hashes of the `saved_ranks` replay buffers saved with the checkpoint, sent by rank 0
/// (which alone read it): empty when it saved none, `None` when it did not record them.
fn share_buffer_hashes(
    saved: Option<&[u32]>,
    saved_ranks: usize,
    group: &ProcessGroup,
) -> Result<Option<Vec<u32>>> {
    // What the checkpoint says (0: nothing, 1: no buffers, 2: the hashes), then the hashes.
    let mut values = vec![0i64; saved_ranks + 1];
    match saved {
        Some([]) => values[0] = 1,
        Some(hashes) if hashes.len() == saved_ranks => {
            values[0] = 2;
            for (value, &hash) in values[1..].iter_mut().zip(hashes) {
                *value = i64::from(hash);
            }
        }
        _ => {}
    }
    let mut shared = Tensor::from_slice(&values);
    group.broadcast_from_root(&mut shared)?;
    let values = Vec::<i64>::try_from(shared)?;
    Ok(match values[0] {
        1 => Some(Vec::new()),
        2 => Some(values[1..].iter().map(|&h| h as u32).collect()),
        _ => None,
    })
}

/// This rank's planner warm start of `len` values, sent by rank 0 from the checkpoint's `saved`
/// (world size, values per rank); empty when the checkpoint has none of that shape (an older
/// checkpoint, another world size or number of environments).
fn share_warm_start(saved: Option<&Tensor>, len: usize, group: &ProcessGroup) -> Result<Vec<f32>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    match rank_rows::share(saved, len, Kind::Float, group)? {
        Some(row) => Ok(Vec::<f32>::try_from(&row)?),
        None => Ok(Vec::new()),
    }
}

/// This rank's row of the checkpoint's episodes per environment, sent by rank 0 (which alone
/// read it); empty when the checkpoint has no row of `num_envs` for every rank.
fn share_env_episodes(
    saved: &[Vec<u64>],
    num_envs: usize,
    group: &ProcessGroup,
) -> Result<Vec<u64>> {
    let rows = match saved.iter().all(|row| row.len() == num_envs) && !saved.is_empty() {
        true => {
            let flat: Vec<i64> = saved.iter().flatten().map(|&n| n as i64).collect();
            Some(Tensor::from_slice(&flat).view([saved.len() as i64, num_envs as i64]))
        }
        false => None,
    };
    match rank_rows::share(rows.as_ref(), num_envs, Kind::Int64, group)? {
        Some(row) => Ok(Vec::<i64>::try_from(&row)?
            .into_iter()
            .map(|n| n as u64)
            .collect()),
        None => Ok(Vec::new()),
    }
}

/// The counters a resumed run continues from, as rank 0 sends them to the others.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Counters {
    global_step: u64,
    world_size: usize,
    /// Where the episode seeds go on: the most episodes any saved rank started.
    episodes: u64,
    /// The episodes rank 0 finished (what the run logged).
    finished: u64,
    elapsed: f64,
    pretrain_updates: u64,
    model_optim_step: u64,
    policy_optim_step: u64,
    eval_due: bool,
    save_due: bool,
    batches_read: Option<u64>,
}

impl Counters {
    fn of(meta: &Meta) -> Self {
        // Ranks that cannot take their own counts (another world size or num_envs) go on from
        // the most episodes any saved rank started: episode seeds count episodes per rank, and
        // rank 0's count would have the others draw seeds they drew before.
        let most_started = meta
            .env_episodes
            .iter()
            .map(|row| row.iter().sum::<u64>())
            .max();
        Self {
            global_step: meta.global_step,
            world_size: meta.world_size,
            episodes: most_started.unwrap_or(0).max(meta.episodes),
            finished: meta.episodes,
            elapsed: meta.elapsed,
            pretrain_updates: meta.pretrain_updates,
            model_optim_step: meta.model_optim_step,
            policy_optim_step: meta.policy_optim_step,
            eval_due: meta.eval_due,
            save_due: meta.save_due,
            batches_read: meta.batches_read,
        }
    }

    /// `status` then the counters, as float64 (exact for counts below 2^53).
    fn header(&self, status: f64) -> [f64; 12] {
        [
            status,
            self.global_step as f64,
            self.world_size as f64,
            self.episodes as f64,
            self.elapsed,
            self.pretrain_updates as f64,
            self.model_optim_step as f64,
            self.policy_optim_step as f64,
            f64::from(u8::from(self.eval_due)),
            self.batches_read.map_or(-1.0, |n| n as f64),
            f64::from(u8::from(self.save_due)),
            self.finished as f64,
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
            eval_due: n(8) == 1.0,
            batches_read: Some(n(9)).filter(|&n| n >= 0.0).map(|n| n as u64),
            save_due: n(10) == 1.0,
            finished: n(11) as u64,
        }
    }
}

/// Whether the checkpoint `meta` (in `dir`) is one this run continues: of its task, trained
/// as this run trains (online or on a dataset: their steps count different things), not past
/// its steps (it would be saved again as step `steps`, holding the later learner), and of a
/// format that can be verified (else a warning).
fn check_continues(meta: &Meta, settings: &CheckpointSettings, dir: &Path) -> Result<()> {
    if meta.task != settings.task {
        return Err(Error::Config(format!(
            "resume: the checkpoint was trained on task={}, this run has task={}",
            meta.task, settings.task
        )));
    }
    if let Some(offline) = meta.offline.filter(|&o| o != settings.counts_updates) {
        let [was, is] = match offline {
            true => [
                "an offline run's (on data_dir; steps count updates)",
                "online",
            ],
            false => [
                "an online run's (steps count agent steps)",
                "offline (on data_dir)",
            ],
        };
        return Err(Error::Config(format!(
            "resume: {} is {was}, and this run trains {is}; resume it as it was trained, or \
             start a new run in another run_dir",
            dir.display()
        )));
    }
    if meta.global_step > settings.steps {
        return Err(Error::Config(format!(
            "resume: {} is at step {}, past this run's steps={}; give steps >= {} to continue \
             it",
            dir.display(),
            meta.global_step,
            settings.steps,
            meta.global_step
        )));
    }
    if meta.format < FORMAT {
        errln!(
            "warning: {} was written by an older tdmpc2 (float checksums, no file hashes): \
             resuming from it without verifying what it loads",
            dir.display()
        );
    }
    Ok(())
}

/// The checkpoint's model into `model`; one that does not fit names the settings that build
/// the model and where the trained run's are.
fn load_model(model: &mut crate::agent::WorldModel, dir: &Path) -> Result<()> {
    let config =
        dir.parent()
            .and_then(Path::parent)
            .map_or("its run's config.yaml".into(), |run| {
                run.join(crate::config::RUN_CONFIG_FILE)
                    .display()
                    .to_string()
            });
    model.load(&dir.join(MODEL)).map_err(|e| match e {
        crate::agent::Error::Mismatch { .. } => Error::Config(format!(
            "{e}. The model is built from this run's settings: resume with those the \
             checkpoint was trained with (model_size, or the dimensions it sets), as in \
             {config}"
        )),
        other => other.into(),
    })
}

/// Whether the model of the checkpoint in `dir` fits the one `config` (resolved) builds, as a
/// resume would find it (`doctor`'s check): the model is built on the CPU and loaded.
pub fn check_model_fits(config: &crate::config::Config, dir: &Path) -> Result<()> {
    let agent = crate::agent::AgentConfig::from_config(config)?;
    let mut model = crate::agent::WorldModel::new(&agent, tch::Device::Cpu)?;
    load_model(&mut model, dir)
}

/// Rank 0's part of [`resume`]: finds, verifies and loads the checkpoint into `agent`; returns
/// its counters and every rank's planner warm start, where it has them.
fn load_on_root(
    settings: &CheckpointSettings,
    learner: &mut Learner,
) -> Result<Option<(Meta, Option<Tensor>)>> {
    let Some(dir) = resume_source(settings)? else {
        return Ok(None);
    };
    let meta = read_meta(&dir)?;
    check_continues(&meta, settings, &dir)?;
    if meta.format == FORMAT {
        verify_files(&dir, &meta, &[MODEL, STATE])?;
    }
    load_model(learner.model_mut(), &dir)?;
    let device = learner.model().device();
    let state_file = dir.join(STATE);
    std::fs::File::open(&state_file)
        .map_err(|e| Error::io(format!("read {}", state_file.display()), e))?;
    let tensors = Tensor::read_safetensors(&state_file).map_err(|e| {
        Error::Unreadable(format!(
            "{}: not a readable safetensors file (truncated, damaged, or another format): {e}",
            state_file.display()
        ))
    })?;
    let get = |name: &str| -> Result<Tensor> {
        tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.to_device(device))
            .ok_or_else(|| Error::Unreadable(format!("{}: {STATE} lacks '{name}'", dir.display())))
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
    if scale.numel() != 1 {
        return Err(Error::Checkpoint(format!(
            "{}: its scale has {} values, not one",
            dir.display(),
            scale.numel()
        )));
    }
    let warm_starts = tensors
        .iter()
        .find(|(n, _)| n == WARM_START)
        .map(|(_, t)| t.shallow_clone());
    if let Ok(carried) = get(CARRIED_TASK_GRAD) {
        learner.restore_carried_task_grad(&carried)?;
    }
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
    errln!("Resumed from {} (step {})", dir.display(), meta.global_step);
    Ok(Some((meta, warm_starts)))
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
    if let Some(carried) = learner.updater().carried_task_grad(learner.model()) {
        let mut carried = carried.copy();
        group.broadcast_from_root(&mut carried)?;
        learner.restore_carried_task_grad(&carried)?;
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

    #[test]
    fn counters_cross_the_group_unchanged() {
        let counters = Counters {
            global_step: 123_456_789,
            world_size: 8,
            episodes: 4321,
            finished: 4319,
            elapsed: 3600.25,
            pretrain_updates: 17,
            model_optim_step: 99_999,
            policy_optim_step: 99_998,
            eval_due: true,
            save_due: true,
            batches_read: Some(4_000_000),
        };
        let header = counters.header(1.0);
        assert_eq!(header[0], 1.0);
        assert_eq!(Counters::from_header(&header), counters);
        let unknown = Counters {
            batches_read: None,
            ..counters
        };
        assert_eq!(Counters::from_header(&unknown.header(1.0)), unknown);
    }

    /// At another world size every rank goes on from the most episodes a saved rank started.
    #[test]
    fn ranks_go_on_from_the_most_episodes_any_saved_rank_started() {
        let meta = |counts: &str| -> Meta {
            let json = format!(
                r#"{{"global_step": 100, "world_size": 2, "episodes": 7, "elapsed": 0,
                "task": "t", "model_optim_step": 1, "policy_optim_step": 1{counts}}}"#
            );
            serde_json::from_str(&json).unwrap()
        };
        let saved = meta(r#", "env_episodes": [[3, 4], [9, 1]]"#);
        assert_eq!(Counters::of(&saved).episodes, 10);
        assert_eq!(
            Counters::of(&saved).finished,
            7,
            "what rank 0 finished, logged"
        );
        assert_eq!(Counters::of(&meta("")).episodes, 7, "an older checkpoint's");
    }

    /// A checkpoint goes on only as it was trained: online or offline (on a dataset), which
    /// count steps differently; one that does not say (older) goes on either way.
    #[test]
    fn a_checkpoint_continues_only_as_it_was_trained() {
        let config = crate::config::Config::load(&crate::config::Source::default()).unwrap();
        let online = CheckpointSettings::from_config(&config);
        let offline = CheckpointSettings {
            counts_updates: true,
            ..online.clone()
        };
        let meta = |trained: &str| -> Meta {
            let json = format!(
                r#"{{"format": {FORMAT}, "global_step": 100, "world_size": 1, "episodes": 0,
                "elapsed": 0, "task": "{}", "model_optim_step": 1, "policy_optim_step": 1
                {trained}}}"#,
                config.task
            );
            serde_json::from_str(&json).unwrap()
        };
        let dir = Path::new("step_000000000100");
        for (trained, settings) in [
            (r#", "offline": true"#, &online),
            (r#", "offline": false"#, &offline),
        ] {
            let e = check_continues(&meta(trained), settings, dir)
                .unwrap_err()
                .to_string();
            assert!(e.contains("resume it as it was trained"), "{e}");
        }
        check_continues(&meta(r#", "offline": true"#), &offline, dir).unwrap();
        check_continues(&meta(r#", "offline": false"#), &online, dir).unwrap();
        check_continues(&meta(""), &online, dir).unwrap();
        check_continues(&meta(""), &offline, dir).unwrap();
    }

    /// A saved warm start of this world size and length comes back exactly; any other shape,
    /// or none, gives none (the run plans from zeros, as a fresh one).
    #[test]
    fn a_warm_start_resumes_only_where_its_shape_fits() {
        let config = crate::config::Config::load(&crate::config::Source::default()).unwrap();
        let group = ProcessGroup::alone(crate::ddp::RankInfo::single(&config));
        let values = [0.25f32, -1.0, 1e-7, 3.0, 0.0, -0.5];
        let saved = Tensor::from_slice(&values).view([1, 6]);
        assert_eq!(share_warm_start(Some(&saved), 6, &group).unwrap(), values);
        for other in [saved.view([2, 3]), saved.narrow(1, 0, 4)] {
            assert!(share_warm_start(Some(&other), 6, &group)
                .unwrap()
                .is_empty());
        }
        assert!(share_warm_start(None, 6, &group).unwrap().is_empty());
        assert!(share_warm_start(Some(&saved), 0, &group)
            .unwrap()
            .is_empty());
    }
}
