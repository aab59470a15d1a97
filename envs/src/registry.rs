//! Task name -> fully wrapped environment.
use crate::family::{Family, MANISKILL2_TASKS};
use crate::native::{mountain_car, pendulum, MountainCarContinuous, Pendulum};
use crate::wrappers::wrap;
use crate::Result;
use crate::{dmc, gym, metaworld, myosuite, native, renderer, Env, EnvOptions, Error, ObsKind};
use crate::{RemoteEnv, TaskMix};

const MAX_SUGGESTIONS: usize = 5;
const MIN_SIMILARITY: f64 = 0.5;

/// Fully wrapped env for a task name: actions rescaled to [-1,1], action repeat, time limit.
///
/// Native tasks and the DMControl tasks are matched first; any other gymnasium id goes
/// through gymnasium, and `gym:<id>` forces gymnasium even for a natively implemented id.
pub fn make(task: &str, seed: u64) -> Result<Box<dyn Env>> {
    make_observed(task, seed, ObsKind::State)
}

/// [`make`] with the observation the agent gets (an [`ObsKind`]), and whether the env also
/// renders videos ([`EnvOptions`]). Native tasks draw no images.
pub fn make_observed(
    task: &str,
    seed: u64,
    options: impl Into<EnvOptions>,
) -> Result<Box<dyn Env>> {
    let options = options.into();
    if uses_mujoco(task) {
        renderer::check_for(options.renders())?;
    }
    if let Some(family) = Family::of(task) {
        if let Some(reason) = family.refusal() {
            return Err(Error::Unsupported {
                task: task.into(),
                reason: reason.into(),
            });
        }
        // Here, before a worker is started for it: its refusal is the input's, not a worker's
        // failure.
        if family.observes_state_only() {
            crate::adapter::state_only(task, family.title(), options)?;
        }
        if !family.steps_here() {
            return Ok(Box::new(RemoteEnv::new(
                &TaskMix::single(task),
                seed,
                options,
            )?));
        }
        match family {
            Family::MetaWorld => return metaworld::make(task, seed, options),
            Family::MyoSuite => return myosuite::make(task, seed, options),
            _ => {}
        }
        if let Some(official) = gym::official(task) {
            return gym::make_official(official, seed, options);
        }
    }
    if let Some(id) = task.strip_prefix(gym::PREFIX) {
        let ids = gym::registered_ids()?;
        if ids.iter().any(|known| known == id) {
            return gym::make(id, seed, options);
        }
        let prefixed: Vec<String> = ids
            .iter()
            .map(|known| format!("{}{known}", gym::PREFIX))
            .collect();
        return Err(unknown(task, prefixed.iter().map(String::as_str)));
    }
    match task {
        pendulum::ID | mountain_car::ID if options.renders() => {
            return Err(draws_nothing(task, options))
        }
        pendulum::ID => return wrap(Pendulum::new(seed), 1, pendulum::EPISODE_LENGTH),
        mountain_car::ID => {
            return wrap(
                MountainCarContinuous::new(seed),
                1,
                mountain_car::EPISODE_LENGTH,
            )
        }
        _ => {}
    }
    if dmc::is_task(task) {
        return dmc::make(task, seed, options);
    }
    if looks_like_gym_id(task) {
        let ids = gym::registered_ids()?;
        if ids.iter().any(|known| known == task) {
            return gym::make(task, seed, options);
        }
        let names = known_tasks()
            .into_iter()
            .chain(ids.iter().map(String::as_str));
        return Err(unknown(task, names));
    }
    Err(unknown(task, known_tasks()))
}

/// Whether `task` renders through MuJoCo, whose backend `MUJOCO_GL` chooses (and MuJoCo's
/// packages load as they load): DMControl, Meta-World, MyoSuite and gymnasium's MuJoCo
/// environments.
pub(crate) fn uses_mujoco(task: &str) -> bool {
    match Family::of(task) {
        Some(Family::DmControl | Family::MetaWorld | Family::MyoSuite) => true,
        Some(Family::Gymnasium) => gym::official(task).is_some_and(|o| gym::is_mujoco(o.id)),
        Some(Family::Native | Family::ManiSkill2) => false,
        None => match task.strip_prefix(gym::PREFIX) {
            Some(id) => gym::is_mujoco(id),
            None => looks_like_gym_id(task) && gym::is_mujoco(task),
        },
    }
}

/// Why a native task cannot serve `options`, which ask for images.
fn draws_nothing(task: &str, options: EnvOptions) -> Error {
    let asked = if options.obs == ObsKind::Rgb {
        format!("obs={} needs images", options.obs.name())
    } else {
        "save_video=true renders the environment".to_string()
    };
    Error::Unsupported {
        task: task.into(),
        reason: format!(
            "{asked}, and the native `{task}` draws none; use `{}{task}` (gymnasium's own, \
             which renders)",
            gym::PREFIX
        ),
    }
}

