//! The TD-MPC2 world model: encoder, latent dynamics, reward, optional termination, policy
//! prior and the Q ensemble with its target copy, and a multitask model's task embedding.
//! Parameter names are the official state-dict keys.
//!
//! With tasks, every head takes the batch's [`TaskRows`] (`task`): its input gets each row's
//! task embedding after the latent (`[z, emb, a]`), and the policy masks the action components
//! a row's task does not have. Single-task models take `None`.
use std::collections::HashMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::config::AgentConfig;
use super::encoder::Encoder;
use super::ensemble::{Ensemble, Heads};
use super::error::{Error, Result};
use super::layers::{Activation, Mlp};
use super::math::{self, TwoHot};
use super::noise::Noise;
use super::params::FlatParams;
use super::task::{self, TaskEmbedding, TaskRows, ACTION_MASKS, TASK_EMB};

pub const DYNAMICS: &str = "_dynamics";
pub const REWARD: &str = "_reward";
pub const TERMINATION: &str = "_termination";
pub const POLICY: &str = "_pi";
pub const Q_ONLINE: &str = "_Qs.params";
pub const Q_TARGET: &str = "_target_Qs_params";
/// The official second view of the online Q parameters; accepted on load and ignored.
pub const Q_DETACHED: &str = "_detach_Qs_params";
pub const LOG_STD_MIN: &str = "log_std_min";
pub const LOG_STD_DIF: &str = "log_std_dif";

/// Which copy of the Q parameters to evaluate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QParams {
    /// The trained parameters, with gradients.
    Online,
    /// The trained parameters cut from autograd (the policy loss differentiates only w.r.t. the
    /// action).
    Detached,
    /// The Polyak-averaged copy; always evaluated without dropout.
    Target,
}

/// How two sampled Q heads are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QReduce {
    Min,
    Avg,
}

/// The policy prior's output for a batch of latents.
#[derive(Debug)]
pub struct PolicyOutput {
    /// tanh-squashed sampled action.
    pub action: Tensor,
    /// The Gaussian mean before tanh.
    pub mean_raw: Tensor,
    /// tanh of the mean (the deterministic action).
    pub mean: Tensor,
    /// log σ after squashing into [log_std_min, log_std_max].
    pub log_std: Tensor,
    /// −log π(a) (…, 1).
    pub entropy: Tensor,
    /// The official scaled entropy (…, 1).
    pub scaled_entropy: Tensor,
}

/// Model components and their parameter buffers.
#[derive(Debug)]
pub struct WorldModel {
    pub encoder: Encoder,
    pub dynamics: Mlp,
    pub reward: Mlp,
    pub termination: Option<Mlp>,
    pub policy: Mlp,
    pub q: Ensemble,
    pub target_q: Ensemble,
    /// A multitask model's task embedding (the last of the world-model parameters).
    pub task: Option<TaskEmbedding>,
    /// Encoder, dynamics, reward, termination, online Q and task-embedding parameters (the
    /// world-model optimiser).
    pub model_params: FlatParams,
    /// Policy-prior parameters (the policy optimiser).
    pub policy_params: FlatParams,
    /// Target Q parameters, laid out like the online Q range of `model_params`.
    pub target_params: FlatParams,
    pub two_hot: TwoHot,
    pub log_std_min: f64,
    pub log_std_dif: f64,
    pub action_dim: i64,
    pub latent_dim: i64,
    pub obs_dim: i64,
    device: Device,
}

