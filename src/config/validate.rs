//! Range checks of a loaded config that need no environment. Every error names the key and
//! what is allowed.
use super::defaults::{preset, DEVICES, DIST_BACKENDS, LAUNCHERS, LR_SCALES, MODEL_SIZES};
use super::{Config, MOST_NAME_BYTES};
use crate::error::{Error, Result};

/// |x| bound of vmin, vmax and the log-std limits: e^80 is still a finite 32-bit float.
const EXP_LIMIT: f64 = 80.0;

impl Config {
    /// Range checks that need no environment. Each error names the key and what is allowed;
    /// with several mistakes, the first in this order is reported.
    pub fn validate(&self) -> Result<()> {
        self.validate_floats()?;
        self.validate_sizes()?;
        self.validate_unsupported()?;
        self.validate_planning()?;
        self.validate_architecture()?;
        self.validate_learning()?;
        self.validate_supports()?;
        self.validate_rendezvous()?;
        self.validate_modes()?;
        self.validate_collectives()?;
        self.validate_run()
    }

    /// A project name W&B takes: it refuses others when the run starts, after the run
    /// directory is made.
    fn validate_wandb_project(&self) -> Result<()> {
        const MOST: usize = 128;
        const REFUSED: &str = super::tracker_env::PROJECT_REFUSED;
        let project = &self.wandb_project;
        let refused = |why: String| {
            Error::Config(format!(
                "wandb_project={project}: {why} (W&B refuses it when the run starts)"
            ))
        };
        if project.chars().count() > MOST {
            return Err(refused(format!(
                "a project name has at most {MOST} characters"
            )));
        }
        match project.chars().find(|c| REFUSED.contains(*c)) {
            Some(c) => Err(refused(format!(
                "a project name has none of {REFUSED}, and this one has '{c}'"
            ))),
            None => Ok(()),
        }
    }

    /// MPPI: the elite and policy-trajectory counts fit the samples; the std bounds.
    fn validate_planning(&self) -> Result<()> {
        if !(self.rho > 0.0 && self.rho <= 1.0) {
            return Err(range("rho", short(self.rho), "must satisfy 0 < rho <= 1"));
        }
        if self.num_pi_trajs >= self.num_samples {
            return Err(range(
                "num_pi_trajs",
                self.num_pi_trajs,
                &format!("must be < num_samples ({})", self.num_samples),
            ));
        }
        if self.num_elites > self.num_samples {
            return Err(range(
                "num_elites",
                self.num_elites,
                &format!("must be <= num_samples ({})", self.num_samples),
            ));
        }
        if self.min_std > self.max_std {
            return Err(range(
                "min_std",
                short(self.min_std),
                &format!("must be <= max_std ({})", short(self.max_std)),
            ));
        }
        if self.min_std <= 0.0 {
            return Err(range("min_std", short(self.min_std), "must be > 0"));
        }
        Ok(())
    }

