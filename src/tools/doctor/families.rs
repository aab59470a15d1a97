//! The environments' checks: dm_control in this process, each task family with a venv of its
//! own in its worker, and the official gymnasium tasks.
use super::{Mark, Report};
use crate::config::Config;
use crate::error::{Error, Result};

pub(super) fn check_dm_control(report: &mut Report, config: &Config) {
    let task = "cartpole-swingup";
    let needed = families_of(config).contains(&Some(envs::Family::DmControl));
    step_line(
        report,
        "dm_control",
        task,
        format!("{task} resets and steps"),
        "install the pinned dm_control and mujoco (scripts/setup.sh)",
        failing_mark(needed),
    );
}

/// Each task family with a venv of its own: installed or not, and one task reset and stepped
/// in its worker; the official gymnasium tasks (box2d) in this process. A family the run's
/// task needs must be there.
pub(super) fn check_families(report: &mut Report, config: &Config) {
    let needed = families_of(config);
    for (family, task) in [
        (envs::Family::MetaWorld, "mw-reach"),
        (envs::Family::MyoSuite, "myo-reach"),
    ] {
        let name = family.name();
        if let Err(e) = family.site_packages() {
            let mark = failing_mark(needed.contains(&Some(family)));
            report.line(mark, name, format!("not installed: {e}"));
            continue;
        }
        let done = format!(
            "{task} resets and steps in a worker with {}",
            family.venv().display()
        );
        let remedy = format!("reinstall with `{}`", family.install_command());
        let failing = failing_mark(needed.contains(&Some(family)));
        step_line(report, name, task, done, &remedy, failing);
    }
    let task = "lunarlander-continuous";
    // Any gymnasium id may need box2d; the other families' tasks do not.
    let gymnasium = needed
        .iter()
        .any(|family| matches!(family, None | Some(envs::Family::Gymnasium)));
    step_line(
        report,
        "gymnasium",
        task,
        format!("{task} resets and steps (box2d)"),
        "install the pinned requirements (scripts/setup.sh)",
        failing_mark(gymnasium),
    );
}

/// The family of each of the run's tasks (None: a gymnasium id, known only to gymnasium).
fn families_of(config: &Config) -> Vec<Option<envs::Family>> {
    config
        .tasks()
        .unwrap_or_default()
        .iter()
        .map(|task| envs::Family::of(task))
        .collect()
}

/// A family that does not work fails the check where the run needs it, and is noted otherwise.
fn failing_mark(needed: bool) -> Mark {
    match needed {
        true => Mark::Fail,
        false => Mark::Note,
    }
}

/// ✓ `done` when `task` resets and steps once, else `failing` with the error and `remedy` (a
/// renderer that cannot load says what to do itself).
fn step_line(
    report: &mut Report,
    name: &str,
    task: &str,
    done: String,
    remedy: &str,
    failing: Mark,
) {
    match reset_and_step(task) {
        Ok(()) => report.line(Mark::Pass, name, done),
        Err(e @ Error::Env(envs::Error::Renderer { .. })) => {
            report.line(failing, name, format!("{task} does not step: {e}"))
        }
        Err(e) => report.line(
            failing,
            name,
            format!("{task} does not step ({e}); {remedy}"),
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
