//! The acting side of the agent: its own copy of the weights the planner reads, the MPPI planner
//! with one warm start per environment, and its own stream of random draws.
//!
//! The copy is refreshed from the learner's model at the points the trainer chooses (after
//! every update in the strict loop, one vector step's updates behind with `pipeline=true`); it
//! is a device copy of two flat buffers, never a round trip through the host.
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::own_noise::OwnNoise;
use crate::agent::{
    AgentConfig, Error, HostNoise, Noise, PlanInputs, Planner, Result, TaskModel, WorldModel,
};
use crate::cuda::{Replayed, SharedGenerator};

pub struct Policy {
    model: WorldModel,
    planner: Planner,
    noise: Box<dyn Noise + Send>,
    mpc: bool,
    /// A multitask model's task of each environment (E,), once set.
    tasks: Option<Tensor>,
    /// Plans through CUDA graphs, once asked to.
    graphs: Option<PlanGraphs>,
    /// Where `noise` draws, as far as a captured plan cares.
    draws: Draws,
}

/// Where a policy's draws come from.
enum Draws {
    /// The noise it was given (a captured plan needs it to draw on the device).
    Given,
    /// Torch's default generator (the strict loop's acting, beside nothing).
    Torch,
    /// A torch generator of its own, which a captured plan registers.
    Own(OwnNoise),
    /// A host stream (a build without generators of its own): cannot be captured.
    Host,
}

/// The plan as CUDA graphs, one per `eval_mode` (captured at its first use), and the inputs
/// they read.
struct PlanGraphs {
    inputs: Option<PlanInputs>,
    by_mode: [Replayed; 2],
}

impl Policy {
    /// A policy for `num_envs` environments. Its weights are drawn fresh (and so consume draws
    /// of torch's generator): load the learner's before acting.
    pub fn new(
        config: &AgentConfig,
        device: Device,
        num_envs: usize,
        noise: Box<dyn Noise + Send>,
    ) -> Result<Self> {
        Ok(Self {
            model: WorldModel::new(config, device)?,
            planner: Planner::new(config, device, num_envs)?,
            noise,
            mpc: config.mpc,
            tasks: None,
            graphs: None,
            draws: Draws::Given,
        })
    }

    /// Draws from a torch generator of its own on the policy's device, seeded with `seed` (in
    /// place once made, so that captured plans keep drawing from it): for an acting thread
    /// that runs beside the learner. A build without such generators draws from a host stream.
    pub fn draw_on_its_own(&mut self, seed: u64) -> crate::error::Result<()> {
        if let Draws::Own(own) = &self.draws {
            return Ok(own.reseed(seed)?);
        }
        self.forget_captures();
        match OwnNoise::seeded(self.model.device(), seed) {
            Ok(own) => {
                self.noise = Box::new(own.share());
                self.draws = Draws::Own(own);
            }
            Err(_) => {
                self.noise = Box::new(HostNoise::seeded(seed));
                self.draws = Draws::Host;
            }
        }
        Ok(())
    }

    /// Plans through CUDA graphs from now on, one per `eval_mode`, each captured at its first
    /// use: for a policy that plans, on CUDA, whose noise draws on the device (as
    /// [`crate::agent::TorchNoise`] and [`Self::draw_on_its_own`] do; a host stream's uploads
    /// cannot be captured). Says why not otherwise, and stays eager.
    pub fn capture_plans(&mut self) -> std::result::Result<(), String> {
        let device = self.model.device();
        let why_not = match crate::cuda::why_no_graphs(device) {
            Some(why) => why,
            None if !self.mpc => "mpc=false acts with the policy alone, without planning".into(),
            None => {
                self.graphs = Some(PlanGraphs {
                    inputs: None,
                    by_mode: [Replayed::new(device), Replayed::new(device)],
                });
                return Ok(());
            }
        };
        Err(why_not)
    }

    /// Each environment's task (task ids of a multitask model), for every later action.
    pub fn set_tasks(&mut self, tasks: &[u32]) -> Result<()> {
        let count = self.model.task.as_ref().map_or(0, |t| t.masks.size()[0]);
        if count == 0 {
            return Err(Error::Config(
                "a single-task policy takes no task ids".into(),
            ));
        }
        if tasks.len() != self.num_envs() || tasks.iter().any(|&t| i64::from(t) >= count) {
            return Err(Error::Config(format!(
                "one task id below {count} per environment ({}) is needed, got {tasks:?}",
                self.num_envs()
            )));
        }
        let ids: Vec<i64> = tasks.iter().map(|&t| i64::from(t)).collect();
        let ids = Tensor::from_slice(&ids).to_device(self.model.device());
        // In place once set: a captured plan reads the tasks where they were.
        match &mut self.tasks {
            Some(current) => current.copy_(&ids),
            None => self.tasks = Some(ids),
        }
        Ok(())
    }

