//! One environment slot of a multitask run: it holds an environment per task it may run and
//! plays one of them per episode, as the official multitask wrapper does. Observations are
//! zero-padded to the run's largest observation, and actions cut to the task's own size.
//!
//! Tasks whose simulator lives in another Python environment than this process's (see
//! [`crate::family`]) are held by one worker process per family, which pads them itself.
use crate::family::Family;
use crate::vector::RemoteEnv;
use crate::{make_observed, Env, EnvOptions, EnvSpec, Error, Frame, ObsKind, Result, Step};

/// The shapes every task of a multitask run is padded to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Padding {
    pub obs_dim: usize,
    pub action_dim: usize,
}

/// What one environment slot runs: one task as it is, or several (or one) padded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskMix {
    /// The tasks, in the order [`Env::switch_task`] indexes them.
    pub tasks: Vec<String>,
    pub padding: Option<Padding>,
}

impl TaskMix {
    /// One task, unpadded: a plain environment.
    pub fn single(task: &str) -> Self {
        Self {
            tasks: vec![task.to_string()],
            padding: None,
        }
    }

    /// The tasks as a run names them (`walker-run`, `[walker-run,cup-catch]`).
    pub fn name(&self) -> String {
        match self.tasks.as_slice() {
            [task] => task.clone(),
            tasks => format!("[{}]", tasks.join(",")),
        }
    }

    /// The slot's environment: each task made with `seed` and `options`, then padded.
    pub fn make(&self, seed: u64, options: EnvOptions) -> Result<Box<dyn Env>> {
        let groups = self.groups();
        match (self.tasks.as_slice(), self.padding, groups.as_slice()) {
            ([task], None, _) => make_observed(task, seed, options),
            (_, None, _) => Err(Error::VectorInput(format!(
                "{}: several tasks in one environment need a padding",
                self.name()
            ))),
            (_, Some(_), [(Some(_), _)]) => Ok(Box::new(RemoteEnv::new(self, seed, options)?)),
            (tasks, Some(padding), _) => {
                refuse_images(tasks, options.obs)?;
                let mut members = Vec::with_capacity(groups.len());
                for (away, indices) in groups {
                    if away.is_some() {
                        let mix = TaskMix {
                            tasks: indices.iter().map(|&i| tasks[i].clone()).collect(),
                            padding: Some(padding),
                        };
                        members
                            .push((Box::new(RemoteEnv::new(&mix, seed, options)?) as _, indices));
                    } else {
                        for i in indices {
                            members.push((make_observed(&tasks[i], seed, options)?, vec![i]));
                        }
                    }
                }
                Ok(Box::new(Multitask::grouped(tasks, members, padding)?))
            }
        }
    }

    /// The family each task must step in a worker of (None: here), with the indices of its
    /// tasks, in the order the families first appear.
    pub fn groups(&self) -> Vec<(Option<Family>, Vec<usize>)> {
        let mut groups: Vec<(Option<Family>, Vec<usize>)> = Vec::new();
        for (i, task) in self.tasks.iter().enumerate() {
            let away = Family::of(task).filter(|f| f.has_own_venv() && !f.steps_here());
            match groups.iter_mut().find(|(family, _)| *family == away) {
                Some((_, indices)) => indices.push(i),
                None => groups.push((away, vec![i])),
            }
        }
        groups
    }
}

/// Several tasks' environments behind one padded spec; `switch_task` picks the one the next
/// reset starts.
pub struct Multitask {
    envs: Vec<Box<dyn Env>>,
    /// Task i is `envs[routes[i].0]`'s task `routes[i].1`.
    routes: Vec<(usize, usize)>,
    /// The env of the current task.
    current: usize,
    spec: EnvSpec,
}

impl Multitask {
    /// `envs[i]` runs `tasks[i]`; each must fit `padding`. State observations only: images
    /// are never padded.
    pub fn new(
        tasks: &[String],
        envs: Vec<Box<dyn Env>>,
        padding: Padding,
        obs: ObsKind,
    ) -> Result<Self> {
        refuse_images(tasks, obs)?;
        if envs.len() != tasks.len() {
            return Err(Error::VectorInput(format!(
                "{} environments for {} tasks: give one per task",
                envs.len(),
                tasks.len()
            )));
        }
        let members = envs.into_iter().enumerate().map(|(i, e)| (e, vec![i]));
        Self::grouped(tasks, members.collect(), padding)
    }

