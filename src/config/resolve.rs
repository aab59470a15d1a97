//! The fields the official parse step derives from the task and the settings, and the
//! settings read as the quantities they stand for (the run directory, the learning-rate
//! multiplier).
use std::path::PathBuf;

use super::defaults::preset;
use super::resources::Machine;
use super::validate::range;
use super::Config;
use crate::buffer::{BufferSettings, ObsLayout};
use crate::error::{Error, Result};

/// Features the pixel encoder produces per channel: its 4×4 output map (of 64×64 frames).
pub const PIXEL_FEATURES: usize = 16;

impl Config {
    /// Applies the model-size preset and computes the fields the official parse step derives
    /// from the task: dimensions, episode length, discount, seed steps, planning iterations.
    pub fn resolve(&mut self, spec: &envs::EnvSpec) -> Result<()> {
        let obs = self.obs_kind()?;
        self.apply_model_size()?;
        let length = spec.episode_length;
        // An explicit discount or seed_steps (e.g. from a saved resolved config) is kept.
        let discount = self.discount_for(length);
        self.discount.get_or_insert(discount);
        // Every environment finishes an episode before learning starts.
        let all_envs = (self.num_envs * length) as u64;
        self.seed_steps
            .get_or_insert((5 * length as u64).max(1000).max(all_envs));
        // The official parser adds two planning iterations for large action spaces (dog,
        // humanoid); a config resolved before already has them.
        if self.episode_length.is_none() && spec.action_dim >= 20 {
            self.iterations += 2;
        }
        self.obs_shape = Some(match obs {
            envs::ObsKind::State => spec.obs_shape.clone(),
            envs::ObsKind::Rgb => envs::ObsKind::rgb_shape(),
        });
        self.action_dim = Some(spec.action_dim);
        self.episode_length = Some(length);
        self.bin_size = Some((self.vmax - self.vmin) / (self.num_bins - 1) as f64);
        Ok(())
    }

    /// What training needs of a resolved config beyond what playing needs (`eval` and
    /// `collect` keep no replay buffer, seed nothing and take no steps): seed steps that hold
    /// an episode of every environment, the buffers in memory, and an update's horizon and an
    /// episode within what each rank keeps (the shortest task's episode for the horizon, the
    /// longest's for the rest).
    pub fn check_training_fits(&self) -> Result<()> {
        let longest = self.resolved_episode_length()?;
        let shortest = self
            .episode_lengths
            .as_ref()
            .and_then(|lengths| lengths.iter().min().copied())
            .unwrap_or(longest);
        let seed_steps = self.resolved_seed_steps()?;
        // Offline runs seed nothing: their data is the dataset.
        if !self.offline() && seed_steps < (self.num_envs * longest) as u64 {
            return Err(range(
                "seed_steps",
                seed_steps,
                &format!(
                    "must be >= num_envs × the episode length ({} × {longest}), so that the \
                     buffer holds an episode of every environment before the first update",
                    self.num_envs
                ),
            ));
        }
        self.check_resources(&Machine::this())?;
        // Offline, the replay buffer is not used: batches come from the dataset files (whose
        // episodes are checked against the horizon as they are read).
        match self.offline() {
            true => Ok(()),
            false => {
                self.check_horizon_fits(shortest)?;
                self.check_episode_fits(longest)
            }
        }
    }

