//! `tdmpc2 bench --cases buffer`: bytes a replay-buffer row takes and the memory a filled
//! buffer adds to the process, for state rows (walker-run), pixel rows (one frame a row, as
//! stored) and, as the baseline, pixel rows stored as whole float32 stacks.
use serde_json::{json, Value};
use tch::Device;

use crate::buffer::{Episode, ObsLayout, ReplayBuffer};
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

/// Fills one buffer of `rows` rows per case with 500-step episodes and prints a JSON line each.
pub fn run(rows: usize, print: &mut dyn FnMut(&Value)) -> Result<()> {
    for case in cases() {
        let dim = case.layout.stored();
        let steps = EPISODE_STEPS.min(rows.saturating_sub(1)).max(1);
        let episode = Episode {
            // Byte values, as pixels are; every row distinct enough to touch every page.
            obs: (0..(steps + 1) * dim).map(|i| (i % 251) as f32).collect(),
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
        drop(buffer);
    }
    Ok(())
}
