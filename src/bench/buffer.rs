//! `tdmpc2 bench --cases buffer`: bytes a replay-buffer row takes and the memory a filled
//! buffer adds to the process, for state rows (walker-run), pixel rows (one frame a row, as
//! stored) and, as the baseline, pixel rows stored as whole float32 stacks; and the peak memory
//! that saving a buffer and reading it back add, torch's writer and reader (the baseline)
//! against ours, and restoring it into a ring: the file read whole, then copied in (the
//! baseline), against its rows read a slice at a time straight into the ring.
use serde_json::{json, Value};
use tch::{Device, Tensor};

use crate::buffer::{Episode, ObsLayout, ReplayBuffer, SavedPart, StoredObs};
use crate::checkpoint::tensor_file::{self, TensorFile};
use crate::error::Result;

/// Agent steps of the synthetic episodes the buffers are filled with (a DMControl episode).
const EPISODE_STEPS: usize = 500;
/// The buffer size the memory is projected to (the default buffer_size).
const MILLION: f64 = 1e6;

struct BufferCase {
    name: &'static str,
    layout: ObsLayout,
    action_dim: usize,
}

fn cases() -> [BufferCase; 3] {
    let frame = 3 * envs::FRAME_SIZE * envs::FRAME_SIZE;
    let stack = envs::FRAME_STACK;
    [
        BufferCase {
            name: "state (walker-run)",
            layout: ObsLayout::Vector { dim: 24 },
            action_dim: 6,
        },
        BufferCase {
            name: "pixels, one frame a row",
            layout: ObsLayout::Frames { frame, stack },
            action_dim: 1,
        },
        BufferCase {
            name: "pixels as float32 stacks (baseline)",
            layout: ObsLayout::Vector { dim: frame * stack },
            action_dim: 1,
        },
    ]
}

/// The peak memory saving `buffer` to a file, reading it back and restoring it into a ring of
/// the same size add, the baseline's way and ours (each from the memory resident before it; a
/// restore's figures include the ring's own pages, which it writes).
fn save_and_restore_peaks(case: &BufferCase, buffer: &ReplayBuffer) -> Result<[Value; 3]> {
    let dir = super::scratch::Scratch::new("buffer")?;
    let path = dir.path().join("buffer.safetensors");
    let peak_added = |work: &dyn Fn() -> Result<()>| -> Result<f64> {
        crate::memory::reset_peak()?;
        let before = crate::memory::resident_bytes()?;
        work()?;
        Ok(crate::memory::peak_bytes()? - before)
    };
    let (tensors, meta) = buffer.export();
    let writers = [
        peak_added(&|| Ok(Tensor::write_safetensors(&tensors, &path)?))?,
        peak_added(&|| tensor_file::write(&path, &tensors).map(drop))?,
    ];
    drop(tensors);
    let file_bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
    let readers = [
        peak_added(&|| {
            Tensor::read_safetensors(&path)
                .map(drop)
                .map_err(Into::into)
        })?,
        peak_added(&|| tensor_file::read(&path).map(drop))?,
    ];
    let ring = || ReplayBuffer::new(buffer.capacity(), case.layout, case.action_dim, Device::Cpu);
    let restores = [
        peak_added(&|| ring()?.restore(&tensor_file::read(&path)?, meta.clone()))?,
        peak_added(&|| {
            let part = SavedPart::whole(meta.clone());
            ring()?.gather(vec![part], |_| TensorFile::open(&path))
        })?,
    ];
    drop(dir);
    let line = |what: &str, [baseline, ours]: [f64; 2]| {
        json!({
            "case": what, "layout": case.name, "file_bytes": file_bytes,
            "peak_added_bytes_baseline": baseline,
            "peak_added_bytes_ours": ours,
            "ratio": baseline / ours.max(1.0),
        })
    };
    Ok([
        line("buffer save (baseline: torch's writer)", writers),
        line("buffer read (baseline: torch's reader)", readers),
        line(
            "buffer restore into a ring (baseline: read whole, then copied)",
            restores,
        ),
    ])
}

/// Refuses `rows` whose largest buffer the machine could not hold, naming the option, before
/// any case runs.
pub fn check(rows: usize) -> Result<()> {
    let row_bytes = cases()
        .iter()
        .map(|case| ReplayBuffer::bytes_per_row(case.layout, case.action_dim))
        .max()
        .unwrap_or(0);
    let need = rows as f64 * row_bytes as f64;
    let have = crate::memory::available_bytes()?;
    if need > have {
        return Err(crate::error::Error::Config(format!(
            "--buffer-rows {rows}: the largest case's buffer needs {:.1} GB, more than the \
             {:.1} GB this machine has available; give fewer rows",
            need / 1e9,
            have / 1e9
        )));
    }
    Ok(())
}

/// Fills one buffer of `rows` rows per case with 500-step episodes and prints a JSON line each.
pub fn run(rows: usize, print: &mut dyn FnMut(&Value)) -> Result<()> {
    for case in cases() {
        let dim = case.layout.stored();
        let steps = EPISODE_STEPS.min(rows.saturating_sub(1)).max(1);
        let episode = Episode {
            // Byte values, as pixels are; every row distinct enough to touch every page.
            obs: StoredObs::rows(
                case.layout,
                &(0..(steps + 1) * dim)
                    .map(|i| (i % 251) as f32)
                    .collect::<Vec<_>>(),
            ),
            action: vec![0.5; steps * case.action_dim],
            reward: vec![1.0; steps],
            terminated: vec![0.0; steps],
            task: None,
        };
        // After the episode: what the buffer adds, not the episode handed to it.
        let before = crate::memory::resident_bytes()?;
        let mut buffer = ReplayBuffer::new(rows, case.layout, case.action_dim, Device::Cpu)?;
        while buffer.len() < rows {
            buffer.add(&episode)?;
        }
        let added = crate::memory::resident_bytes()? - before;
        let per_row = ReplayBuffer::bytes_per_row(case.layout, case.action_dim);
        print(&json!({
            "case": "buffer", "layout": case.name, "rows": rows,
            "bytes_per_row": per_row,
            "rss_added_bytes": added,
            "rss_added_bytes_per_row": added / rows as f64,
            "projected_bytes_for_1m_rows": per_row as f64 * MILLION,
            "peak_rss_bytes": crate::memory::peak_bytes()?,
        }));
        for line in save_and_restore_peaks(&case, &buffer)? {
            print(&line);
        }
        drop(buffer);
    }
    Ok(())
}
