//! What a dataset file's episodes must be for an offline run: no early terminations, task
//! ids of the run's tasks, and, where the tasks' sizes differ, in the run's task order.
use std::fs::File;

use super::layout::{Field, Fields};
use super::ExpectedTask;

/// The official datasets hold no `terminated`; a file whose episodes end early would be
/// trained through its terminations (offline runs take none), so it is refused.
pub(super) fn refuse_early_terminations(
    file: &File,
    fields: &Fields,
) -> std::result::Result<(), String> {
    if !fields.has("terminated") {
        return Ok(());
    }
    let terminated = fields.scalar("terminated", &["float32", "bool"])?;
    match first_terminated(file, &terminated, fields.episodes, fields.length)? {
        None => Ok(()),
        Some(e) => Err(format!(
            "episode {e} terminates early (`terminated` is set after its first row): offline \
             training takes no terminations, and would bootstrap through it"
        )),
    }
}

/// Each episode's task id: `task`'s, or 0 for all in a single-task run's file without one.
pub(super) fn episode_tasks(
    file: &File,
    fields: &Fields,
    num_tasks: usize,
) -> std::result::Result<Vec<u32>, String> {
    match fields.has("task") {
        true => {
            let task = fields.scalar("task", &["int64", "int32"])?;
            read_tasks(file, &task, fields.episodes, num_tasks)
        }
        false if num_tasks == 1 => Ok(vec![0; fields.episodes]),
        false => Err(format!(
            "holds no `task`, and the run has {num_tasks} tasks"
        )),
    }
}

/// The first episode whose `terminated` is set (non-zero, not NaN) in a row after its first
/// (the first row's is a filler, NaN in the official online format).
pub(super) fn first_terminated(
    file: &File,
    terminated: &Field,
    episodes: usize,
    length: usize,
) -> std::result::Result<Option<usize>, String> {
    for e in 0..episodes {
        let bytes = terminated
            .read(file, e, 1, length - 1)
            .map_err(|err| err.to_string())?;
        let set = match terminated.item {
            4 => bytes.chunks_exact(4).any(|b| {
                let value = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                value != 0.0 && !value.is_nan()
            }),
            _ => bytes.iter().any(|&b| b != 0),
        };
        if set {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

/// A task's observations end where its own size does, the rest of each row the zero padding
/// (the official multitask wrapper's). A dataset whose task ids follow another order than the
/// run's task list would train every episode as another task's, without a word; where the
/// tasks' sizes differ, the first episode of each id in the file shows it.
pub(super) fn refuse_tasks_numbered_otherwise(
    file: &File,
    obs: &Field,
    length: usize,
    tasks: &[u32],
    expected: &[ExpectedTask],
) -> std::result::Result<(), String> {
    let mut checked = vec![false; expected.len()];
    for (e, &id) in tasks.iter().enumerate() {
        let task = &expected[id as usize];
        if std::mem::replace(&mut checked[id as usize], true) || task.obs_dim >= obs.width {
            continue;
        }
        let bytes = obs
            .read(file, e, 0, length)
            .map_err(|err| err.to_string())?;
        for (row, numbers) in bytes.chunks_exact(obs.width * obs.item).enumerate() {
            let padding = numbers[task.obs_dim * obs.item..]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            if let Some((k, value)) = padding.enumerate().find(|(_, v)| *v != 0.0) {
                return Err(format!(
                    "episode {e} has task id {id}, {}, whose observations have {} numbers (the \
                     rest of a row is zero padding), but its row {row} has {value} at number \
                     {}: the dataset's task ids follow another order than the run's task list \
                     (or another task set); list the tasks in the order the dataset was \
                     collected with",
                    task.name,
                    task.obs_dim,
                    task.obs_dim + k + 1
                ));
            }
        }
    }
    Ok(())
}

/// Each episode's task id (that of its first row), checked against the run's task count.
pub(super) fn read_tasks(
    file: &File,
    task: &Field,
    episodes: usize,
    num_tasks: usize,
) -> std::result::Result<Vec<u32>, String> {
    (0..episodes)
        .map(|e| {
            let bytes = task.read(file, e, 0, 1).map_err(|err| err.to_string())?;
            let id = match task.item {
                8 => i64::from_le_bytes(bytes[..8].try_into().unwrap_or_default()),
                _ => i64::from(i32::from_le_bytes(
                    bytes[..4].try_into().unwrap_or_default(),
                )),
            };
            match u32::try_from(id) {
                Ok(id) if (id as usize) < num_tasks => Ok(id),
                _ => Err(format!(
                    "episode {e} has task id {id}, but the run has {num_tasks} tasks (ids 0..{})",
                    num_tasks - 1
                )),
            }
        })
        .collect()
}
