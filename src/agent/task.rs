//! Multitask models (the official `multitask`): a learned embedding of each task, given with
//! the latent to every head, and each task's action mask and discount.
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::error::{Error, Result};
use super::params::ParamVisitor;

/// The embedding table's state-dict prefix (`_task_emb.weight`).
pub const TASK_EMB: &str = "_task_emb";
/// The state-dict key of the per-task action masks.
pub const ACTION_MASKS: &str = "_action_masks";
/// Rows longer than this are scaled back to it at each lookup (`nn.Embedding(max_norm=1)`).
const MAX_NORM: f64 = 1.0;
/// The official initialisation of the embedding: uniform in ±0.02.
const INIT_RANGE: f64 = 0.02;

/// The tasks of a multitask model, in task-id order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tasks {
    /// Width of a task's embedding (`task_dim`).
    pub task_dim: usize,
    /// Each task's own action size; the model's `action_dim` is the largest.
    pub action_dims: Vec<usize>,
    /// Each task's discount, from its episode length by the single-task rule.
    pub discounts: Vec<f64>,
}

impl Tasks {
    pub fn len(&self) -> usize {
        self.action_dims.len()
    }

    pub fn is_empty(&self) -> bool {
        self.action_dims.is_empty()
    }

    /// Rejects tasks a model of `action_dim` cannot serve.
    pub fn validate(&self, action_dim: usize) -> Result<()> {
        let fail = |msg: String| Err(Error::Config(msg));
        if self.is_empty() || self.discounts.len() != self.len() {
            return fail(format!(
                "a multitask model needs one action size and one discount per task, got {} and {}",
                self.len(),
                self.discounts.len()
            ));
        }
        if self.task_dim == 0 {
            return fail("task_dim must be at least 1 with several tasks".into());
        }
        if let Some(&a) = self.action_dims.iter().find(|&&a| a == 0 || a > action_dim) {
            return fail(format!(
                "a task's action size must be in 1..={action_dim} (action_dim), got {a}"
            ));
        }
        Ok(())
    }
}

/// The embedding table (a parameter of the world model) and the per-task constants.
#[derive(Debug)]
pub struct TaskEmbedding {
    /// (num_tasks, task_dim).
    pub weight: Tensor,
    /// (num_tasks, action_dim): 1 for each task's own action components, 0 for the padding.
    pub masks: Tensor,
    /// (num_tasks,) each task's action size, as floats.
    action_dims: Tensor,
    /// (num_tasks,).
    discounts: Tensor,
    /// The rows lookups renormalise instead of their own, while set (see
    /// [`Self::renormalise_as`]).
    renormalised: Option<Tensor>,
}

/// The task of each row of a batch, looked up.
#[derive(Debug)]
pub struct TaskRows {
    /// (B, task_dim).
    pub emb: Tensor,
    /// (B, action_dim).
    pub mask: Tensor,
    /// (B, 1) each row's own action size.
    pub action_dims: Tensor,
    /// (B, 1).
    pub discount: Tensor,
}

impl TaskRows {
    /// The rows for `n` rows laid out environment-major: each of these B rows repeated n/B
    /// times (itself when n = B). `n` is a multiple of B (the planner's rows are groups of
    /// the environments' rows).
    pub fn for_rows(&self, n: i64) -> TaskRows {
        let b = self.emb.size()[0];
        debug_assert!(n >= b && n % b.max(1) == 0, "{n} rows for {b} environments");
        let repeat = |t: &Tensor| match n / b.max(1) {
            1 => t.shallow_clone(),
            k => t.repeat_interleave_self_int(k, 0, None),
        };
        TaskRows {
            emb: repeat(&self.emb),
            mask: repeat(&self.mask),
            action_dims: repeat(&self.action_dims),
            discount: repeat(&self.discount),
        }
    }
}

impl TaskEmbedding {
    /// Initialised as the official (uniform in ±0.02), from torch's global CPU generator.
    pub fn new(tasks: &Tasks, action_dim: i64, device: Device) -> Self {
        let n = tasks.len() as i64;
        let weight = Tensor::empty([n, tasks.task_dim as i64], (Kind::Float, Device::Cpu))
            .uniform_(-INIT_RANGE, INIT_RANGE);
        let columns = Tensor::arange(action_dim, (Kind::Int64, Device::Cpu));
        let dims: Vec<i64> = tasks.action_dims.iter().map(|&a| a as i64).collect();
        let dims = Tensor::from_slice(&dims);
        let masks = columns
            .unsqueeze(0)
            .lt_tensor(&dims.unsqueeze(1))
            .to_kind(Kind::Float);
        let discounts: Vec<f32> = tasks.discounts.iter().map(|&d| d as f32).collect();
        Self {
            weight,
            masks: masks.to_device(device),
            action_dims: dims.to_kind(Kind::Float).to_device(device),
            discounts: Tensor::from_slice(&discounts).to_device(device),
            renormalised: None,
        }
    }

