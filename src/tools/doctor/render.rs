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
/// runs use (`MUJOCO_GL`, default egl), timed. When it fails, the line names the backend, what
/// failed and the backends this machine has: a failure where the run renders (`needed`: obs=rgb
/// or save_video=true), a note otherwise (state runs render nothing).
pub(super) fn check_rendering(report: &mut Report, chosen: Option<&str>, needed: bool) {
    let failed = match needed {
        true => Mark::Fail,
        false => Mark::Note,
    };
    let backend = chosen
        .filter(|gl| !gl.is_empty())
        .unwrap_or(envs::renderer::DEFAULT)
        .to_string();
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
            let last = text.lines().last().unwrap_or("no output");
            let why = last.strip_prefix("error: ").unwrap_or(last);
            return report.line(failed, "rendering", format!("no frame: {why}"));
        }
        Err(e) => return report.line(failed, "rendering", format!("MUJOCO_GL={backend}: {e}")),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    report.line(
        Mark::Pass,
        "rendering",
        format!("MUJOCO_GL={backend}: {}", text.trim()),
    );
}

/// The rendering check's process: one frame, then [`RENDER_FRAMES`] timed.
pub fn render_check() -> Result<()> {
    envs::renderer::check()?;
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
    outln!(
        "{RENDER_TASK} {RENDER_SIZE}×{RENDER_SIZE}: first frame {:.0} ms, then {:.1} ms a frame \
         ({:.0} frames/s)",
        first.as_secs_f64() * 1e3,
        each * 1e3,
        1.0 / each
    );
    Ok(())
}