    pub fn num_envs(&self) -> usize {
        self.planner.num_envs()
    }

    /// The planner's warm start (the means its next plans shift), flattened: what a checkpoint
    /// keeps for a resumed run to plan as the uninterrupted one.
    pub fn warm_start(&self) -> crate::error::Result<Vec<f32>> {
        let means = self.planner.prev_mean().f_to_device(Device::Cpu)?;
        Ok(Vec::<f32>::try_from(means.f_reshape([-1])?)?)
    }

    /// Values in [`Self::warm_start`].
    pub fn warm_start_len(&self) -> usize {
        self.planner.prev_mean().numel()
    }

    /// Continues from a saved [`Self::warm_start`].
    pub fn set_warm_start(&mut self, values: &[f32]) -> crate::error::Result<()> {
        let shape = self.planner.prev_mean().size();
        if values.len() != self.warm_start_len() {
            let got = vec![values.len() as i64];
            let what = "saved planner warm start".into();
            return Err(Error::Shape {
                what,
                expected: shape,
                got,
            }
            .into());
        }
        let means = Tensor::from_slice(values).view(shape.as_slice());
        Ok(self
            .planner
            .set_prev_mean(&means.to_device(self.model.device()))?)
    }

    /// Draws from torch's default generator from now on, as it stands (a stream that
    /// [`crate::agent::TorchNoise::seeded`] started).
    pub fn draw_from_torch(&mut self) {
        if !matches!(self.draws, Draws::Torch) {
            self.forget_captures();
        }
        self.noise = Box::new(crate::agent::TorchNoise::global());
        self.draws = Draws::Torch;
    }

    /// Draws from `noise` from now on (see [`Self::capture_plans`] for what a captured plan
    /// needs of it). Plans captured before are captured again, so that none keeps drawing from
    /// the noise it was captured with.
    pub fn set_noise(&mut self, noise: Box<dyn Noise + Send>) {
        self.forget_captures();
        self.noise = noise;
        self.draws = Draws::Given;
    }

    /// Drops the captured plans (they are captured again at their next use).
    fn forget_captures(&mut self) {
        if let Some(graphs) = &mut self.graphs {
            let device = self.model.device();
            graphs.by_mode = [Replayed::new(device), Replayed::new(device)];
        }
    }

    /// Copies the learner's current world model and policy parameters (not the target Qs,
    /// which acting never reads).
    pub fn load_weights(&mut self, learner_model: &WorldModel) -> Result<()> {
        self.model.copy_acting_weights_from(learner_model)
    }

    /// Loads weights from a safetensors file (official state-dict names).
    pub fn load_file(&mut self, path: &Path) -> Result<()> {
        self.model.load(path)
    }

    /// One action per environment: `obs` holds `num_envs` observations back to back, `t0`
    /// marks the environments at the first step of an episode (their warm start is dropped).
    /// Returns `num_envs × action_dim` values in [−1, 1].
    pub fn act(
        &mut self,
        obs: &[f32],
        t0: &[bool],
        eval_mode: bool,
    ) -> crate::error::Result<Vec<f32>> {
        let (e, obs_dim) = (self.planner.num_envs() as i64, self.model.obs_dim);
        if obs.len() as i64 != e * obs_dim || t0.len() as i64 != e {
            return Err(Error::Shape {
                what: "observations".into(),
                expected: vec![e, obs_dim],
                got: vec![t0.len() as i64, obs.len() as i64 / e.max(1)],
            }
            .into());
        }
        let obs = Tensor::from_slice(obs)
            .view([e, obs_dim])
            .to_device(self.model.device());
        let noise = self.noise.as_mut();
        let actions = match (&self.tasks, self.mpc) {
            (_, true) if self.graphs.is_some() => self.plan_in_graph(&obs, t0, eval_mode)?,
            (None, true) => self
                .planner
                .plan_batch(&self.model, &obs, t0, eval_mode, noise)?,
            (Some(tasks), true) => {
                let model = TaskModel::new(&self.model, tasks)?;
                self.planner
                    .plan_batch(&model, &obs, t0, eval_mode, noise)?
            }
            (tasks, false) => {
                let rows = self.model.task_rows(tasks.as_ref())?;
                self.planner.act_with_policy_batch(
                    &self.model,
                    rows.as_ref(),
                    &obs,
                    eval_mode,
                    noise,
                )?
            }
        };
        // The f_ calls: an error of the device's queued work surfaces here, as an error.
        let actions = actions.f_to_device(Device::Cpu)?.f_to_kind(Kind::Float)?;
        Ok(Vec::<f32>::try_from(actions.f_reshape([-1])?)?)
    }

