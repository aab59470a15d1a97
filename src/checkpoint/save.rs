//! Writing a checkpoint: every rank checks that its learner state is finite and equal to every
//! other rank's; rank 0 writes the model, the optimiser state and the counters.
use std::collections::BTreeMap;

use tch::Tensor;

use super::{
    buffers_dir, checkpoints_dir, integrity, rank_rows, store, write_json, CheckpointSettings,
    Meta, TrainState, CARRIED_TASK_GRAD, FORMAT, META, MODEL, STATE, WARM_START,
};
use crate::agent::AdamState;
use crate::ddp::ProcessGroup;
use crate::error::{Error, Result};
use crate::learner::Learner;

/// Writes a checkpoint at the current step (every rank calls this at the same point), returns
/// on every rank once it is written, then, with `keep_checkpoints`, removes the older ones
/// beyond it.
pub fn save(
    settings: &CheckpointSettings,
    state: &TrainState,
    learner: &Learner,
    group: &ProcessGroup,
) -> Result<()> {
    let global_step = write(settings, state, learner, group)?;
    // Every rank has written its part, rank 0 the checkpoint (a CPU collective: gloo, also
    // beside NCCL). No rank leaves before: under `srun --kill-on-bad-exit` or torchrun, the
    // first rank to exit (a stop's exit 3) ends the others, rank 0's write with them.
    group.all_reduce_sum(&mut Tensor::from_slice(&[1.0f32]))?;
    if settings.keep == 0 {
        return Ok(());
    }
    // A checkpoint or buffer that could not be removed costs disk space, not the run.
    let warn = |e: Error| errln!("warning: keep_checkpoints={}: {e}", settings.keep);
    let kept = match group.rank() {
        0 => store::prune(
            &checkpoints_dir(&settings.run_dir),
            global_step,
            settings.keep,
        )
        .map_err(warn)
        .ok(),
        _ => None,
    };
    // Each rank keeps the buffers of the checkpoints rank 0 kept, and no other: a buffer left
    // at a step without a checkpoint must not push out a kept checkpoint's. When rank 0 could
    // not prune, the buffers stay as they are.
    if let Some(kept) = share_kept_steps(kept.as_deref(), group)? {
        let buffers = buffers_dir(&settings.run_dir, group.rank());
        if let Err(e) = store::prune_to(&buffers, global_step, &kept) {
            warn(e);
        }
        // Ranks of a larger world this run resumed from have no rank to prune theirs.
        if group.rank() == 0 {
            for departed in departed_ranks_buffers(&settings.run_dir, group.world_size()) {
                if let Err(e) = store::prune_to(&departed, global_step, &kept) {
                    warn(e);
                }
            }
        }
    }
    Ok(())
}

/// The buffer directories of ranks `world_size` and above (saved by a larger world).
fn departed_ranks_buffers(run_dir: &std::path::Path, world_size: usize) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(run_dir.join("buffers")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            let name = entry.file_name();
            let rank = name
                .to_str()
                .and_then(|n| n.strip_prefix("rank")?.parse::<usize>().ok());
            rank.is_some_and(|rank| rank >= world_size)
        })
        .map(|entry| entry.path())
        .collect()
}

/// Rank 0's `kept` steps on every rank; `None` when rank 0 has none to give (it could not
/// prune). Their count goes first, so that only they cross.
fn share_kept_steps(kept: Option<&[u64]>, group: &ProcessGroup) -> Result<Option<Vec<u64>>> {
    let count = kept.map_or(-1, |k| k.len() as i64);
    let mut shared = Tensor::from_slice(&[count]);
    group.broadcast_from_root(&mut shared)?;
    let count = shared.int64_value(&[0]);
    if count < 0 {
        return Ok(None);
    }
    let steps: Vec<i64> = match kept {
        Some(kept) => kept.iter().map(|&s| s as i64).collect(),
        None => vec![0; count as usize],
    };
    if steps.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let mut shared = Tensor::from_slice(&steps);
    group.broadcast_from_root(&mut shared)?;
    Ok(Some(
        Vec::<i64>::try_from(shared)?
            .into_iter()
            .map(|s| s as u64)
            .collect(),
    ))
}

