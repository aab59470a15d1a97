//! `tdmpc2 bench --cases video`: what an evaluation video costs. Rendering frames/s at the
//! video size against the pixel observations' 64×64 (the baseline, same environment, same
//! run), then the GIF's encoding time and size, projected to a whole DMControl episode.
use std::time::Instant;

use serde_json::{json, Value};

use crate::error::Result;
use crate::logging::{write_video, VIDEO_FPS};

/// The environment a video case renders, made before any case runs to refuse a task that is
/// unknown or draws nothing.
pub fn open(task: &str) -> Result<Box<dyn envs::Env>> {
    envs::make_observed(task, 1, options())
        .map_err(|e| crate::error::Error::Config(format!("--video-task {task}: {e}")))
}

fn options() -> envs::EnvOptions {
    envs::EnvOptions {
        obs: envs::ObsKind::State,
        videos: true,
    }
}

/// Renders `frames` frames of `task` at each size, encodes the video-size ones and prints a
/// JSON line per measurement.
pub fn run(
    mut env: Box<dyn envs::Env>,
    task: &str,
    frames: usize,
    print: &mut dyn FnMut(&Value),
) -> Result<()> {
    let action_dim = env.spec().action_dim;
    let episode = env.spec().episode_length + 1;
    let frames = frames.max(1);
    let mut video = Vec::with_capacity(frames);
    for size in [envs::FRAME_SIZE, envs::VIDEO_SIZE] {
        env.reset(Some(1))?;
        env.render(size)?;
        let start = Instant::now();
        for t in 0..frames {
            let action = vec![(t as f32 * 0.1).sin(); action_dim];
            if env.step(&action)?.truncated {
                env.reset(None)?;
            }
            let frame = env.render(size)?;
            if size == envs::VIDEO_SIZE {
                video.push(frame);
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        print(&json!({
            "case": "video", "what": "render", "task": task, "size": size, "frames": frames,
            "frames_per_s": frames as f64 / seconds,
            "seconds_per_episode": seconds / frames as f64 * episode as f64,
            "baseline": size == envs::FRAME_SIZE,
        }));
    }
    let dir = super::scratch::Scratch::new("video")?;
    let path = dir.path().join("bench.gif");
    let start = Instant::now();
    let bytes = write_video(&path, &video)?.len();
    let seconds = start.elapsed().as_secs_f64();
    drop(dir);
    let raw = video.len() * envs::VIDEO_SIZE * envs::VIDEO_SIZE * 3;
    print(&json!({
        "case": "video", "what": "encode gif", "task": task, "size": envs::VIDEO_SIZE,
        "frames": video.len(), "fps": VIDEO_FPS, "seconds": seconds,
        "bytes_per_frame": bytes as f64 / video.len() as f64,
        "compression_vs_raw_rgb": raw as f64 / bytes as f64,
        "episode_frames": episode,
        "seconds_per_episode": seconds / video.len() as f64 * episode as f64,
        "mb_per_episode": bytes as f64 / video.len() as f64 * episode as f64 / 1e6,
    }));
    Ok(())
}