impl WorldModel {
    /// A freshly initialised model. Initialisation draws from torch's global CPU generator, so
    /// the result does not depend on `device`.
    pub fn new(config: &AgentConfig, device: Device) -> Result<Self> {
        config.validate()?;
        let z = config.latent_dim as i64;
        let a = config.action_dim as i64;
        let m = config.mlp_dim as i64;
        let bins = config.num_bins as i64;
        let e = config.tasks.as_ref().map_or(0, |t| t.task_dim as i64);
        let simnorm = Activation::SimNorm(config.simnorm_dim as i64);
        let mut encoder = Encoder::new(config);
        let encoder_prefix = encoder.prefix();
        let mut dynamics = Mlp::new(z + e + a, &[m, m], z, Some(simnorm), 0.0);
        let mut reward = Mlp::new(z + e + a, &[m, m], bins, None, 0.0);
        let mut termination = config.episodic.then(|| Mlp::new(z, &[m, m], 1, None, 0.0));
        let mut policy = Mlp::new(z + e, &[m, m], 2 * a, None, 0.0);
        let q_input = z + e + a;
        let mut q = Ensemble::new(config.num_q as i64, q_input, &[m, m], bins, config.dropout);
        let mut task = config
            .tasks
            .as_ref()
            .map(|tasks| TaskEmbedding::new(tasks, a, device));
        let _ = reward.last_mut().weight.zero_();
        if let Some(last) = q.layers.last_mut() {
            let _ = last.weight.zero_();
        }
        let mut target_q = q.deep_copy();

        let model_params = {
            let mut modules: Vec<(&str, &mut dyn super::params::ParamVisitor)> = vec![
                (encoder_prefix, &mut encoder),
                (DYNAMICS, &mut dynamics),
                (REWARD, &mut reward),
            ];
            if let Some(t) = termination.as_mut() {
                modules.push((TERMINATION, t));
            }
            modules.push((Q_ONLINE, &mut q));
            if let Some(t) = task.as_mut() {
                modules.push((TASK_EMB, t));
            }
            FlatParams::pack(&mut modules, device, true)
        };
        let policy_params = FlatParams::pack(&mut [(POLICY, &mut policy)], device, true);
        let target_params = FlatParams::pack(&mut [(Q_TARGET, &mut target_q)], device, false);
        Ok(Self {
            encoder,
            dynamics,
            reward,
            termination,
            policy,
            q,
            target_q,
            task,
            model_params,
            policy_params,
            target_params,
            two_hot: TwoHot::new(config.num_bins, config.vmin, config.vmax, device),
            log_std_min: config.log_std_min,
            log_std_dif: config.log_std_max - config.log_std_min,
            action_dim: a,
            latent_dim: z,
            obs_dim: config.obs_dim as i64,
            device,
        })
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// The online Q parameters' range `[start, end)` inside `model_params`.
    pub fn q_range(&self) -> (i64, i64) {
        self.model_params
            .range_of(Q_ONLINE)
            .expect("the model has Q parameters")
    }

    /// The encoder's range inside `model_params` (its own learning rate).
    pub fn encoder_range(&self) -> (i64, i64) {
        self.model_params
            .range_of(self.encoder.prefix())
            .expect("the model has an encoder")
    }

    /// The rows of `task` (B,) task ids, for the heads; `None` for a single-task model.
    pub fn task_rows(&self, task: Option<&Tensor>) -> Result<Option<TaskRows>> {
        match (&self.task, task) {
            (Some(table), Some(ids)) => Ok(Some(table.rows(ids)?)),
            (None, None) => Ok(None),
            (Some(_), None) => Err(Error::Config(
                "a multitask model needs the task of every row".into(),
            )),
            (None, Some(_)) => Err(Error::Config(
                "a single-task model takes no task ids".into(),
            )),
        }
    }

    /// Observations (…, obs_dim) → latents (…, latent_dim); pixels draw their random shifts
    /// from `noise` (in training and when acting, as the official does).
    pub fn encode(
        &self,
        obs: &Tensor,
        task: Option<&TaskRows>,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        self.encoder.forward(&task::with_task(obs, task), noise)
    }

    /// Next latent from a latent and an action.
    pub fn next(&self, z: &Tensor, a: &Tensor, task: Option<&TaskRows>) -> Tensor {
        self.dynamics
            .forward(&task::with_task_and_action(z, a, task))
    }

    /// Reward logits (…, num_bins).
    pub fn reward(&self, z: &Tensor, a: &Tensor, task: Option<&TaskRows>) -> Tensor {
        self.reward.forward(&task::with_task_and_action(z, a, task))
    }

    /// [`Self::next`] for latents `z` (G, Z), each shared by N/G consecutive actions of `a`
    /// (N, A).
    pub fn next_shared(&self, z: &Tensor, a: &Tensor) -> Tensor {
        self.dynamics.forward_rollout(z, &[], a)
    }

    /// Termination logits (…, 1), if the model is episodic.
    pub fn termination_logits(&self, z: &Tensor) -> Option<Tensor> {
        self.termination.as_ref().map(|t| t.forward(z))
    }

    /// The policy prior with given standard-normal noise `eps` (shape of the action). With
    /// tasks, the mean, log σ and noise of the components a row's task lacks are zero, and the
    /// entropy is scaled by the task's own action size.
    pub fn pi(&self, z: &Tensor, eps: &Tensor, task: Option<&TaskRows>) -> PolicyOutput {
        let out = self.policy.forward(&task::with_task(z, task));
        let parts = out.chunk(2, -1);
        let log_std = math::squash_log_std(&parts[1], self.log_std_min, self.log_std_dif);
        let (mean_raw, log_std, eps) = match task {
            Some(task) => {
                let mask = task::expanded(&task.mask, &parts[0]);
                (&parts[0] * &mask, log_std * &mask, eps * &mask)
            }
            None => (parts[0].shallow_clone(), log_std, eps.shallow_clone()),
        };
        let gaussian = math::gaussian_log_prob(&eps, &log_std);
        let unsquashed = &mean_raw + &eps * log_std.exp();
        let action = unsquashed.tanh();
        let log_prob = math::squash_correction(&action, &gaussian);
        let scaled_log_prob = match task {
            Some(task) => &gaussian * task::expanded(&task.action_dims, &gaussian),
            None => &gaussian * self.action_dim as f64,
        };
        let scaled_entropy = math::scaled_entropy(&scaled_log_prob, &log_prob);
        PolicyOutput {
            mean: mean_raw.tanh(),
            mean_raw,
            log_std,
            entropy: -&log_prob,
            scaled_entropy,
            action,
        }
    }

    /// Only the sampled action of the policy prior (skips the entropy terms).
    pub fn pi_action(&self, z: &Tensor, eps: &Tensor, task: Option<&TaskRows>) -> Tensor {
        let out = self.policy.forward(&task::with_task(z, task));
        if task.is_none() && out.dim() == 2 && crate::cuda::fused::applies_to(&out) {
            let (low, dif) = (self.log_std_min, self.log_std_dif);
            // The kernel reads one head row per noise row; torch's operations broadcast a
            // single latent's (one environment's policy prior) to all of them.
            let rows = eps.size()[0];
            let head = match out.size()[0] {
                1 if rows > 1 => out.expand([rows, out.size()[1]], false),
                _ => out,
            };
            return crate::cuda::fused::policy_action(
                &head.contiguous(),
                &eps.contiguous(),
                None,
                low,
                dif,
            )
            .unwrap_or_else(|e| panic!("{e} (set fused_kernels=false to run without)"));
        }
        let parts = out.chunk(2, -1);
        let log_std = math::squash_log_std(&parts[1], self.log_std_min, self.log_std_dif);
        let action = (&parts[0] + eps * log_std.exp()).tanh();
        match task {
            // tanh(0·m + 0·ε·σ) = 0: masking after is masking before.
            Some(task) => action * task::expanded(&task.mask, &parts[0]),
            None => action,
        }
    }

    /// [`Self::pi_action`] for latents `z` (G, Z), each shared by N/G consecutive rows of the
    /// noise `eps` (N, A): the policy runs once per latent.
    pub fn pi_action_shared(&self, z: &Tensor, eps: &Tensor) -> Tensor {
        let groups = z.size()[0];
        if groups == 1 {
            return self.pi_action(z, eps, None);
        }
        let out = self.policy.forward(z);
        let parts = out.chunk(2, -1);
        let log_std = math::squash_log_std(&parts[1], self.log_std_min, self.log_std_dif);
        let (rows, a) = (eps.size()[0], eps.size()[1]);
        let eps = eps.view([groups, rows / groups, a]);
        (parts[0].unsqueeze(1) + eps * log_std.exp().unsqueeze(1))
            .tanh()
            .view([rows, a])
    }

    /// Q logits of the chosen heads: (k, …, num_bins). `dropout` (training) supplies the first
    /// layer's masks; the target copy never uses dropout.
    pub fn q_logits(
        &self,
        z: &Tensor,
        a: &Tensor,
        task: Option<&TaskRows>,
        params: QParams,
        heads: &Heads,
        dropout: Option<&mut dyn Noise>,
    ) -> Result<Tensor> {
        let x = task::with_task_and_action(z, a, task);
        match params {
            QParams::Online => self.q.forward(&x, heads, false, dropout),
            QParams::Detached => self.q.forward(&x, heads, true, dropout),
            QParams::Target => self.target_q.forward(&x, heads, false, None),
        }
    }

    /// The official `Q(..., return_type='min'|'avg')`: the two heads of `pair` (see
    /// [`Heads::random_pair`]), decoded and combined; (…, 1).
    #[allow(clippy::too_many_arguments)]
    pub fn q_value(
        &self,
        z: &Tensor,
        a: &Tensor,
        task: Option<&TaskRows>,
        params: QParams,
        pair: &Heads,
        reduce: QReduce,
        dropout: Option<&mut dyn Noise>,
    ) -> Result<Tensor> {
        let logits = self.q_logits(z, a, task, params, pair, dropout)?;
        let values = self.two_hot.decode(&logits);
        Ok(match reduce {
            QReduce::Min => values.amin(0, false),
            QReduce::Avg => values.sum_dim_intlist(0, false, Kind::Float) / 2.0,
        })
    }

    /// Polyak update of the target Qs: θ̄ ← θ̄ + τ(θ − θ̄).
    pub fn soft_update_target(&mut self, tau: f64) {
        let (start, end) = self.q_range();
        let online = self.model_params.flat.narrow(0, start, end - start);
        tch::no_grad(|| {
            let _ = self.target_params.flat.lerp_(&online, tau);
        });
    }

    /// Every state-dict entry: parameters, target Qs and the log-std buffers, on the CPU.
    pub fn named_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for buffer in [&self.model_params, &self.policy_params, &self.target_params] {
            for (entry, view) in buffer.entries.iter().zip(buffer.views()) {
                out.push((
                    entry.name.clone(),
                    view.detach().to_device(Device::Cpu).contiguous(),
                ));
            }
        }
        out.push((LOG_STD_MIN.into(), Tensor::from(self.log_std_min as f32)));
        out.push((LOG_STD_DIF.into(), Tensor::from(self.log_std_dif as f32)));
        if let Some(task) = &self.task {
            out.push((ACTION_MASKS.into(), task.masks.to_device(Device::Cpu)));
        }
        out
    }