    /// Until called again with `None`, every lookup renormalises the rows `rows` marks (a
    /// (num_tasks,) mask, nonzero where a row is renormalised) instead of those it looks up:
    /// with several ranks, the union of the rows all ranks look up at that point, as one batch
    /// of all their samples would, so that the ranks' tables stay equal.
    pub fn renormalise_as(&mut self, rows: Option<Tensor>) {
        self.renormalised = rows;
    }

    /// Renormalises every row, as looking up each task once does: what an evaluation of all
    /// the tasks leaves in the official model it trains, where ours acted on a copy.
    pub fn renormalise_every_row(&mut self) -> Result<()> {
        tch::no_grad(|| {
            let rows = self.weight.f_ones_like()?.f_select(1, 0)?;
            renormalise(&mut self.weight.detach(), &rows)
        })
    }

    /// The rows of `task` (B,) task ids. As `nn.Embedding(max_norm=1)`, the rows looked up
    /// are first scaled back to unit norm in place where longer.
    pub fn rows(&self, task: &Tensor) -> Result<TaskRows> {
        let task = task.f_to_kind(Kind::Int64)?;
        tch::no_grad(|| -> Result<()> {
            let looked_up = match &self.renormalised {
                Some(rows) => rows.shallow_clone(),
                None => {
                    let mut rows = self.weight.f_new_zeros(
                        [self.weight.size()[0]],
                        (Kind::Float, self.weight.device()),
                    )?;
                    let _ = rows.f_index_fill_(0, &task, 1.0)?;
                    rows
                }
            };
            renormalise(&mut self.weight.detach(), &looked_up)
        })?;
        let emb = Tensor::f_embedding(&self.weight, &task, -1, false, false)?;
        Ok(TaskRows {
            emb,
            mask: self.masks.f_index_select(0, &task)?,
            action_dims: self.action_dims.f_index_select(0, &task)?.unsqueeze(-1),
            discount: self.discounts.f_index_select(0, &task)?.unsqueeze(-1),
        })
    }
}

/// `nn.Embedding(max_norm)`'s renormalisation, in place, of the rows of `weight` that `rows`
/// marks (nonzero): each such row longer than [`MAX_NORM`] is scaled by
/// MAX_NORM / (norm + 1e-7). The numbers are those of torch's CPU `embedding_renorm_` (the norm
/// in float32, the scale in float64, applied in float32), but as tensor operations that read
/// nothing back: torch's CPU kernel reads each row's norm on the host and its CUDA kernel the
/// number of distinct rows, which a CUDA graph cannot hold.
fn renormalise(weight: &mut Tensor, rows: &Tensor) -> Result<()> {
    let norms = weight.f_norm_scalaropt_dim(2.0, [1].as_slice(), true)?;
    let long = norms
        .f_gt(MAX_NORM)?
        .f_logical_and(&rows.f_ne(0.0)?.f_unsqueeze(1)?)?;
    let denominator = norms.f_to_kind(Kind::Double)?.f_add_scalar(1e-7)?;
    let scale = denominator
        .f_full_like(MAX_NORM)?
        .f_div(&denominator)?
        .f_to_kind(Kind::Float)?;
    let _ = weight.f_mul_(&scale.f_where_scalarother(&long, 1.0)?)?;
    Ok(())
}

impl ParamVisitor for TaskEmbedding {
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(String, &mut Tensor)) {
        f(format!("{prefix}.weight"), &mut self.weight);
    }
}

/// `x` (…, B, D) with each row's task embedding appended: (…, B, D + task_dim), the rows'
/// embeddings repeated over the leading dimensions. Without tasks, `x` itself.
pub fn with_task(x: &Tensor, task: Option<&TaskRows>) -> Tensor {
    match task {
        None => x.shallow_clone(),
        Some(task) => Tensor::cat(&[x, &expanded(&task.emb, x)], -1),
    }
}

/// `cat([z, emb, a], -1)`: the input of the dynamics, reward and Q heads.
pub fn with_task_and_action(z: &Tensor, a: &Tensor, task: Option<&TaskRows>) -> Tensor {
    match task {
        None => Tensor::cat(&[z, a], -1),
        Some(task) => Tensor::cat(&[z, &expanded(&task.emb, z), a], -1),
    }
}

