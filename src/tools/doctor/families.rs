//! The environments' checks: dm_control in this process, each task family with a venv of its
//! own in its worker, and the official gymnasium tasks.
use super::{Mark, Report};
use crate::config::Config;
use crate::error::{Error, Result};

pub(super) fn check_dm_control(report: &mut Report) {
    let task = "cartpole-swingup";
    let stepped = (|| {
        let mut env = envs::make(task, 0)?;
        env.reset(Some(0))?;
        let action = vec![0.0f32; env.spec().action_dim];
        env.step(&action)?;
        Ok::<_, Error>(())
    })();
    match stepped {
        Ok(()) => report.line(Mark::Pass, "dm_control", format!("{task} resets and steps")),
        Err(e) => report.line(
            Mark::Fail,
            "dm_control",
            format!(
                "{task} does not step ({e}); install the pinned dm_control and mujoco \
                 (scripts/setup.sh); headless machines need MUJOCO_GL=egl for pixels"
            ),
        ),
    }
}

/// Resets and steps a task once: in this process, or in a worker with its family's venv.
fn reset_and_step(task: &str) -> Result<()> {
    let mut env = envs::make(task, 0)?;
    env.reset(Some(0))?;
    env.step(&vec![0.0f32; env.spec().action_dim])?;
    Ok(())
}

/// Each task family with a venv of its own: installed or not, and one task reset and stepped
/// in its worker; the official gymnasium tasks (box2d) in this process. A family the run's
/// task needs must be there.
pub(super) fn check_families(report: &mut Report, config: &Config) {
    let needed: Vec<envs::Family> = config
        .tasks()
        .unwrap_or_default()
        .iter()
        .filter_map(|task| envs::Family::of(task))
        .collect();
    for (family, task) in [
        (envs::Family::MetaWorld, "mw-reach"),
        (envs::Family::MyoSuite, "myo-reach"),
    ] {
        let name = family.name();
        if let Err(e) = family.site_packages() {
            let mark = match needed.contains(&family) {
                true => Mark::Fail,
                false => Mark::Note,
            };
            report.line(mark, name, format!("not installed: {e}"));
            continue;
        }
        match reset_and_step(task) {
            Ok(()) => report.line(
                Mark::Pass,
                name,
                format!(
                    "{task} resets and steps in a worker with {}",
                    family.venv().display()
                ),
            ),
            Err(e) => report.line(
                Mark::Fail,
                name,
                format!(
                    "{task} does not step ({e}); reinstall with `{}`",
                    family.install_command()
                ),
            ),
        }
    }
    let task = "lunarlander-continuous";
    match reset_and_step(task) {
        Ok(()) => report.line(
            Mark::Pass,
            "gymnasium",
            format!("{task} resets and steps (box2d)"),
        ),
        Err(e) => report.line(
            Mark::Fail,
            "gymnasium",
            format!(
                "{task} does not step ({e}); install the pinned requirements (scripts/setup.sh)"
            ),
        ),
    }
}