    /// The model size, the Q ensemble and dropout.
    fn validate_architecture(&self) -> Result<()> {
        if let Some(size) = self.model_size {
            if preset(size).is_none() {
                return Err(Error::Config(format!(
                    "model_size={size} is not a model size; valid sizes: {}",
                    join(&MODEL_SIZES)
                )));
            }
        }
        if self.num_q < 2 {
            return Err(range(
                "num_q",
                self.num_q,
                "must be >= 2 (two heads are drawn per Q estimate)",
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(range(
                "dropout",
                short(self.dropout),
                "must satisfy 0 <= dropout < 1",
            ));
        }
        Ok(())
    }

    /// Learning rates, coefficients and the discount rule.
    fn validate_learning(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.tau) {
            return Err(range("tau", short(self.tau), "must satisfy 0 <= tau <= 1"));
        }
        if self.lr <= 0.0 {
            return Err(range("lr", short(self.lr), "must be > 0"));
        }
        if self.grad_clip_norm <= 0.0 {
            return Err(range(
                "grad_clip_norm",
                short(self.grad_clip_norm),
                "must be > 0",
            ));
        }
        for (key, value) in [
            ("reward_coef", self.reward_coef),
            ("value_coef", self.value_coef),
            ("termination_coef", self.termination_coef),
            ("consistency_coef", self.consistency_coef),
            ("entropy_coef", self.entropy_coef),
            ("enc_lr_scale", self.enc_lr_scale),
            ("temperature", self.temperature),
        ] {
            if value < 0.0 {
                return Err(range(key, short(value), "must be >= 0"));
            }
        }
        if self.discount_denom <= 0.0 {
            return Err(range(
                "discount_denom",
                short(self.discount_denom),
                "must be > 0",
            ));
        }
        if !(self.discount_min > 0.0 && self.discount_min < 1.0) {
            return Err(range(
                "discount_min",
                short(self.discount_min),
                "must satisfy 0 < discount_min < 1",
            ));
        }
        if !(self.discount_max >= self.discount_min && self.discount_max < 1.0) {
            return Err(range(
                "discount_max",
                short(self.discount_max),
                &format!(
                    "must satisfy discount_min ({}) <= discount_max < 1",
                    short(self.discount_min)
                ),
            ));
        }
        if let Some(discount) = self.discount {
            if !(discount > 0.0 && discount < 1.0) {
                return Err(range(
                    "discount",
                    short(discount),
                    "must satisfy 0 < discount < 1",
                ));
            }
        }
        Ok(())
    }

    /// The value support and the policy's log-std bounds.
    fn validate_supports(&self) -> Result<()> {
        for (key, value) in [
            ("vmin", self.vmin),
            ("vmax", self.vmax),
            ("log_std_min", self.log_std_min),
            ("log_std_max", self.log_std_max),
        ] {
            if value.abs() > EXP_LIMIT {
                return Err(range(
                    key,
                    short(value),
                    &format!(
                        "must be within [-{EXP_LIMIT}, {EXP_LIMIT}] (its exponential must be a \
                         finite 32-bit float)"
                    ),
                ));
            }
        }
        if self.num_bins < 2 || self.vmin >= self.vmax {
            return Err(Error::Config(format!(
                "num_bins={} vmin={} vmax={}: need num_bins >= 2 and vmin < vmax",
                self.num_bins,
                short(self.vmin),
                short(self.vmax)
            )));
        }
        if self.log_std_min >= self.log_std_max {
            return Err(range(
                "log_std_min",
                short(self.log_std_min),
                &format!("must be < log_std_max ({})", short(self.log_std_max)),
            ));
        }
        Ok(())
    }

    /// Nodes, ranks, the rendezvous address and the device.
    fn validate_rendezvous(&self) -> Result<()> {
        if self.node_rank >= self.nnodes {
            return Err(range(
                "node_rank",
                self.node_rank,
                &format!("must be < nnodes ({})", self.nnodes),
            ));
        }
        if !self.world_size.is_multiple_of(self.nnodes) {
            return Err(Error::Config(format!(
                "world_size={} cannot be split over nnodes={}: every node runs world_size / \
                 nnodes ranks, so world_size must be a multiple of nnodes (nnodes and \
                 node_rank are the built-in launcher's; under torchrun or SLURM, which place \
                 the ranks themselves, leave them out)",
                self.world_size, self.nnodes
            )));
        }
        if self.master_port == 0 {
            return Err(range("master_port", 0, "must be a port number 1..=65535"));
        }
        if self.master_addr.trim().is_empty() {
            return Err(Error::Config(
                "master_addr is empty; give the host name or address of node 0".into(),
            ));
        }
        let gpu_index = self.device.strip_prefix("cuda:").map(str::parse::<u32>);
        if !DEVICES.contains(&self.device.as_str()) && !matches!(gpu_index, Some(Ok(_))) {
            return Err(Error::Config(format!(
                "device={} is not a device; allowed: {}, cuda:N",
                self.device,
                DEVICES.join(", ")
            )));
        }
        Ok(())
    }

    /// Training online on a task known to end episodes early takes its terminations: with
    /// episodic=false the run would stop at the first early end, hours in. (Playing a model
    /// made so, with `eval` or `collect`, stays allowed.)
    pub fn refuse_untaken_terminations(&self) -> Result<()> {
        let untaken = !self.multitask() && !self.offline() && !self.episodic;
        match untaken && super::tasks::ends_early(&self.task) {
            true => Err(Error::Config(format!(
                "task={} ends episodes early (it falls, crashes or reaches its goal), which a run \
                 with episodic=false refuses at the first one; leave episodic to the task (it \
                 sets episodic=true itself)",
                self.task
            ))),
            false => Ok(()),
        }
    }

    /// The observation mode and the learning-rate scaling rule.
    fn validate_modes(&self) -> Result<()> {
        if self.multitask() {
            let tasks = self.tasks()?;
            if self.obs_kind()? != envs::ObsKind::State || self.episodic {
                return Err(Error::Config(format!(
                    "task={} trains one model on {} tasks, which observes states and is not \
                     episodic (as the official); use obs=state episodic=false",
                    self.task,
                    tasks.len()
                )));
            }
            if let Some(task) = tasks.iter().find(|task| super::tasks::ends_early(task)) {
                return Err(Error::Config(format!(
                    "task={}: {task} ends episodes early (it falls, crashes or reaches its goal), \
                     and a model of \
                     several tasks takes no terminations (as the official); train {task} alone \
                     (task={task}, which sets episodic=true)",
                    self.task
                )));
            }
        }
        // The model-size presets leave latent_dim alone with pixels (see `resolve`), so the
        // rule holds as loaded.
        if self.obs_kind()? == envs::ObsKind::Rgb
            && self.latent_dim != super::PIXEL_FEATURES * self.num_channels
        {
            return Err(Error::Config(format!(
                "obs=rgb needs latent_dim = {} × num_channels (the convolutional encoder's 4×4 \
                 output, flattened: 512 with num_channels=32); got latent_dim={} with \
                 num_channels={}",
                super::PIXEL_FEATURES,
                self.latent_dim,
                self.num_channels
            )));
        }
        if self.save_video && envs::native::TASKS.contains(&self.task.as_str()) {
            return Err(Error::Config(format!(
                "save_video=true films evaluations, and the native task {} draws no images; \
                 use task=gym:{} (gymnasium's own, which renders) or save_video=false",
                self.task, self.task
            )));
        }
        if !LR_SCALES.contains(&self.lr_scale.as_str()) {
            return Err(Error::Config(format!(
                "lr_scale={} is not a scaling rule; allowed: {}",
                self.lr_scale,
                LR_SCALES.join(", ")
            )));
        }
        Ok(())
    }

    /// Backends, launchers and the peer timeout.
    fn validate_collectives(&self) -> Result<()> {
        if !DIST_BACKENDS.contains(&self.dist_backend.as_str()) {
            return Err(Error::Config(format!(
                "dist_backend={} is not a backend; allowed: {}",
                self.dist_backend,
                DIST_BACKENDS.join(", ")
            )));
        }
        if !LAUNCHERS.contains(&self.launcher.as_str()) {
            return Err(Error::Config(format!(
                "launcher={} is not a launcher; allowed: {}",
                self.launcher,
                LAUNCHERS.join(", ")
            )));
        }
        if self.peer_timeout > self.dist_timeout && self.dist_timeout > 0 {
            // Either may be the one given: both are named, and a default as such.
            let default = Self::defaults()?.peer_timeout;
            let peer = match self.peer_timeout == default {
                true => format!("peer_timeout ({}, its default)", self.peer_timeout),
                false => format!("peer_timeout={}", self.peer_timeout),
            };
            return Err(Error::Config(format!(
                "dist_timeout={} is below {peer}: a silent node is named after peer_timeout, \
                 which must not exceed dist_timeout; raise dist_timeout or lower peer_timeout",
                self.dist_timeout
            )));
        }
        if !(1..=self.dist_timeout.max(1)).contains(&self.peer_timeout) {
            return Err(range(
                "peer_timeout",
                self.peer_timeout,
                &format!(
                    "must be >= 1 second and <= dist_timeout ({})",
                    self.dist_timeout
                ),
            ));
        }
        Ok(())
    }

    /// Offline training reads what the official datasets hold: no terminations, no pixels.
    fn validate_offline(&self) -> Result<()> {
        if self.episodic {
            return Err(Error::Config(
                "episodic=true with data_dir: the dataset files hold no terminations; \
                 offline training takes episodic=false"
                    .into(),
            ));
        }
        if self.obs != "state" {
            return Err(Error::Config(format!(
                "obs={} with data_dir: the dataset files hold states; offline training takes \
                 obs=state",
                self.obs
            )));
        }
        if self.pipeline {
            return Err(Error::Config(
                "pipeline=true with data_dir: offline training only updates, there is no \
                 acting to overlap; use pipeline=false"
                    .into(),
            ));
        }
        if self.save_buffer {
            return Err(Error::Config(
                "save_buffer=true with data_dir: offline training has no replay buffer (its \
                 batches come from the dataset files); use save_buffer=false"
                    .into(),
            ));
        }
        Ok(())
    }

    /// A folder name longer than file systems take fails only when the run makes it (a
    /// sweep's job, named for its values, when its turn comes): refused here.
    fn validate_folder_names(&self) -> Result<()> {
        let dir = self.run_dir_of(None);
        if let Some(long) = dir
            .components()
            .find(|part| part.as_os_str().len() > MOST_NAME_BYTES)
        {
            let name = long.as_os_str().to_string_lossy();
            return Err(Error::Config(format!(
                "the run directory {} has a folder name of {} bytes ({}…), more than the \
                 {MOST_NAME_BYTES} a file system takes: give a shorter run_dir (or exp_name)",
                dir.display(),
                long.as_os_str().len(),
                name.chars().take(40).collect::<String>()
            )));
        }
        Ok(())
    }

    /// Resume, threads, environments per update and the SimNorm groups.
    fn validate_run(&self) -> Result<()> {
        if let Some(resume) = &self.resume {
            if resume.is_empty() {
                return Err(Error::Config(
                    "resume= is empty; use resume=auto or resume=PATH".into(),
                ));
            }
        }
        let named = [
            ("task", Some(self.task.as_str())),
            ("data_dir", self.data_dir.as_deref()),
            ("checkpoint", self.checkpoint.as_deref()),
            ("run_dir", self.run_dir.as_deref()),
            ("exp_name", Some(self.exp_name.as_str())),
            ("wandb_project", Some(self.wandb_project.as_str())),
            ("wandb_entity", self.wandb_entity.as_deref()),
            ("wandb_name", self.wandb_name.as_deref()),
        ];
        if let Some((key, _)) = named
            .iter()
            .find(|(_, v)| v.is_some_and(|v| v.trim().is_empty()))
        {
            return Err(Error::Config(format!(
                "{key}= is empty (an unset variable?); give a value, or leave {key} out"
            )));
        }
        // exp_name is a folder under runs/<task>/: it may nest, never leave that tree.
        let exp_name = std::path::Path::new(&self.exp_name);
        use std::path::Component;
        let parts: Vec<Component> = exp_name.components().collect();
        let leaves = exp_name.is_absolute()
            || parts
                .iter()
                .any(|part| !matches!(part, Component::Normal(_) | Component::CurDir))
            || !parts
                .iter()
                .any(|part| matches!(part, Component::Normal(_)));
        if leaves {
            return Err(Error::Config(format!(
                "exp_name={} is a folder under runs/<task>/ and stays in it: no leading /, no \
                 .. and not . alone (give run_dir=PATH to write elsewhere)",
                self.exp_name
            )));
        }
        self.validate_folder_names()?;
        if self.data_dir.is_some() {
            self.validate_offline()?;
        }
        if self.enable_wandb {
            self.validate_wandb_project()?;
        }
        if self.num_threads == Some(0) {
            return Err(range(
                "num_threads",
                0,
                "must be >= 1 (or null for cores / local ranks)",
            ));
        }
        if !self.num_envs.is_multiple_of(self.steps_per_update) {
            return Err(Error::Config(format!(
                "steps_per_update={} must divide num_envs={}: each vector step of num_envs \
                 environments makes num_envs / steps_per_update updates",
                self.steps_per_update, self.num_envs
            )));
        }
        if self.simnorm_dim > 0 && !self.latent_dim.is_multiple_of(self.simnorm_dim) {
            return Err(Error::Config(format!(
                "latent_dim={} must be a multiple of simnorm_dim={}",
                self.latent_dim, self.simnorm_dim
            )));
        }
        Ok(())
    }

    /// Keys of the official config this trainer accepts but does not implement: their
    /// defaults are fine, anything else is refused rather than silently ignored.
    fn validate_unsupported(&self) -> Result<()> {
        let defaults = Config::defaults()?;
        let mut unsupported = vec![(
            "save_agent",
            self.save_agent.to_string(),
            defaults.save_agent.to_string(),
            "checkpoints are always written (save_freq spaces them)".to_string(),
        )];
        // Several tasks: the official rule sets task_dim when the run is resolved. One task
        // has none, which 0 says too (as the official parser sets it).
        let official_task_dim = super::tasks::task_dim(&self.task, self.model_size);
        if self.multitask() && self.task_dim != official_task_dim {
            unsupported.push((
                "task_dim",
                self.task_dim.to_string(),
                defaults.task_dim.to_string(),
                format!(
                    "a task list's embedding width follows the official rule (96 for mt80 or \
                     model sizes 1 and 317, else 64): {official_task_dim} here, whatever is set"
                ),
            ));
        }
        if !self.multitask() && self.task_dim != 0 {
            unsupported.push((
                "task_dim",
                self.task_dim.to_string(),
                defaults.task_dim.to_string(),
                "it sizes the task embedding of a multitask model (task=mt30, mt80 or \
                 [task,task,...]); a single task has none, which task_dim=0 says too, as the \
                 official parser sets it"
                    .to_string(),
            ));
        }
        for (key, value, default, why) in unsupported {
            if value != default {
                return Err(Error::Config(format!(
                    "{key}={value} is not supported: {why}; leave {key} at {default}"
                )));
            }
        }
        Ok(())
    }
}

/// A float as a user would write it: 1e300, not 301 digits.
pub(super) fn short(x: f64) -> String {
    if x != 0.0 && !(1e-6..1e16).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        x.to_string()
    }
}

pub(super) fn range(key: &str, value: impl std::fmt::Display, allowed: &str) -> Error {
    Error::Config(format!("{key}={value} is out of range: {allowed}"))
}

fn join(values: &[u32]) -> String {
    values
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