/// `rows` (B, W) broadcast to `like`'s leading dimensions (…, B, ·).
pub fn expanded(rows: &Tensor, like: &Tensor) -> Tensor {
    let mut shape = like.size();
    if let Some(last) = shape.last_mut() {
        *last = rows.size()[1];
    }
    rows.expand(&shape, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tasks() -> Tasks {
        Tasks {
            task_dim: 3,
            action_dims: vec![2, 1, 3],
            discounts: vec![0.99, 0.95, 0.9],
        }
    }

    #[test]
    fn rows_carry_masks_sizes_and_discounts_and_long_rows_are_renormalised() {
        let table = TaskEmbedding::new(&tasks(), 3, Device::Cpu);
        tch::no_grad(|| {
            let _ = table.weight.get(2).fill_(2.0);
        });
        let rows = table.rows(&Tensor::from_slice(&[2i64, 1, 2])).unwrap();
        let mask = Vec::<f32>::try_from(rows.mask.view([-1])).unwrap();
        assert_eq!(mask, [1., 1., 1., 1., 0., 0., 1., 1., 1.]);
        let dims = Vec::<f32>::try_from(rows.action_dims.view([-1])).unwrap();
        assert_eq!(dims, [3.0, 1.0, 3.0]);
        let discount = Vec::<f32>::try_from(rows.discount.view([-1])).unwrap();
        assert_eq!(discount, [0.9, 0.95, 0.9]);
        let norm = table.weight.get(2).norm().double_value(&[]);
        assert!((norm - 1.0).abs() < 1e-6, "renormalised in place: {norm}");
        assert!(
            table.weight.get(1).norm().double_value(&[]) < 0.1,
            "short rows stay"
        );
    }

    /// An evaluation's renormalisation of every row equals looking each task up once.
    #[test]
    fn every_row_renormalised_equals_looking_up_every_task() {
        let mut table = TaskEmbedding::new(&tasks(), 3, Device::Cpu);
        tch::no_grad(|| {
            let _ = table.weight.get(0).fill_(0.9);
            let _ = table.weight.get(2).fill_(2.0);
        });
        let mut looked_up = TaskEmbedding::new(&tasks(), 3, Device::Cpu);
        tch::no_grad(|| looked_up.weight.copy_(&table.weight));
        looked_up.rows(&Tensor::from_slice(&[0i64, 1, 2])).unwrap();
        table.renormalise_every_row().unwrap();
        assert!(table.weight.equal(&looked_up.weight));
        let norm = |row: i64| table.weight.get(row).norm().double_value(&[]);
        assert!((norm(0) - 1.0).abs() < 1e-6 && (norm(2) - 1.0).abs() < 1e-6);
        assert!(norm(1) < 0.1, "short rows stay");
    }

    /// The graph-safe renormalisation gives torch's `embedding_renorm_` bit for bit, on rows
    /// just below, at and above the limit, and leaves the rows it is not asked to touch.
    #[test]
    fn renormalisation_equals_torchs_embedding_renorm_exactly() {
        let cpu = (Kind::Float, Device::Cpu);
        tch::manual_seed(5);
        let lengths =
            Tensor::from_slice(&[0.5f32, 0.999_999_9, 1.0, 1.000_000_1, 1.5, 3.0, 40.0, 0.0]);
        for width in [3, 64, 96, 97] {
            let direction = Tensor::randn([8, width], cpu);
            let unit = &direction / direction.norm_scalaropt_dim(2.0, [1].as_slice(), true);
            let table = unit * lengths.unsqueeze(1) + Tensor::randn([8, width], cpu) * 1e-4;
            let rows = Tensor::from_slice(&[1i64, 2, 3, 3, 4, 6, 7, 0]);
            for marked in [rows.narrow(0, 0, 7), rows.narrow(0, 1, 5)] {
                let mut expected = table.copy();
                let _ = expected.embedding_renorm_(&marked, MAX_NORM, 2.0);
                let mut ours = table.copy();
                let mask = Tensor::zeros([8], cpu).index_fill(0, &marked, 1.0);
                renormalise(&mut ours, &mask).unwrap();
                assert!(
                    ours.equal(&expected),
                    "width {width}: {}",
                    (&ours - &expected).abs().max()
                );
                assert!(!ours.equal(&table), "some rows were long");
            }
        }
    }

    #[test]
    fn embeddings_are_appended_over_leading_dimensions() {
        let table = TaskEmbedding::new(&tasks(), 3, Device::Cpu);
        let rows = table.rows(&Tensor::from_slice(&[0i64, 2])).unwrap();
        let x = Tensor::ones([4, 2, 5], (Kind::Float, Device::Cpu));
        let joined = with_task(&x, Some(&rows));
        assert_eq!(joined.size(), [4, 2, 8]);
        assert!(joined.get(3).narrow(1, 5, 3).equal(&rows.emb));
        let a = Tensor::zeros([4, 2, 3], (Kind::Float, Device::Cpu));
        assert_eq!(with_task_and_action(&x, &a, Some(&rows)).size(), [4, 2, 11]);
        assert_eq!(with_task_and_action(&x, &a, None).size(), [4, 2, 8]);
        let six = rows.for_rows(6);
        let discount = Vec::<f32>::try_from(six.discount.view([-1])).unwrap();
        assert_eq!(
            discount,
            [0.99, 0.99, 0.99, 0.9, 0.9, 0.9],
            "environment-major"
        );
    }

    #[test]
    fn tasks_are_checked_against_the_action_size() {
        assert!(tasks().validate(3).is_ok());
        assert!(tasks().validate(2).is_err(), "a task with 3 actions");
        let mut no_dim = tasks();
        no_dim.task_dim = 0;
        assert!(no_dim.validate(3).is_err());
    }
}
