//! The doctor's rendering check: MuJoCo renders frames headless, timed, in a fresh process.
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use envs::Env;

use super::group::wait_with_deadline;
use super::{Mark, Report};
use crate::error::{Error, Result};

/// The task, camera and frame size the rendering check uses (the official pixel observations).
const RENDER_TASK: &str = "cartpole-swingup";
const RENDER_SIZE: usize = 64;
/// Frames timed after the first (which also starts the renderer).
const RENDER_FRAMES: usize = 20;
const RENDER_TIMEOUT: Duration = Duration::from_secs(120);

/// Pixel observations: MuJoCo renders frames headless, in a fresh process with the backend pixel
/// runs use (`MUJOCO_GL`, default egl), timed. Only a note when it fails: state runs render
/// nothing.
pub(super) fn check_rendering(report: &mut Report, chosen: Option<&str>) {
    let backend = chosen
        .map(str::to_string)
        .filter(|gl| !["", "disable", "disabled", "off", "0", "false"].contains(&gl.as_str()))
        .unwrap_or_else(|| "egl".into());
    let rendered = std::env::current_exe().and_then(|exe| {
        let child = Command::new(exe)
            .args(["doctor", "--render-check"])
            .env("MUJOCO_GL", &backend)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        wait_with_deadline(child, Instant::now() + RENDER_TIMEOUT, "no frame")
    });
    let out = match rendered {
        Ok(out) if out.status.success() => out,
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stderr);
            let last = text.lines().last().unwrap_or("no output").to_string();
            return report.line(
                Mark::Note,
                "rendering",
                format!(
                    "MUJOCO_GL={backend} renders no frame ({last}); pixel observations need \
                     libEGL and a Mesa or GPU driver (apt install libegl1 libgl1-mesa-dri, \
                     or set MUJOCO_GL=osmesa with libosmesa6)"
                ),
            );
        }
        Err(e) => return report.line(Mark::Note, "rendering", format!("MUJOCO_GL={backend}: {e}")),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    report.line(
        Mark::Pass,
        "rendering",
        format!("MUJOCO_GL={backend}: {}", text.trim()),
    );
}

/// The rendering check's process: one frame, then [`RENDER_FRAMES`] timed.
pub(super) fn render_check() -> Result<()> {
    let mut env = envs::dmc::DmcEnv::new(RENDER_TASK, 0, true)?;
    env.reset(Some(0))?;
    let start = Instant::now();
    let frame = env.render(RENDER_SIZE)?.rgb;
    let first = start.elapsed();
    if frame.len() != RENDER_SIZE * RENDER_SIZE * 3 || frame.iter().all(|&b| b == frame[0]) {
        return Err(Error::Other(format!(
            "a {RENDER_SIZE}×{RENDER_SIZE} frame of {RENDER_TASK} came back as {} bytes, all alike",
            frame.len()
        )));
    }
    let start = Instant::now();
    for _ in 0..RENDER_FRAMES {
        env.render(RENDER_SIZE)?;
    }
    let each = start.elapsed().as_secs_f64() / RENDER_FRAMES as f64;
    println!(
        "{RENDER_TASK} {RENDER_SIZE}×{RENDER_SIZE}: first frame {:.0} ms, then {:.1} ms a frame \
         ({:.0} frames/s)",
        first.as_secs_f64() * 1e3,
        each * 1e3,
        1.0 / each
    );
    Ok(())
}