    /// One plan through the `eval_mode` graph: the inputs are refilled in place, then the
    /// graph replays (or, the first time, the plan runs and is captured). A multitask plan
    /// looks its tasks up inside the graph.
    fn plan_in_graph(
        &mut self,
        obs: &Tensor,
        t0: &[bool],
        eval_mode: bool,
    ) -> crate::error::Result<Tensor> {
        let fresh = self.planner.inputs(&self.model, obs, t0)?;
        let Some(graphs) = self.graphs.as_mut() else {
            return Err(Error::Config("plans are not captured".into()).into());
        };
        let inputs = match &mut graphs.inputs {
            Some(inputs) => {
                inputs.refill(&fresh);
                inputs
            }
            None => graphs.inputs.insert(fresh),
        };
        let generators: Vec<SharedGenerator> = match &self.draws {
            Draws::Given | Draws::Torch => Vec::new(),
            Draws::Own(own) => vec![own.generator()],
            Draws::Host => {
                let why = "a captured plan cannot draw from a host stream";
                return Err(Error::Config(why.into()).into());
            }
        };
        let (planner, model, noise) = (&mut self.planner, &self.model, self.noise.as_mut());
        let tasks = self.tasks.as_ref();
        if model.task.is_some() && tasks.is_none() {
            return Err(
                Error::Config("a multitask policy needs its environments' tasks".into()).into(),
            );
        }
        graphs.by_mode[usize::from(eval_mode)].call_drawing_from(&generators, || {
            let actions = match tasks {
                None => planner.plan_prepared(model, inputs, eval_mode, noise)?,
                Some(tasks) => {
                    let model = TaskModel::new(model, tasks)?;
                    planner.plan_prepared(&model, inputs, eval_mode, noise)?
                }
            };
            Ok::<_, crate::error::Error>(actions)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::TorchNoise;

    fn config(mpc: bool) -> AgentConfig {
        AgentConfig {
            enc_dim: 16,
            mlp_dim: 16,
            latent_dim: 8,
            num_q: 2,
            num_samples: 64,
            num_elites: 8,
            num_pi_trajs: 4,
            iterations: 2,
            mpc,
            ..AgentConfig::defaults(None, 5, 3).unwrap()
        }
    }

    /// The warm start a plan leaves is what a checkpoint keeps; set on another policy it is
    /// that policy's next warm start; a warm start of another size is refused, unchanged.
    #[test]
    fn the_warm_start_carries_over_to_another_policy() {
        let config = config(true);
        let noise = || Box::new(TorchNoise::seeded(0));
        let mut planned = Policy::new(&config, Device::Cpu, 2, noise()).unwrap();
        assert_eq!(planned.warm_start_len(), 2 * config.horizon * 3);
        let obs = [0.1f32, -0.2, 0.3, 0.0, 1.0, 0.5, 0.5, -0.5, 0.0, 0.2];
        planned.act(&obs, &[true, true], false).unwrap();
        let left = planned.warm_start().unwrap();
        assert!(left.iter().any(|&v| v != 0.0));

        let mut resumed = Policy::new(&config, Device::Cpu, 2, noise()).unwrap();
        resumed.set_warm_start(&left).unwrap();
        assert_eq!(resumed.warm_start().unwrap(), left);
        let err = resumed.set_warm_start(&left[1..]).unwrap_err();
        assert!(err.to_string().contains("warm start"), "{err}");
        assert_eq!(resumed.warm_start().unwrap(), left);
    }

    #[test]
    fn acts_within_bounds_for_every_environment() {
        for mpc in [true, false] {
            let config = config(mpc);
            let mut policy =
                Policy::new(&config, Device::Cpu, 2, Box::new(TorchNoise::seeded(0))).unwrap();
            let obs = [0.1f32, -0.2, 0.3, 0.0, 1.0, 0.5, 0.5, -0.5, 0.0, 0.2];
            for (t0, eval_mode) in [
                ([true, true], false),
                ([false, true], false),
                ([false, false], true),
            ] {
                let actions = policy.act(&obs, &t0, eval_mode).unwrap();
                assert_eq!(actions.len(), 6);
                assert!(
                    actions
                        .iter()
                        .all(|a| a.is_finite() && (-1.0..=1.0).contains(a)),
                    "{actions:?}"
                );
            }
            let err = policy.act(&obs[..5], &[false, false], false).unwrap_err();
            assert!(
                matches!(err, crate::error::Error::Agent(Error::Shape { .. })),
                "{err}"
            );
            assert!(policy.act(&obs, &[false], false).is_err());
        }
        assert!(Policy::new(
            &config(true),
            Device::Cpu,
            0,
            Box::new(TorchNoise::global())
        )
        .is_err());
    }

    /// Each environment acts in its task: the components its task lacks are zero, planning or
    /// not; a multitask policy needs the tasks first, and they are checked.
    #[test]
    fn a_multitask_policy_acts_in_each_environments_task() {
        for mpc in [true, false] {
            let config = AgentConfig {
                tasks: Some(crate::agent::task::Tasks {
                    task_dim: 4,
                    action_dims: vec![3, 1],
                    discounts: vec![0.99, 0.95],
                }),
                ..config(mpc)
            };
            let mut policy =
                Policy::new(&config, Device::Cpu, 2, Box::new(TorchNoise::seeded(2))).unwrap();
            let obs = [0.1f32, -0.2, 0.3, 0.0, 1.0, 0.5, 0.5, -0.5, 0.0, 0.2];
            assert!(
                policy.act(&obs, &[true, true], false).is_err(),
                "no tasks yet"
            );
            assert!(policy.set_tasks(&[0, 2]).is_err(), "task 2 of 2");
            assert!(policy.set_tasks(&[0]).is_err(), "one per environment");
            policy.set_tasks(&[1, 0]).unwrap();
            let actions = policy.act(&obs, &[true, true], false).unwrap();
            assert_eq!(&actions[1..3], &[0.0, 0.0], "environment 0 has one action");
            assert!(actions[3..].iter().all(|a| a.abs() > 0.0), "{actions:?}");
        }
        let mut single = Policy::new(
            &config(true),
            Device::Cpu,
            2,
            Box::new(TorchNoise::seeded(3)),
        )
        .unwrap();
        assert!(single.set_tasks(&[0, 0]).is_err());
    }

    /// Off CUDA plans stay eager and say why; so do policies that do not plan.
    #[test]
    fn plans_are_captured_on_cuda_only() {
        let mut policy = Policy::new(
            &config(true),
            Device::Cpu,
            1,
            Box::new(TorchNoise::seeded(1)),
        )
        .unwrap();
        let why = policy.capture_plans().unwrap_err();
        assert!(why.contains("CUDA only"), "{why}");
        assert!(policy.graphs.is_none());
        let obs = [0.1f32, -0.2, 0.3, 0.0, 1.0];
        assert_eq!(policy.act(&obs, &[true], false).unwrap().len(), 3);
    }

    #[test]
    fn loaded_weights_are_the_learners_and_a_copy() {
        let config = config(true);
        let mut policy =
            Policy::new(&config, Device::Cpu, 1, Box::new(TorchNoise::seeded(1))).unwrap();
        let learner_model = WorldModel::new(&config, Device::Cpu).unwrap();
        assert!(!policy
            .model
            .model_params
            .flat
            .equal(&learner_model.model_params.flat));
        policy.load_weights(&learner_model).unwrap();
        assert!(policy
            .model
            .model_params
            .flat
            .equal(&learner_model.model_params.flat));
        assert!(policy
            .model
            .policy_params
            .flat
            .equal(&learner_model.policy_params.flat));
        // A copy: the learner's next step does not reach the policy until the next load.
        tch::no_grad(|| {
            let _ = learner_model.model_params.flat.get(0).fill_(7.0);
        });
        assert_ne!(policy.model.model_params.flat.double_value(&[0]), 7.0);
        let other = WorldModel::new(
            &AgentConfig {
                mlp_dim: 32,
                ..config
            },
            Device::Cpu,
        )
        .unwrap();
        assert!(policy.load_weights(&other).is_err());
    }
}