/// Names of all tasks known by name (native, the DMC tasks, Meta-World's 50, MyoSuite's 10,
/// the official gymnasium names and the refused ManiSkill2 ones), for listing and suggestions.
pub fn known_tasks() -> Vec<&'static str> {
    native::TASKS
        .iter()
        .copied()
        .chain(dmc::tasks())
        .chain(metaworld::TASKS)
        .chain(myosuite::tasks())
        .chain(gym::OFFICIAL.iter().map(|task| task.name))
        .chain(MANISKILL2_TASKS)
        .collect()
}

/// gymnasium ids carry a version suffix (`-v4`) and are usually CamelCase.
fn looks_like_gym_id(name: &str) -> bool {
    let versioned = name.rsplit_once("-v").is_some_and(|(_, version)| {
        !version.is_empty() && version.bytes().all(|b| b.is_ascii_digit())
    });
    versioned || name.bytes().any(|b| b.is_ascii_uppercase())
}

fn unknown<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Error {
    Error::UnknownTask {
        name: name.into(),
        suggestions: closest(name, candidates),
    }
}

/// The candidates most similar to `name`, best first (case and `_`/`-` insensitive); among
/// equally close names the lexicographically last wins, which puts newer `-vN` ids first.
fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let normalize = |s: &str| s.to_lowercase().replace('_', "-");
    let target = normalize(name);
    let mut scored: Vec<(f64, f64, &str)> = candidates
        .into_iter()
        .map(|c| {
            let c_norm = normalize(c);
            let edit = strsim::normalized_damerau_levenshtein(&target, &c_norm);
            (edit, strsim::jaro_winkler(&target, &c_norm), c)
        })
        .filter(|&(edit, _, _)| edit >= MIN_SIMILARITY)
        .collect();
    scored.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(b.1.total_cmp(&a.1))
            .then(b.2.cmp(a.2))
    });
    scored.dedup_by(|a, b| a.2 == b.2);
    scored
        .into_iter()
        .take(MAX_SUGGESTIONS)
        .map(|(_, _, c)| c.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_tasks_list_every_family() {
        let tasks = known_tasks();
        assert_eq!(tasks.len(), 2 + 39 + 17 + 17 + 50 + 10 + 4 + 5);
        for task in [
            "Pendulum-v1",
            "dog-run",
            "dog-fetch",
            "walker-backflip",
            "mw-reach",
            "myo-key-turn",
            "bipedal-walker",
        ] {
            assert!(tasks.contains(&task), "{task}");
        }
        assert!(tasks.iter().all(|task| Family::of(task).is_some()));
    }

    #[test]
    fn maniskill2_is_refused_with_the_reason_and_typos_find_every_family() {
        let err = make("lift-cube", 0).err().map(|e| e.to_string()).unwrap();
        assert!(err.contains("SAPIEN 2.2"), "{err}");
        assert_eq!(closest("mw-rech", known_tasks())[0], "mw-reach");
        assert_eq!(closest("myo-reach-hrd", known_tasks())[0], "myo-reach-hard");
        assert_eq!(closest("mujoco-walkr", known_tasks())[0], "mujoco-walker");
        assert_eq!(closest("lift-cub", known_tasks())[0], "lift-cube");
    }

    #[test]
    fn suggestions_rank_the_closest_first() {
        assert_eq!(closest("walker-runn", known_tasks())[0], "walker-run");
        assert_eq!(
            closest("cartpole_swingup", known_tasks())[0],
            "cartpole-swingup"
        );
        assert_eq!(closest("pendulum-v1", known_tasks())[0], "Pendulum-v1");
        assert!(closest("zzzzzzzz", known_tasks()).is_empty());
    }

    #[test]
    fn gym_ids_are_recognised() {
        assert!(looks_like_gym_id("HalfCheetah-v5"));
        assert!(looks_like_gym_id("pendulum-v1"));
        assert!(!looks_like_gym_id("walker-run"));
        assert!(!looks_like_gym_id("walker-v"));
    }

    /// gymnasium registers ids it cannot make (the mujoco-py v2/v3 ones, shimmy's wrappers,
    /// the Jax ones without Jax): named unknown, with what can be made, never a traceback; and
    /// never suggested.
    #[test]
    fn ids_gymnasium_registers_but_cannot_make_are_unknown_tasks() {
        for task in ["gym:Pusher-v2", "Walker2d-v3", "gym:GymV26Environment-v0"] {
            let err = make(task, 0)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(&format!("unknown task `{task}`")), "{err}");
            assert!(!err.contains("Traceback") && !err.contains("-v2,"), "{err}");
        }
        let err = make("gym:Pusher-v1", 0).err().map(|e| e.to_string());
        assert!(err.unwrap_or_default().contains("gym:Pusher-v5"));
    }

    #[test]
    fn unknown_non_gym_names_need_no_python() {
        let err = make("walker-runn", 0)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("unknown task `walker-runn`") && err.contains("walker-run"),
            "{err}"
        );
    }
}