    /// Loads a state dict (official keys; a leading `module.` is stripped, `_detach_Qs_params.*`
    /// ignored). Every parameter must be present with its shape; unknown keys are an error.
    pub fn load_named(&mut self, tensors: Vec<(String, Tensor)>) -> Result<()> {
        let mut by_name: HashMap<String, Tensor> = HashMap::new();
        for (name, tensor) in tensors {
            let name = name.strip_prefix("module.").unwrap_or(&name).to_string();
            if name.starts_with(Q_DETACHED) {
                continue;
            }
            by_name.insert(name, tensor);
        }
        // Official code of April 2025 built a termination head for every task, trained only on
        // episodic ones: this model, which ends no episode early, leaves it out.
        let head = format!("{TERMINATION}.");
        if self.termination.is_none() && by_name.keys().any(|n| n.starts_with(&head)) {
            by_name.retain(|name, _| !name.starts_with(&head));
            errln!(
                "note: the state dict has a termination head, which this model (episodic=false) \
                 does not use: left out (give episodic=true if its task ends episodes early)"
            );
        }
        for buffer in [&self.model_params, &self.policy_params, &self.target_params] {
            buffer.load(&mut |name| by_name.remove(name))?;
        }
        if let Some(task) = &self.task {
            // The masks follow from the tasks; a checkpoint's must agree (the official code
            // computes them when a checkpoint has none).
            if let Some(masks) = by_name.remove(ACTION_MASKS) {
                let ours = task.masks.to_device(Device::Cpu);
                if masks.size() != ours.size() || !masks.to_kind(Kind::Float).equal(&ours) {
                    // Each task's number of actions, which is what a mask row says.
                    let actions = |m: &Tensor| match m.size()[..] {
                        [tasks, _] => {
                            let counts = m.to_kind(Kind::Int64).sum_dim_intlist(1, false, None);
                            let counts = Vec::<i64>::try_from(counts).unwrap_or_default();
                            format!("{tasks} tasks of {counts:?} actions")
                        }
                        _ => format!("shape {:?}", m.size()),
                    };
                    return Err(Error::Config(format!(
                        "{ACTION_MASKS} of the state dict ({}) are not those of this model's \
                         tasks ({}): the task lists differ",
                        actions(&masks),
                        actions(&ours)
                    )));
                }
            }
        }
        let mut scalar = |key: &str| -> Result<Option<f64>> {
            match by_name.remove(key) {
                None => Ok(None),
                Some(t) if t.numel() == 1 => {
                    Ok(Some(t.to_kind(Kind::Double).view([-1]).double_value(&[0])))
                }
                Some(t) => Err(Error::Shape {
                    what: key.into(),
                    expected: vec![],
                    got: t.size(),
                }),
            }
        };
        let min = scalar(LOG_STD_MIN)?;
        let dif = scalar(LOG_STD_DIF)?;
        if let Some(min) = min {
            self.log_std_min = min;
        }
        if let Some(dif) = dif {
            self.log_std_dif = dif;
        }
        if !by_name.is_empty() {
            let mut unknown: Vec<String> = by_name.into_keys().collect();
            unknown.sort();
            return Err(Error::Config(format!(
                "unexpected keys in state dict: {}",
                unknown.join(", ")
            )));
        }
        Ok(())
    }

