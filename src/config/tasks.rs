//! Which tasks a run trains on: one (`task=walker-run`), or several for one multitask model:
//! the official lists (`task=mt30`, `task=mt80`) or any list (`task=[walker-run,cup-catch]`).
use crate::error::{Error, Result};

/// The official mt30 list, in task-id order: 19 DMControl tasks and 11 custom ones.
pub const MT30: [&str; 30] = [
    "walker-stand",
    "walker-walk",
    "walker-run",
    "cheetah-run",
    "reacher-easy",
    "reacher-hard",
    "acrobot-swingup",
    "pendulum-swingup",
    "cartpole-balance",
    "cartpole-balance-sparse",
    "cartpole-swingup",
    "cartpole-swingup-sparse",
    "cup-catch",
    "finger-spin",
    "finger-turn-easy",
    "finger-turn-hard",
    "fish-swim",
    "hopper-stand",
    "hopper-hop",
    "walker-walk-backwards",
    "walker-run-backwards",
    "cheetah-run-backwards",
    "cheetah-run-front",
    "cheetah-run-back",
    "cheetah-jump",
    "hopper-hop-backwards",
    "reacher-three-easy",
    "reacher-three-hard",
    "cup-spin",
    "pendulum-spin",
];

/// The tasks of `task`: the official lists by name, a bracketed list, or the one task.
pub fn task_list(task: &str) -> Result<Vec<String>> {
    let owned = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
    match task {
        "mt30" => Ok(owned(&MT30)),
        "mt80" => Ok(MT30
            .iter()
            .chain(&envs::metaworld::TASKS)
            .map(|n| n.to_string())
            .collect()),
        list if list.starts_with('[') => {
            let inner = list
                .strip_prefix('[')
                .and_then(|l| l.strip_suffix(']'))
                .ok_or_else(|| Error::Config(format!("task={task} is not a closed list")))?;
            let names: Vec<String> = inner.split(',').map(|n| n.trim().to_string()).collect();
            if names.len() < 2 || names.iter().any(String::is_empty) {
                return Err(Error::Config(format!(
                    "task={task}: a list of tasks names two or more, e.g. \
                     task=[walker-run,cheetah-run]"
                )));
            }
            if let Some(twice) = names
                .iter()
                .find(|n| names.iter().filter(|m| m == n).count() > 1)
            {
                return Err(Error::Config(format!(
                    "task={task} names {twice} twice; each task has one id"
                )));
            }
            Ok(names)
        }
        one => Ok(vec![one.to_string()]),
    }
}

/// Settings the official code sets for a task itself, as `key=value`: `discount_max=0.99` and
/// `rho=0.7` for its gymnasium tasks (its envs/mujoco.py), and, online, `episodic=true` for
/// those that end episodes early (the official trainer refuses their terminations otherwise;
/// datasets hold none). The same `episodic=true` for the native tasks that end early: the
/// first early end would otherwise stop the run, late, once the policy first reaches it. An
/// override, or a config file's value other than the default, still wins (but episodic=false
/// for a task that ends early is refused).
pub fn task_settings(task: &str, offline: bool) -> Vec<String> {
    let mut settings = match envs::gym::official(task) {
        Some(_) => vec!["discount_max=0.99".to_string(), "rho=0.7".to_string()],
        None => Vec::new(),
    };
    if ends_early(task) && !offline {
        settings.push("episodic=true".into());
    }
    settings
}

/// Whether `task` is known to end episodes early (it falls, crashes or reaches its goal): an
/// official gymnasium task or a native one.
pub fn ends_early(task: &str) -> bool {
    envs::gym::official(task).is_some_and(|o| o.terminates) || envs::native::terminates(task)
}

/// Whether `task` names several tasks (one multitask model).
pub fn is_multitask(task: &str) -> bool {
    matches!(task, "mt30" | "mt80") || task.starts_with('[')
}

/// The official task-embedding width: 96 for mt80 or model sizes 1 and 317, else 64.
pub fn task_dim(task: &str, model_size: Option<u32>) -> usize {
    if task == "mt80" || matches!(model_size, Some(1) | Some(317)) {
        96
    } else {
        64
    }
}

/// A YAML list given for `task` (`task=[a, b]` or a list in a config file) as the one string
/// the config keeps: `[a,b]`.
pub(super) fn list_value(items: &[serde_yaml_ng::Value]) -> Option<String> {
    let names: Option<Vec<&str>> = items.iter().map(serde_yaml_ng::Value::as_str).collect();
    names.map(|names| format!("[{}]", names.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn official_lists_and_given_lists_resolve_in_order() {
        let mt30 = task_list("mt30").unwrap();
        assert_eq!(
            (mt30.len(), mt30[2].as_str(), mt30[29].as_str()),
            (30, "walker-run", "pendulum-spin")
        );
        let mt80 = task_list("mt80").unwrap();
        assert_eq!((mt80.len(), mt80[30].as_str()), (80, "mw-assembly"));
        assert_eq!(
            task_list("[walker-run, cup-catch]").unwrap(),
            ["walker-run", "cup-catch"]
        );
        assert_eq!(task_list("walker-run").unwrap(), ["walker-run"]);
        assert!(is_multitask("mt30") && is_multitask("[a,b]") && !is_multitask("walker-run"));
    }

    #[test]
    fn bad_lists_name_the_problem() {
        let err = |t: &str| task_list(t).unwrap_err().to_string();
        assert!(err("[walker-run]").contains("two or more"));
        assert!(err("[walker-run,walker-run]").contains("twice"));
        assert!(err("[walker-run,").contains("not a closed list"));
        assert!(err("[a,,b]").contains("two or more"));
    }

    #[test]
    fn the_official_gymnasium_tasks_bring_their_settings() {
        assert_eq!(
            task_settings("lunarlander-continuous", false),
            ["discount_max=0.99", "rho=0.7", "episodic=true"]
        );
        assert_eq!(
            task_settings("lunarlander-continuous", true),
            ["discount_max=0.99", "rho=0.7"],
            "offline: a dataset holds no terminations"
        );
        assert_eq!(
            task_settings("mujoco-halfcheetah", false),
            ["discount_max=0.99", "rho=0.7"]
        );
        assert!(task_settings("walker-run", false).is_empty());
        assert!(task_settings("HalfCheetah-v5", false).is_empty());
        for mountain_car in ["MountainCarContinuous-v0", "gym:MountainCarContinuous-v0"] {
            assert_eq!(task_settings(mountain_car, false), ["episodic=true"]);
            assert!(task_settings(mountain_car, true).is_empty());
        }
        assert!(task_settings("Pendulum-v1", false).is_empty());
    }

    #[test]
    fn task_dim_follows_the_official_rule() {
        assert_eq!(task_dim("mt80", Some(5)), 96);
        assert_eq!(task_dim("mt30", Some(1)), 96);
        assert_eq!(task_dim("mt30", Some(5)), 64);
        assert_eq!(task_dim("[a,b]", None), 64);
    }
}