    /// Environments that each run some of `tasks`: `members[m] = (env, task indices)`, the
    /// env's own task j being `tasks[indices[j]]`.
    fn grouped(
        tasks: &[String],
        members: Vec<(Box<dyn Env>, Vec<usize>)>,
        padding: Padding,
    ) -> Result<Self> {
        let mut routes = vec![None; tasks.len()];
        for (m, (_, indices)) in members.iter().enumerate() {
            for (local, &i) in indices.iter().enumerate() {
                if let Some(route) = routes.get_mut(i) {
                    *route = Some((m, local));
                }
            }
        }
        let routes = routes
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::VectorInput("a task of the mix has no environment".into()))?;
        let envs: Vec<Box<dyn Env>> = members.into_iter().map(|(env, _)| env).collect();
        if envs.is_empty() {
            return Err(Error::VectorInput(
                "a multitask environment needs a task".into(),
            ));
        }
        for (task, &(env, _)) in tasks.iter().zip(&routes) {
            let spec = envs[env].spec();
            if spec.obs_shape.len() != 1
                || spec.obs_dim() > padding.obs_dim
                || spec.action_dim > padding.action_dim
            {
                return Err(Error::VectorInput(format!(
                    "{task}: observation {:?} and {} actions do not fit the padding to {} and {}",
                    spec.obs_shape, spec.action_dim, padding.obs_dim, padding.action_dim
                )));
            }
        }
        let spec = EnvSpec {
            obs_shape: vec![padding.obs_dim],
            action_dim: padding.action_dim,
            episode_length: envs
                .iter()
                .map(|e| e.spec().episode_length)
                .max()
                .unwrap_or(0),
        };
        let current = routes.first().map_or(0, |&(env, _)| env);
        Ok(Self {
            envs,
            routes,
            current,
            spec,
        })
    }

    fn pad(&self, mut obs: Vec<f32>) -> Vec<f32> {
        obs.resize(self.spec.obs_dim(), 0.0);
        obs
    }
}

fn refuse_images(tasks: &[String], obs: ObsKind) -> Result<()> {
    if obs == ObsKind::State {
        return Ok(());
    }
    Err(Error::Unsupported {
        task: format!("[{}]", tasks.join(",")),
        reason: format!(
            "obs={}: a multitask environment pads state observations only",
            obs.name()
        ),
    })
}

impl Env for Multitask {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>> {
        let obs = self.envs[self.current].reset(seed)?;
        Ok(self.pad(obs))
    }

    fn step(&mut self, action: &[f32]) -> Result<Step> {
        self.spec.check_action(action)?;
        let env = &mut self.envs[self.current];
        let own = env.spec().action_dim;
        let mut step = env.step(&action[..own])?;
        step.obs = self.pad(step.obs);
        Ok(step)
    }

    fn render(&mut self, size: usize) -> Result<Frame> {
        self.envs[self.current].render(size)
    }

    fn switch_task(&mut self, task: usize) -> Result<()> {
        let Some(&(env, local)) = self.routes.get(task) else {
            return Err(Error::VectorInput(format!(
                "task {task} of an environment that runs {} tasks (0..{})",
                self.routes.len(),
                self.routes.len()
            )));
        };
        self.envs[env].switch_task(local)?;
        self.current = env;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(tasks: &[&str]) -> TaskMix {
        TaskMix {
            tasks: tasks.iter().map(|t| t.to_string()).collect(),
            padding: Some(Padding {
                obs_dim: 5,
                action_dim: 2,
            }),
        }
    }

    #[test]
    fn each_task_is_padded_and_cut_to_its_own_sizes() {
        let mut env = mix(&["Pendulum-v1", "MountainCarContinuous-v0"])
            .make(3, EnvOptions::default())
            .unwrap();
        assert_eq!(env.spec().obs_shape, vec![5]);
        assert_eq!((env.spec().action_dim, env.spec().episode_length), (2, 999));
        let mut plain = crate::make("Pendulum-v1", 3).unwrap();
        let (obs, own) = (env.reset(Some(1)).unwrap(), plain.reset(Some(1)).unwrap());
        assert_eq!(obs[..3], own[..]);
        assert_eq!(obs[3..], [0.0, 0.0]);
        let (step, own) = (env.step(&[0.5, 0.9]).unwrap(), plain.step(&[0.5]).unwrap());
        assert_eq!((step.obs[..3].to_vec(), step.reward), (own.obs, own.reward));
        env.switch_task(1).unwrap();
        let obs = env.reset(Some(1)).unwrap();
        let own = crate::make("MountainCarContinuous-v0", 3)
            .unwrap()
            .reset(Some(1))
            .unwrap();
        assert_eq!((obs[..2].to_vec(), obs[2..].to_vec()), (own, vec![0.0; 3]));
        let e = env.switch_task(2).unwrap_err().to_string();
        assert!(
            e.contains("task 2 of an environment that runs 2 tasks"),
            "{e}"
        );
        let e = env.step(&[0.5]).unwrap_err().to_string();
        assert!(e.contains('2'), "the padded action size is checked: {e}");
    }

    #[test]
    fn tasks_that_do_not_fit_are_named() {
        let mut small = mix(&["Pendulum-v1"]);
        small.padding = Some(Padding {
            obs_dim: 2,
            action_dim: 1,
        });
        let e = small
            .make(0, EnvOptions::default())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("Pendulum-v1") && e.contains("padding to 2"),
            "{e}"
        );
        let e = mix(&["Pendulum-v1"])
            .make(0, ObsKind::Rgb.into())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("obs=rgb"), "{e}");
        assert_eq!(TaskMix::single("Pendulum-v1").name(), "Pendulum-v1");
        assert_eq!(mix(&["a", "b"]).name(), "[a,b]");
    }
}
