//! `tdmpc2 bench --cases dataset`: what offline training's batches cost when read from the
//! dataset files on disk (ours), against the official loader, which holds every file in memory
//! (`torch.load` of each chunk). Both in this process, one after the other.
use std::path::Path;
use std::time::Instant;

use rand::SeedableRng;
use rand_pcg::Pcg64;
use serde_json::{json, Value};

use crate::buffer::Episode;
use crate::dataset::{ChunkWriter, Dataset, Expected, ExpectedTask};
use crate::error::{Error, Result};

/// mt30-like episodes: 500 steps of walker-run's sizes.
const STEPS: usize = 500;
const OBS_DIM: usize = 24;
const ACTION_DIM: usize = 6;
const EPISODES_PER_FILE: usize = 100;
const BATCH_SIZE: usize = 256;
const BATCHES: usize = 500;

/// Writes the dataset under the temporary directory, measures, and removes it, also when
/// stopped (Ctrl-C or SIGTERM, seen between episodes written and batches read).
pub fn run(megabytes: usize, print: &mut dyn FnMut(&Value)) -> Result<()> {
    refuse_what_does_not_fit(megabytes)?;
    let _handlers = crate::trainer::stop::install_handlers_for_now();
    let dir = super::scratch::Scratch::new("dataset")?;
    measure(dir.path(), megabytes, print)
}

/// A dataset larger than the temporary directory's disk can hold, or than memory (the
/// official loader holds all of it), is refused before anything is written.
pub(super) fn refuse_what_does_not_fit(megabytes: usize) -> Result<()> {
    let bytes = megabytes as f64 * 1e6;
    let room = [
        crate::checkpoint::disk::free_bytes(&std::env::temp_dir())
            .ok()
            .map(|(at, free)| (free as f64, format!("{} has", at.display()))),
        crate::memory::available_bytes().ok().map(|free| {
            (
                free,
                "memory (the official loader holds the dataset) has".into(),
            )
        }),
    ];
    match room.into_iter().flatten().find(|(free, _)| bytes > *free) {
        Some((free, what)) => Err(Error::Config(format!(
            "--dataset-mb {megabytes}: {what} {:.0} MB free; give at most that",
            free / 1e6
        ))),
        None => Ok(()),
    }
}

fn stopped() -> Result<()> {
    match crate::trainer::stop::requested_here() {
        true => Err(Error::Stopped(
            "bench stopped (Ctrl-C or SIGTERM); its dataset was removed".into(),
        )),
        false => Ok(()),
    }
}

fn measure(dir: &Path, megabytes: usize, print: &mut dyn FnMut(&Value)) -> Result<()> {
    let rows = STEPS + 1;
    let episode_bytes = rows * (OBS_DIM + ACTION_DIM + 1) * 4 + rows * 8;
    let episodes = (megabytes * 1_000_000).div_ceil(episode_bytes).max(1);
    let started = Instant::now();
    let mut writer = ChunkWriter::new(dir, EPISODES_PER_FILE, OBS_DIM, vec![ACTION_DIM])?;
    for e in 0..episodes {
        stopped()?;
        let value = |i: usize| ((e * 7919 + i) % 1009) as f32 / 1009.0;
        writer.add(Episode {
            obs: (0..rows * OBS_DIM).map(value).collect::<Vec<f32>>().into(),
            action: (0..STEPS * ACTION_DIM).map(value).collect(),
            reward: (0..STEPS).map(value).collect(),
            terminated: vec![0.0; STEPS],
            task: Some(0),
        })?;
    }
    let files = writer.finish()?;
    let write_s = started.elapsed().as_secs_f64();
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();

    let before = crate::memory::resident_bytes()?;
    let expected = Expected {
        obs_dim: OBS_DIM,
        action_dim: ACTION_DIM,
        tasks: vec![ExpectedTask {
            name: "bench".into(),
            obs_dim: OBS_DIM,
        }],
        multitask: true,
        slice: 4,
    };
    let data = Dataset::open(&files, &expected)?;
    stopped()?;
    let mut rng = Pcg64::seed_from_u64(1);
    let sampling = Instant::now();
    for _ in 0..BATCHES {
        stopped()?;
        data.sample(BATCH_SIZE, &mut rng)?;
    }
    let sample_ms = sampling.elapsed().as_secs_f64() * 1e3 / BATCHES as f64;
    let ours = crate::memory::resident_bytes()? - before;
    drop(data);

    let official = official_loader_memory(&files)?;
    stopped()?;
    print(&json!({
        "case": "dataset",
        "dataset_bytes": bytes, "files": files.len(), "episodes": episodes,
        "write_s": write_s,
        "batches": BATCHES, "batch_size": BATCH_SIZE,
        "sample_ms_per_batch": sample_ms,
        "rss_added_bytes": ours,
        "rss_added_fraction_of_dataset": ours / bytes as f64,
        "baseline": "official loader (torch.load of every file, held in memory)",
        "baseline_rss_added_bytes": official,
        "baseline_rss_added_fraction_of_dataset": official / bytes as f64,
    }));
    Ok(())
}

/// Resident memory the official way of loading adds: every file `torch.load`ed and kept.
fn official_loader_memory(files: &[std::path::PathBuf]) -> Result<f64> {
    let paths: Vec<String> = files
        .iter()
        .map(|f| f.to_string_lossy().into_owned())
        .collect();
    embedded_python::attach_exclusive(|py| {
        use pyo3::prelude::*;
        let failed = |e: PyErr| Error::Other(format!("official loader: {e}"));
        let torch = py.import("torch").map_err(failed)?;
        // Imported before measuring: the loader needs it, and its import is not data.
        py.import("tensordict").map_err(failed)?;
        let before = crate::memory::resident_bytes()?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("weights_only", false).map_err(failed)?;
        let mut held = Vec::new();
        for path in &paths {
            held.push(
                torch
                    .call_method("load", (path,), Some(&kwargs))
                    .map_err(failed)?,
            );
        }
        let added = crate::memory::resident_bytes()? - before;
        drop(held);
        Ok(added)
    })
}
