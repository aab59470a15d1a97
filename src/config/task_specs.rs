//! The environment specs a config resolves against: its task made here (or in its family's
//! worker), or, for a multitask run, each of its tasks. `train`, `--multirun` and `doctor` all
//! resolve through here, so none of them takes a task list that another refuses.
use super::Config;
use crate::error::{Error, Result};

impl Config {
    /// Makes this config's task(s) and resolves the settings that depend on them.
    pub fn resolve_by_making_tasks(&mut self, options: envs::EnvOptions) -> Result<()> {
        let specs = task_specs(self, options)?;
        self.resolve_with_specs(&specs)
    }

    /// Resolves against [`task_specs`] made earlier (for another config of the same tasks).
    pub fn resolve_with_specs(&mut self, specs: &[envs::EnvSpec]) -> Result<()> {
        match (self.multitask(), specs) {
            (true, _) => self.resolve_tasks(specs),
            (false, [spec]) => self.resolve(spec),
            (false, _) => Err(Error::Other(format!(
                "task={}: {} specs for one task",
                self.task,
                specs.len()
            ))),
        }
    }
}

/// Each task's environment spec, in task-id order (one for a single task): the tasks of the
/// project's venv made here one by one, those of a family with a venv of its own by one worker
/// of that family. A task that cannot be made is named with its place in the list.
pub fn task_specs(config: &Config, options: envs::EnvOptions) -> Result<Vec<envs::EnvSpec>> {
    if !config.multitask() {
        let env = envs::make_observed(&config.task, config.seed, options)?;
        return Ok(vec![env.spec().clone()]);
    }
    let tasks = config.tasks()?;
    let cannot = |i: usize, e: envs::Error| {
        Error::Config(format!(
            "task={}: task {i} of {} ({}) cannot be made: {e}",
            config.task,
            tasks.len(),
            tasks[i]
        ))
    };
    let mut specs = vec![None; tasks.len()];
    let mix = envs::TaskMix {
        tasks: tasks.clone(),
        padding: None,
    };
    for (away, indices) in mix.groups() {
        if away.is_none() {
            for i in indices {
                let env = envs::make_observed(&tasks[i], config.seed, options)
                    .map_err(|e| cannot(i, e))?;
                specs[i] = Some(env.spec().clone());
            }
            continue;
        }
        let names: Vec<String> = indices.iter().map(|&i| tasks[i].clone()).collect();
        let made = envs::specs_in_worker(&names, config.seed, options).map_err(|e| match e {
            envs::Error::WorkerEnv { index, .. } => {
                cannot(indices[index.min(indices.len() - 1)], e)
            }
            e => cannot(indices[0], e),
        })?;
        for (i, spec) in indices.into_iter().zip(made) {
            specs[i] = Some(spec);
        }
    }
    specs
        .into_iter()
        .map(|spec| spec.ok_or_else(|| Error::Config("a task has no spec".into())))
        .collect()
}