    /// The widths the model-size preset sets, over those given (as the official parser).
    /// Returns the settings it set.
    pub fn apply_model_size(&mut self) -> Result<Vec<&'static str>> {
        let obs = self.obs_kind()?;
        let Some(p) = self.model_size.and_then(preset) else {
            return Ok(Vec::new());
        };
        self.enc_dim = p.enc_dim;
        self.mlp_dim = p.mlp_dim;
        self.num_enc_layers = p.num_enc_layers;
        let mut set = vec!["enc_dim", "mlp_dim", "num_enc_layers"];
        // With pixels the latent is the convolutional encoder's flattened output, whatever the
        // size.
        if obs == envs::ObsKind::State {
            self.latent_dim = p.latent_dim;
            set.push("latent_dim");
        }
        if let Some(num_q) = p.num_q {
            self.num_q = num_q;
            set.push("num_q");
        }
        Ok(set)
    }

    /// Whether the run trains on a dataset (`data_dir`) instead of its own experience.
    pub fn offline(&self) -> bool {
        self.data_dir.is_some()
    }

    /// Resolves a multitask run against each task's environment (`specs` in task-id order), as
    /// the official parser: observations padded to the largest, the largest action size, and
    /// the official `task_dim` (and latent_dim 512 for mt30 at model size 19). The longest
    /// episode sizes what must hold an episode (seed steps, the buffer); each task keeps its own
    /// length, and so its discount.
    pub fn resolve_tasks(&mut self, specs: &[envs::EnvSpec]) -> Result<()> {
        let tasks = self.tasks()?;
        if specs.len() != tasks.len() {
            return Err(Error::Config(format!(
                "task={} has {} tasks, but {} environments were given",
                self.task,
                tasks.len(),
                specs.len()
            )));
        }
        let widest = specs.iter().map(envs::EnvSpec::obs_dim).max().unwrap_or(0);
        let largest = specs.iter().map(|s| s.action_dim).max().unwrap_or(0);
        let longest = specs.iter().map(|s| s.episode_length).max().unwrap_or(0);
        let padded = envs::EnvSpec {
            obs_shape: vec![widest],
            action_dim: largest,
            episode_length: longest,
        };
        let given_discount = self.discount;
        self.resolve(&padded)?;
        // Each task's discount follows its own episode length (the one kept here is the
        // longest's, for what a config shows): another set here would be ignored.
        match given_discount {
            Some(given) if given != self.discount_for(longest) => {
                return Err(Error::Config(format!(
                    "discount={given} is not used by a task list: each task's discount follows \
                     its episode length (discount_denom, discount_min, discount_max), as in the \
                     official code; leave discount unset"
                )))
            }
            _ => {}
        }
        if self.task == "mt30" && self.model_size == Some(19) {
            self.latent_dim = 512;
        }
        self.task_dim = super::tasks::task_dim(&self.task, self.model_size);
        self.obs_shapes = Some(specs.iter().map(envs::EnvSpec::obs_dim).collect());
        self.action_dims = Some(specs.iter().map(|s| s.action_dim).collect());
        self.episode_lengths = Some(specs.iter().map(|s| s.episode_length).collect());
        Ok(())
    }

    /// The official discount of episodes of `length` steps: (L/d − 1)/(L/d) with d =
    /// `discount_denom`, clipped to [discount_min, discount_max].
    pub fn discount_for(&self, length: usize) -> f64 {
        let denom = length as f64 / self.discount_denom;
        // An infinite denominator (a tiny discount_denom) is the limit 1, before clipping.
        let discount = if denom.is_finite() {
            (denom - 1.0) / denom
        } else {
            1.0
        };
        // clip(x, min, max) as max then min: never a panic, even on an unvalidated config.
        discount.max(self.discount_min).min(self.discount_max)
    }

    /// The tasks of the run, in task-id order (one for a single-task run).
    pub fn tasks(&self) -> Result<Vec<String>> {
        super::tasks::task_list(&self.task)
    }

    /// Whether the run trains one multitask model on several tasks.
    pub fn multitask(&self) -> bool {
        super::tasks::is_multitask(&self.task)
    }

    /// An update samples horizon + 1 consecutive rows of one episode, which has L + 1 (its
    /// first observation too): a longer horizon would leave the buffer never able to give a
    /// batch, and the run would never learn.
    fn check_horizon_fits(&self, length: usize) -> Result<()> {
        if self.horizon <= length {
            return Ok(());
        }
        Err(range(
            "horizon",
            self.horizon,
            &format!(
                "must be <= the episode length of {} ({length} steps): an update samples \
                 horizon + 1 consecutive observations of one episode",
                self.task
            ),
        ))
    }

    /// Each rank keeps min(buffer_size, steps / world_size) rows, and an episode of L steps
    /// takes L + 1 of them (its first observation too).
    fn check_episode_fits(&self, length: usize) -> Result<()> {
        let rows = length as u64 + 1;
        if (self.buffer_size as u64) < rows {
            return Err(range(
                "buffer_size",
                self.buffer_size,
                &format!(
                    "must hold one whole episode of {}: >= episode_length + 1 = {rows} rows",
                    self.task
                ),
            ));
        }
        let world = self.world_size.max(1) as u64;
        if self.steps / world < rows {
            // A resumed run's steps are the whole run's, the checkpoint's included: a user who
            // gave the steps still to go meets this first.
            let resumed = match self.resume {
                Some(_) => {
                    " (with resume, steps is the whole run's total from step 0, not the steps \
                     after the checkpoint: give at least the checkpoint's step)"
                }
                None => "",
            };
            return Err(range(
                "steps",
                self.steps,
                &format!(
                    "each of the world_size={world} ranks runs steps / world_size = {} steps, \
                     but one episode of {} needs {rows} (its {length} steps and the first \
                     observation); use steps >= world_size × {rows} = {}{resumed}",
                    self.steps / world,
                    self.task,
                    rows * world
                ),
            ));
        }
        Ok(())
    }

    /// The learning-rate multiplier for the effective batch (world_size × sync_freq).
    pub fn lr_multiplier(&self) -> f64 {
        let batches = (self.world_size * self.sync_freq) as f64;
        match self.lr_scale.as_str() {
            "linear" => batches,
            "sqrt" => batches.sqrt(),
            _ => 1.0,
        }
    }

    /// The run directory: `run_dir`, else `runs/<task>/<exp_name>/<seed>`; a run that a W&B
    /// sweep's agent started (it sets `WANDB_SWEEP_ID` and `WANDB_RUN_ID`) gets
    /// `<seed>-<run id>`, so that the sweep's runs of one seed do not share a directory (a
    /// second would be refused as a finished run's).
    pub fn run_dir(&self) -> PathBuf {
        let sweep_run = std::env::var_os("WANDB_SWEEP_ID")
            .and_then(|_| std::env::var("WANDB_RUN_ID").ok())
            .filter(|id| !id.is_empty());
        self.run_dir_of(sweep_run.as_deref())
    }

    pub(super) fn run_dir_of(&self, sweep_run: Option<&str>) -> PathBuf {
        if let Some(dir) = &self.run_dir {
            return PathBuf::from(dir);
        }
        let last = match sweep_run {
            Some(id) => format!("{}-{id}", self.seed),
            None => self.seed.to_string(),
        };
        PathBuf::from("runs")
            .join(self.run_name())
            .join(&self.exp_name)
            .join(last)
    }

    /// The task as the default run directory names it: a list of tasks joined by `+`
    /// (`walker-run+cup-catch`), no brackets.
    fn run_name(&self) -> String {
        match (self.task.starts_with('['), self.tasks()) {
            (true, Ok(tasks)) => {
                let joined = tasks.join("+");
                // A folder name takes 255 bytes: a long list is named by its first task, its
                // length and a checksum of the whole.
                match joined.len() <= super::MOST_NAME_BYTES {
                    true => joined,
                    false => format!(
                        "{}+{}-more-{:08x}",
                        tasks[0],
                        tasks.len() - 1,
                        crc32c::crc32c(joined.as_bytes())
                    ),
                }
            }
            _ => self.task.clone(),
        }
    }

    /// What the agent observes (`obs`).
    pub fn obs_kind(&self) -> Result<envs::ObsKind> {
        envs::ObsKind::parse(&self.obs).ok_or_else(|| {
            Error::Config(format!(
                "obs={} is not an observation kind; allowed: state, rgb",
                self.obs
            ))
        })
    }

    /// How rank `rank` makes its environments: what the agent observes, and whether they
    /// render evaluation videos (`save_video`: rank 0 films).
    pub fn env_options(&self, rank: usize) -> Result<envs::EnvOptions> {
        Ok(envs::EnvOptions {
            obs: self.obs_kind()?,
            videos: self.save_video && rank == 0,
        })
    }

    /// A rank's replay buffer: min(buffer_size, steps / world_size) rows, as many as the rank
    /// can ever fill, laid out for the observations. Offline it stays empty: one row.
    pub fn buffer_settings(&self) -> Result<BufferSettings> {
        let local_steps = self.steps / self.world_size.max(1) as u64;
        let capacity = match self.offline() {
            true => 1,
            false => (self.buffer_size as u64).min(local_steps.max(1)) as usize,
        };
        Ok(BufferSettings {
            capacity,
            obs: ObsLayout::new(self.obs_kind()?, self.resolved_obs_dim()?),
            action_dim: self.resolved_action_dim()?,
            batch_size: self.batch_size,
        })
    }

    pub fn resolved_obs_dim(&self) -> Result<usize> {
        resolved(self.obs_shape.as_ref().map(|s| s.iter().product()))
    }

    /// Each task's own observation size, in task-id order (the one task's, for a single task).
    pub fn resolved_obs_shapes(&self) -> Result<Vec<usize>> {
        match self.multitask() {
            true => resolved(self.obs_shapes.clone()),
            false => Ok(vec![self.resolved_obs_dim()?]),
        }
    }

    pub fn resolved_action_dim(&self) -> Result<usize> {
        resolved(self.action_dim)
    }

    /// The longest episode (of any task, in a multitask run).
    pub fn resolved_episode_length(&self) -> Result<usize> {
        resolved(self.episode_length)
    }

    pub fn resolved_discount(&self) -> Result<f64> {
        resolved(self.discount)
    }

    pub fn resolved_seed_steps(&self) -> Result<u64> {
        resolved(self.seed_steps)
    }
}

/// A derived field, or the error every reader of an unresolved config gets.
fn resolved<T>(value: Option<T>) -> Result<T> {
    value.ok_or_else(|| Error::Config("the config must be resolved against the task first".into()))
}