/// Writes this rank's part of the checkpoint; returns its global step.
fn write(
    settings: &CheckpointSettings,
    state: &TrainState,
    learner: &Learner,
    group: &ProcessGroup,
) -> Result<u64> {
    let global_step = settings.global_step(state.step, group.world_size());
    // Never a checkpoint of a diverged state: the last one written stays the last good one.
    crate::learner::finite::check_parameters(learner, global_step)?;
    let (parts, checksums) = rank_checksums(learner, group)?;
    let env_episodes = gather_env_episodes(&state.env_episodes, group)?;
    let warm_starts = gather_warm_starts(&state.warm_start, group)?;
    let buffer_hashes = match settings.save_buffer {
        true => write_buffer(settings, learner, group, global_step)?,
        false => Vec::new(),
    };
    if group.rank() != 0 {
        return Ok(global_step);
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
        episodes: state.finished(),
        elapsed: state.elapsed,
        task: settings.task.clone(),
        rank_checksums: checksums,
        learner_parts: parts.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
        files: BTreeMap::new(),
        model_optim_step: model_state.step,
        policy_optim_step: policy_state.step,
        pretrain_updates: state.pretrain_updates,
        eval_due: state.eval_due,
        save_due: state.save_due,
        env_episodes,
        offline: Some(settings.counts_updates),
        buffer_hashes: Some(buffer_hashes),
        batches_read: state.batches_read,
    };
    let mut tensors = optim("model_optim", model_state);
    tensors.extend(optim("policy_optim", policy_state));
    if let Some(carried) = learner.updater().carried_task_grad(learner.model()) {
        tensors.push((CARRIED_TASK_GRAD.into(), carried.copy()));
    }
    tensors.push((
        "scale".into(),
        learner.updater().scale.value().to_device(tch::Device::Cpu),
    ));
    if let Some(warm_starts) = warm_starts {
        tensors.push((WARM_START.into(), warm_starts));
    }
    let tensors: Vec<(String, Tensor)> = tensors
        .into_iter()
        .map(|(n, t)| (n, t.to_device(tch::Device::Cpu)))
        .collect();
    store::save(&checkpoints_dir(&settings.run_dir), global_step, |dir| {
        Tensor::write_safetensors(&learner.model().named_tensors(), dir.join(MODEL))?;
        Tensor::write_safetensors(&tensors, dir.join(STATE))?;
        for name in [MODEL, STATE] {
            meta.files
                .insert(name.into(), integrity::file_crc(&dir.join(name))?);
        }
        write_json(&dir.join(META), &meta)
    })?;
    Ok(global_step)
}

/// Writes this rank's replay buffer, and returns once every rank has written its own, with
/// every rank's hash of it: the checkpoint that needs them appears only then, so a job killed
/// in between resumes the previous checkpoint, whose buffers are all there. A rank that failed
/// fails them all.
fn write_buffer(
    settings: &CheckpointSettings,
    learner: &Learner,
    group: &ProcessGroup,
    global_step: u64,
) -> Result<Vec<u32>> {
    let (tensors, meta) = learner.buffer().export();
    let mut hash = 0;
    let root = buffers_dir(&settings.run_dir, group.rank());
    let new_step = store::at(&root, global_step).is_none();
    let written = store::save(&root, global_step, |dir| {
        hash = super::buffers::write(dir, &tensors, &meta)?;
        Ok(())
    });
    let mut failed = Tensor::from_slice(&[f32::from(u8::from(written.is_err()))]);
    group.all_reduce_sum(&mut failed)?;
    let written = written?;
    match failed.double_value(&[0]) as u64 {
        0 => {
            let hashes = rank_rows::gather(&Tensor::from_slice(&[i64::from(hash)]), group)?;
            Ok(Vec::<i64>::try_from(hashes.reshape([-1]))?
                .into_iter()
                .map(|h| h as u32)
                .collect())
        }
        n => {
            // No checkpoint will need it: disk space a restart would miss.
            if new_step {
                let _ = std::fs::remove_dir_all(&written);
            }
            Err(Error::Checkpoint(format!(
                "step {global_step}: {n} other rank(s) could not write their replay buffer (see \
                 their errors); no checkpoint written"
            )))
        }
    }
}

/// Every rank's episodes started in each environment (all ranks have as many).
fn gather_env_episodes(local: &[u64], group: &ProcessGroup) -> Result<Vec<Vec<u64>>> {
    if local.is_empty() {
        return Ok(Vec::new());
    }
    let local: Vec<i64> = local.iter().map(|&n| n as i64).collect();
    let rows = Vec::<Vec<i64>>::try_from(rank_rows::gather(&Tensor::from_slice(&local), group)?)?;
    Ok(rows
        .into_iter()
        .map(|row| row.into_iter().map(|n| n as u64).collect())
        .collect())
}

/// Every rank's planner warm start, (world size, values per rank); `None` where the run does
/// not plan online (all ranks have as many).
fn gather_warm_starts(local: &[f32], group: &ProcessGroup) -> Result<Option<Tensor>> {
    if local.is_empty() {
        return Ok(None);
    }
    rank_rows::gather(&Tensor::from_slice(local), group).map(Some)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffers_of_ranks_beyond_the_world_are_found() {
        let run = tempfile::tempdir().unwrap();
        let buffers = run.path().join("buffers");
        for name in ["rank0", "rank1", "rank2", "rank10"] {
            std::fs::create_dir_all(buffers.join(name)).unwrap();
        }
        std::fs::write(buffers.join("rankx"), b"").unwrap();
        let mut found = departed_ranks_buffers(run.path(), 2);
        found.sort();
        assert_eq!(found, [buffers.join("rank10"), buffers.join("rank2")]);
        assert!(departed_ranks_buffers(run.path(), 11).is_empty());
    }
}