    /// Writes the state dict as safetensors (atomically: a temporary file, then a rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let tensors = self.named_tensors();
        let tmp = path.with_extension("safetensors.tmp");
        let _watched = crate::partial_files::watch(&tmp);
        let fail = |message: String| Error::Checkpoint {
            path: path.display().to_string(),
            message,
        };
        Tensor::write_safetensors(&tensors, &tmp).map_err(|e| fail(e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(|e| fail(e.to_string()))
    }

    /// Reads a safetensors state dict written by [`WorldModel::save`] or [`super::import_official`].
    pub fn load(&mut self, path: &Path) -> Result<()> {
        // A file that cannot be opened is not a damaged one.
        std::fs::File::open(path).map_err(|e| Error::Checkpoint {
            path: path.display().to_string(),
            message: format!("cannot be read: {e}"),
        })?;
        let tensors = Tensor::read_safetensors(path).map_err(|e| Error::Unreadable {
            path: path.display().to_string(),
            message: format!(
                "not a readable safetensors file (truncated, damaged, or another format): {e}"
            ),
        })?;
        let shapes: Vec<(String, Vec<i64>)> =
            tensors.iter().map(|(n, t)| (n.clone(), t.size())).collect();
        let path = path.display().to_string();
        self.load_named(tensors).map_err(|e| {
            // Settings other than the training run's show as a mismatch; a file whose shapes
            // disagree among themselves is damaged whatever the settings.
            match super::state_dict_check::inconsistency(&shapes) {
                Some(why) => Error::Unreadable {
                    path,
                    message: format!("an incomplete or damaged state dict: {why}"),
                },
                None => Error::Mismatch {
                    path,
                    message: e.to_string(),
                },
            }
        })
    }

    /// Copies all parameters of `other` (same architecture) into this model.
    pub fn copy_from(&mut self, other: &WorldModel) -> Result<()> {
        self.copy_acting_weights_from(other)?;
        copy_flat(&self.target_params, &other.target_params)?;
        self.log_std_min = other.log_std_min;
        self.log_std_dif = other.log_std_dif;
        Ok(())
    }

    /// Copies what acting reads (world model and policy, not the target Qs) from `other`: two
    /// device copies of flat buffers.
    pub fn copy_acting_weights_from(&mut self, other: &WorldModel) -> Result<()> {
        copy_flat(&self.model_params, &other.model_params)?;
        copy_flat(&self.policy_params, &other.policy_params)
    }

    /// Number of trainable parameters (world model and policy).
    pub fn num_params(&self) -> i64 {
        self.model_params.numel() + self.policy_params.numel()
    }
}

fn copy_flat(mine: &FlatParams, theirs: &FlatParams) -> Result<()> {
    if mine.entries != theirs.entries {
        return Err(Error::Config(
            "copying parameters: the models' architectures differ".into(),
        ));
    }
    tch::no_grad(|| mine.flat.detach().copy_(&theirs.flat));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::HostNoise;

    fn small_config() -> AgentConfig {
        AgentConfig {
            enc_dim: 32,
            mlp_dim: 32,
            latent_dim: 16,
            num_q: 3,
            dropout: 0.5,
            ..AgentConfig::defaults(None, 5, 2).unwrap()
        }
    }

    #[test]
    fn initial_reward_and_q_decode_to_zero() {
        tch::manual_seed(0);
        let model = WorldModel::new(&small_config(), Device::Cpu).unwrap();
        let z = model
            .encode(
                &Tensor::randn([4, 5], (Kind::Float, Device::Cpu)),
                None,
                &mut HostNoise::seeded(0),
            )
            .unwrap();
        let a = Tensor::zeros([4, 2], (Kind::Float, Device::Cpu));
        let r = model.two_hot.decode(&model.reward(&z, &a, None));
        assert!(r.abs().max().double_value(&[]) < 1e-6);
        let q = model
            .q_value(
                &z,
                &a,
                None,
                QParams::Online,
                &Heads::pair(0, 2, Device::Cpu),
                QReduce::Min,
                None,
            )
            .unwrap();
        assert!(q.abs().max().double_value(&[]) < 1e-6);
        // Names follow the official state dict.
        let names: Vec<String> = model.named_tensors().into_iter().map(|(n, _)| n).collect();
        for key in [
            "_encoder.state.0.ln.weight",
            "_dynamics.2.ln.bias",
            "_reward.2.weight",
            "_pi.2.bias",
            "_Qs.params.0.weight",
            "_target_Qs_params.2.bias",
            "log_std_dif",
        ] {
            assert!(names.iter().any(|n| n == key), "missing {key}");
        }
        assert_eq!(model.q.layers[0].weight.size(), vec![3, 32, 18]);
    }

    #[test]
    fn shared_latents_match_repeated_latents() {
        tch::manual_seed(4);
        let model = WorldModel::new(&small_config(), Device::Cpu).unwrap();
        tch::no_grad(|| {
            let _ = model.policy_params.flat.detach().normal_(0.0, 0.3);
            let _ = model.model_params.flat.detach().normal_(0.0, 0.3);
        });
        let cpu = (Kind::Float, Device::Cpu);
        let z = model
            .encode(&Tensor::randn([3, 5], cpu), None, &mut HostNoise::seeded(0))
            .unwrap();
        let repeated = z.repeat_interleave_self_int(4, 0, None);
        let eps = Tensor::randn([12, 2], cpu);
        let a = Tensor::rand([12, 2], cpu);
        let max_diff = |x: Tensor, y: Tensor| (x - y).abs().max().double_value(&[]);
        let pairs = [
            (
                model.pi_action_shared(&z, &eps),
                model.pi_action(&repeated, &eps, None),
            ),
            (model.next_shared(&z, &a), model.next(&repeated, &a, None)),
        ];
        for (i, (shared, full)) in pairs.into_iter().enumerate() {
            assert_eq!(shared.size(), full.size());
            let diff = max_diff(shared, full);
            assert!(diff < 1e-5, "case {i}: {diff}");
        }
    }

    #[test]
    fn target_qs_never_use_dropout_but_online_qs_do_in_training() {
        tch::manual_seed(1);
        let mut model = WorldModel::new(&small_config(), Device::Cpu).unwrap();
        // Give the final layers weight so dropout is visible in the logits.
        tch::no_grad(|| {
            let _ = model.model_params.flat.normal_(0.0, 0.3);
            let (start, end) = model.q_range();
            let online_q = model.model_params.flat.narrow(0, start, end - start);
            model.target_params.flat.copy_(&online_q);
        });
        let z = Tensor::randn([8, 16], (Kind::Float, Device::Cpu));
        let a = Tensor::randn([8, 2], (Kind::Float, Device::Cpu));
        let mut noise = crate::agent::noise::TorchNoise::seeded(1);
        let eval1 = model
            .q_logits(&z, &a, None, QParams::Online, &Heads::All, None)
            .unwrap();
        let eval2 = model
            .q_logits(&z, &a, None, QParams::Online, &Heads::All, None)
            .unwrap();
        assert!(eval1.allclose(&eval2, 0.0, 0.0, false));
        let target_train = model
            .q_logits(&z, &a, None, QParams::Target, &Heads::All, Some(&mut noise))
            .unwrap();
        assert!((target_train - &eval1).abs().max().double_value(&[]) < 1e-5);
        let train = model
            .q_logits(&z, &a, None, QParams::Online, &Heads::All, Some(&mut noise))
            .unwrap();
        assert!((train - &eval1).abs().max().double_value(&[]) > 1e-3);
        let detached = model
            .q_logits(
                &z,
                &a,
                None,
                QParams::Detached,
                &Heads::All,
                Some(&mut noise),
            )
            .unwrap();
        assert!((detached - &eval1).abs().max().double_value(&[]) > 1e-3);
        model.soft_update_target(0.5);
    }

    #[test]
    fn multitask_models_keep_their_task_embedding_and_refuse_other_task_lists() {
        let tasks = |action_dims: Vec<usize>| crate::agent::task::Tasks {
            task_dim: 4,
            discounts: vec![0.99; action_dims.len()],
            action_dims,
        };
        let config = AgentConfig {
            tasks: Some(tasks(vec![2, 1])),
            ..small_config()
        };
        let model = WorldModel::new(&config, Device::Cpu).unwrap();
        let names: Vec<String> = model.named_tensors().into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"_task_emb.weight".to_string()), "{names:?}");
        assert!(names.contains(&"_action_masks".to_string()));
        let mut same = WorldModel::new(&config, Device::Cpu).unwrap();
        same.load_named(model.named_tensors()).unwrap();
        assert!(same.model_params.flat.equal(&model.model_params.flat));
        let other = AgentConfig {
            tasks: Some(tasks(vec![1, 2])),
            ..small_config()
        };
        let err = WorldModel::new(&other, Device::Cpu)
            .unwrap()
            .load_named(model.named_tensors())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("_action_masks of the state dict (2 tasks of [2, 1] actions)")
                && err.contains("this model's tasks (2 tasks of [1, 2] actions)"),
            "{err}"
        );
        assert!(
            model.task_rows(None).is_err(),
            "a multitask model needs task ids"
        );
    }

    /// A file that lacks a part, or holds one of a shape its other parts contradict, is named
    /// damaged: no settings would load it.
    #[test]
    fn an_incomplete_file_is_damaged_not_a_mismatch() {
        let model = WorldModel::new(&small_config(), Device::Cpu).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let mut named = model.named_tensors();
        named.retain(|(name, _)| name != "_reward.1.bias");
        Tensor::write_safetensors(&named, &path).unwrap();
        let e = WorldModel::new(&small_config(), Device::Cpu)
            .unwrap()
            .load(&path)
            .unwrap_err();
        assert!(matches!(e, Error::Unreadable { .. }), "{e:?}");
        assert!(
            e.to_string()
                .contains("`_reward.1.bias` is missing beside `_reward.1.weight`"),
            "{e}"
        );
        // Whole, but of other settings: a mismatch.
        let other = AgentConfig {
            mlp_dim: small_config().mlp_dim * 2,
            ..small_config()
        };
        model.save(&path).unwrap();
        let e = WorldModel::new(&other, Device::Cpu)
            .unwrap()
            .load(&path)
            .unwrap_err();
        assert!(matches!(e, Error::Mismatch { .. }), "{e:?}");
    }

    #[test]
    fn save_and_load_round_trip() {
        tch::manual_seed(2);
        let config = small_config();
        let model = WorldModel::new(&config, Device::Cpu).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        model.save(&path).unwrap();
        tch::manual_seed(3);
        let mut other = WorldModel::new(&config, Device::Cpu).unwrap();
        other.load(&path).unwrap();
        assert!(other
            .model_params
            .flat
            .allclose(&model.model_params.flat, 0.0, 0.0, false));
        assert!(other
            .policy_params
            .flat
            .allclose(&model.policy_params.flat, 0.0, 0.0, false));
        // A missing key is an error, not a panic.
        let mut partial = model.named_tensors();
        partial.retain(|(n, _)| n != "_pi.0.weight");
        assert!(other.load_named(partial).is_err());
        // Unknown keys are rejected; `module.` prefixes and detached copies are accepted.
        let mut renamed: Vec<(String, Tensor)> = model
            .named_tensors()
            .into_iter()
            .map(|(n, t)| (format!("module.{n}"), t))
            .collect();
        renamed.push((
            "_detach_Qs_params.0.weight".into(),
            Tensor::zeros([1], (Kind::Float, Device::Cpu)),
        ));
        other.load_named(renamed).unwrap();
        let mut extra = model.named_tensors();
        extra.push((
            "bogus".into(),
            Tensor::zeros([1], (Kind::Float, Device::Cpu)),
        ));
        assert!(other.load_named(extra).is_err());
    }
}
