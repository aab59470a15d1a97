//! A run's evaluation point: every rank evaluates the current policy, then rank 0 logs the
//! returns (and the video of its first episode). Online and offline runs share it.
use super::evaluate::{self, Outcome};
use super::report::{Clock, Report};
use super::stop::StopRequest;
use crate::actor::Actor;
use crate::config::Config;
use crate::ddp::ProcessGroup;
use crate::error::Result;

/// What is evaluated: `episodes` of each of `tasks` (a multitask run's), and whether rank 0
/// films its first episode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct EvalSettings {
    pub episodes: usize,
    pub tasks: Option<usize>,
    pub film: bool,
}

impl EvalSettings {
    /// `eval_episodes` of the run's tasks; `film` when its videos are wanted.
    pub(super) fn from_config(config: &Config, film: bool) -> Result<Self> {
        Ok(Self {
            episodes: config.eval_episodes,
            tasks: config.multitask().then_some(config.tasks()?.len()),
            film,
        })
    }
}

/// Where in the run the point is: its step, the episodes so far and the run's clock.
pub(super) struct Point<'a> {
    pub step: u64,
    pub episodes: u64,
    pub clock: &'a Clock,
}

/// Evaluates and logs; the stop request when a stop came first (nothing is logged then).
pub(super) fn evaluate_and_log(
    actor: &mut Actor,
    settings: &EvalSettings,
    seed: u64,
    group: &ProcessGroup,
    report: Option<&mut Report>,
    point: Point<'_>,
) -> Result<Option<StopRequest>> {
    let mut video = Vec::new();
    let films = settings.film && report.is_some();
    let say = report.as_deref().map(|r| move |line: &str| r.note(line));
    let outcome = evaluate::evaluate(
        actor,
        settings.episodes,
        settings.tasks,
        seed,
        group,
        films.then_some(&mut video),
        say.as_ref().map(|say| say as &dyn Fn(&str)),
    )?;
    let evaluation = match outcome {
        Outcome::Done(evaluation) => evaluation,
        Outcome::Stopped(request) => {
            if let Some(report) = report {
                report.leave_to_the_resume(point.step);
            }
            return Ok(Some(request));
        }
    };
    if let Some(report) = report {
        report.evaluation(point.step, &evaluation, point.episodes, point.clock)?;
        if !video.is_empty() {
            report.video(point.step, video)?;
        }
    }
    Ok(None)
}
