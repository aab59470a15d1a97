//! Counting the operators a call dispatches to torch, by the rule of `scripts/op_count.py`
//! (compiled in), which `scripts/compare_official.py` applies to the official code: torch's
//! profiler, reached through the embedded interpreter that shares this process's libtorch.
use std::sync::Mutex;

use pyo3::prelude::*;
use serde::{Deserialize, Serialize};

use crate::agent::{Error, Result};

const RULE: &str = include_str!("../../scripts/op_count.py");

/// Operators one call dispatched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpCount {
    /// Every operator, nested ones included.
    pub ops: u64,
    /// Operators not called from inside another operator.
    pub top_level: u64,
    /// Operators that wait for the device to hand a value to the host (a scalar read, a
    /// data-dependent size): none may be inside a CUDA graph.
    pub host_syncs: u64,
}

/// One profile at a time: torch's profiler session is the process's (its callbacks see only
/// the thread that started it).
static PROFILER: Mutex<()> = Mutex::new(());

/// Runs `call` once under torch's profiler, started and stopped by the rule's functions
/// `start` and `stop`; the call's result and what `stop` returned.
fn profiled<T, R>(
    start: &str,
    stop: &str,
    call: impl FnOnce() -> Result<T>,
    extract: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<R>,
) -> Result<(T, R)> {
    let _one_at_a_time = PROFILER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let failed = |e: PyErr| Error::Python(format!("op counting: {e}"));
    let (rule, profile) = embedded_python::attach_exclusive(|py| {
        let rule = embedded_python::load_module(py, RULE, "tdmpc2_op_count").map_err(failed)?;
        let profile = rule.call_method0(start).map_err(failed)?;
        Ok::<_, Error>((rule.unbind(), profile.unbind()))
    })?;
    let result = call();
    let recorded: R = embedded_python::attach(|py| {
        rule.bind(py)
            .call_method1(stop, (profile.bind(py),))
            .and_then(|out| extract(&out))
            .map_err(failed)
    })?;
    Ok((result?, recorded))
}

/// Every operator `call` dispatched on this thread, in order, each with its scalar arguments
/// (see `stop_trace` in scripts/op_count.py).
pub fn trace_ops<T>(call: impl FnOnce() -> Result<T>) -> Result<(T, Vec<String>)> {
    profiled("start_trace", "stop_trace", call, |out| out.extract())
}

/// Runs `call` once under torch's profiler; its result and the operators it dispatched on
/// this thread.
pub fn count_ops<T>(call: impl FnOnce() -> Result<T>) -> Result<(T, OpCount)> {
    let (result, (ops, top_level, host_syncs)) = profiled("start", "stop", call, |out| {
        out.extract::<(u64, u64, u64)>()
    })?;
    Ok((
        result,
        OpCount {
            ops,
            top_level,
            host_syncs,
        },
    ))
}

/// What the device ran for a call: one kind of kernel (or copy, or set), its launches and its
/// device time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelTime {
    pub name: String,
    pub launches: u64,
    pub device_us: f64,
}

/// Runs `call` under torch's profiler with the CUDA activity on; its result and every kind of
/// kernel the device ran meanwhile, the most device time first (nothing on the CPU).
pub fn kernel_times<T>(call: impl FnOnce() -> Result<T>) -> Result<(T, Vec<KernelTime>)> {
    let (result, kernels) = profiled("start_kernels", "stop_kernels", call, |out| {
        out.extract::<Vec<(String, u64, f64)>>()
    })?;
    let kernels = kernels
        .into_iter()
        .map(|(name, launches, device_us)| KernelTime {
            name,
            launches,
            device_us,
        })
        .collect();
    Ok((result, kernels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    /// The same call counts the same; a call with more operators counts more.
    #[test]
    fn calls_are_counted_by_their_operators() {
        let x = Tensor::ones([4, 4], (Kind::Float, tch::Device::Cpu));
        let one = || Ok((&x + 1.0).sum(Kind::Float));
        let two = || Ok(((&x + 1.0) * 2.0).sum(Kind::Float).exp());
        let (_, a) = count_ops(one).unwrap();
        let (_, b) = count_ops(one).unwrap();
        let (_, c) = count_ops(two).unwrap();
        assert_eq!(a, b);
        assert!(a.top_level >= 2 && a.ops >= a.top_level, "{a:?}");
        assert_eq!(c.top_level, a.top_level + 2, "{a:?} {c:?}");
        assert_eq!(c.host_syncs, 0);
        let (_, read) = count_ops(|| Ok((&x + 1.0).sum(Kind::Float).double_value(&[]))).unwrap();
        assert_eq!(read.host_syncs, 1, "{read:?}");
    }

    /// Kernel profiling runs the call and hands back its result; a CPU call runs no kernel.
    #[test]
    fn kernel_times_of_a_cpu_call_are_empty() {
        let x = Tensor::ones([4, 4], (Kind::Float, tch::Device::Cpu));
        let (sum, kernels) = kernel_times(|| Ok((&x + 1.0).sum(Kind::Float))).unwrap();
        assert_eq!(sum.double_value(&[]), 32.0);
        assert!(kernels.is_empty(), "{kernels:?}");
    }

    use crate::agent::noise::{HostNoise, PreparedPermutations, TorchNoise};
    use crate::agent::{AgentConfig, Planner, Updater, WorldModel};
    use crate::buffer::Batch;

    /// A small agent (obs 5, action 2) planning for 3 environments, its noise streams and a
    /// batch of 16 (horizon 3).
    struct SmallAgent {
        model: WorldModel,
        updater: Updater,
        planner: Planner,
        sample: TorchNoise,
        batch_noise: HostNoise,
        /// The update's Q heads, drawn from `batch_noise` before it, as the learner does.
        shared: PreparedPermutations,
        obs: Tensor,
        batch: Batch,
        /// Each environment's task, for a multitask agent.
        env_tasks: Option<Tensor>,
    }

    impl SmallAgent {
        fn new(episodic: bool, multitask: bool) -> Self {
            let tasks = multitask.then(|| crate::agent::task::Tasks {
                task_dim: 4,
                action_dims: vec![2, 1],
                discounts: vec![0.99, 0.9],
            });
            let config = AgentConfig {
                episodic,
                tasks,
                enc_dim: 16,
                mlp_dim: 16,
                latent_dim: 8,
                num_samples: 64,
                num_elites: 8,
                num_pi_trajs: 4,
                ..AgentConfig::defaults(Some(1), 5, 2).unwrap()
            };
            let device = tch::Device::Cpu;
            let o = (Kind::Float, device);
            let model = WorldModel::new(&config, device).unwrap();
            Self {
                updater: Updater::new(&config, &model).unwrap().with_warmup(5),
                planner: Planner::new(&config, device, 3).unwrap(),
                model,
                sample: TorchNoise::seeded(3),
                batch_noise: HostNoise::seeded(3),
                shared: PreparedPermutations::new(2, config.num_q as i64, device),
                obs: Tensor::randn([3, 5], o),
                batch: Batch {
                    obs: Tensor::randn([4, 16, 5], o),
                    action: Tensor::rand([3, 16, 2], o) * 2.0 - 1.0,
                    reward: Tensor::randn([3, 16, 1], o),
                    terminated: Tensor::zeros([3, 16, 1], o),
                    task: multitask.then(|| Tensor::arange(16, (Kind::Int64, device)).remainder(2)),
                },
                env_tasks: multitask.then(|| Tensor::from_slice(&[1i64, 0, 1])),
            }
        }

        /// A plan's inputs, made outside it (as a graph's are refilled outside it).
        fn plan_inputs(&self, t0: &[bool]) -> crate::agent::PlanInputs {
            self.planner.inputs(&self.model, &self.obs, t0).unwrap()
        }

        /// A plan; a multitask agent's looks its environments' tasks up inside it, as a
        /// captured plan does.
        fn plan(&mut self, inputs: &crate::agent::PlanInputs) -> Result<Tensor> {
            let a = self;
            match &a.env_tasks {
                None => a
                    .planner
                    .plan_prepared(&a.model, inputs, false, &mut a.sample),
                Some(tasks) => {
                    let model = crate::agent::TaskModel::new(&a.model, tasks)?;
                    a.planner
                        .plan_prepared(&model, inputs, false, &mut a.sample)
                }
            }
        }

        /// What precedes an update, outside it: its shared draws.
        fn prepare_update(&mut self) {
            self.shared.refill(&mut self.batch_noise).unwrap();
        }

        fn update(&mut self) -> Result<crate::agent::UpdateInfo> {
            let a = self;
            a.updater
                .update(&mut a.model, &a.batch, &mut a.sample, &mut a.shared)
        }
    }

    /// A trace names each operator with its scalar arguments: the same call traces the same,
    /// a call that differs only in a host value does not.
    #[test]
    fn traces_show_scalar_arguments() {
        let x = Tensor::ones([4, 4], (Kind::Float, tch::Device::Cpu));
        let trace = |row: i64, scale: f64| trace_ops(|| Ok(x.select(0, row) * scale)).unwrap().1;
        assert_eq!(trace(1, 2.0), trace(1, 2.0));
        assert_ne!(trace(1, 2.0), trace(2, 2.0));
        assert_ne!(trace(1, 2.0), trace(1, 3.0));
    }

    /// Plans and updates never wait for the device to hand the host a value: what a CUDA graph
    /// needs, and what keeps them from stalling the GPU without one. The only host reads of a
    /// training step are the action fetch and the statistics, both outside these calls.
    #[test]
    fn plans_and_updates_make_no_host_syncs() {
        for (episodic, multitask) in [(false, false), (true, false), (false, true)] {
            let mut agent = SmallAgent::new(episodic, multitask);
            let inputs = agent.plan_inputs(&[true, false, true]);
            let (_, plan) = count_ops(|| agent.plan(&inputs)).unwrap();
            agent.prepare_update();
            let (_, update) = count_ops(|| agent.update()).unwrap();
            assert!(plan.ops > 0 && update.ops > 0);
            assert_eq!(
                (plan.host_syncs, update.host_syncs),
                (0, 0),
                "episodic={episodic}, multitask={multitask}: plan {plan:?}, update {update:?}"
            );
        }
    }

    /// Gradient clipping takes each optimiser's per-parameter norms in one call (one
    /// multi-tensor kernel on CUDA), not one operator per parameter.
    #[test]
    #[cfg_attr(
        not(tdmpc2_cuda_graphs),
        ignore = "this build has no C++ shim (a CPU-only torch wheel)"
    )]
    fn clipping_takes_each_optimisers_norms_in_one_call() {
        let mut agent = SmallAgent::new(false, false);
        agent.prepare_update();
        let (_, trace) = trace_ops(|| agent.update()).unwrap();
        let calls = |name: &str| trace.iter().filter(|op| op.starts_with(name)).count();
        assert_eq!(
            (calls("aten::_foreach_norm["), calls("aten::norm[")),
            (2, 2),
            "(_foreach_norm, norm) calls: one of each per optimiser"
        );
    }

    /// What a CUDA graph needs besides no host reads: consecutive plans (whichever environments
    /// start an episode) and consecutive updates dispatch the same operators with the same
    /// scalar arguments, so that a graph captured from one call replays the next. A host value
    /// that changes between calls (a Q head's index, a branch on who starts an episode) shows.
    #[test]
    fn consecutive_plans_and_updates_dispatch_the_same_calls() {
        for (episodic, multitask) in [(true, false), (false, true)] {
            let mut agent = SmallAgent::new(episodic, multitask);
            let plan = |agent: &mut SmallAgent, t0: &[bool]| {
                let inputs = agent.plan_inputs(t0);
                trace_ops(|| agent.plan(&inputs)).unwrap().1
            };
            plan(&mut agent, &[true, true, true]);
            let first = plan(&mut agent, &[false, true, false]);
            assert!(!first.is_empty());
            assert_eq!(first, plan(&mut agent, &[true, false, false]), "plans");
            assert_eq!(first, plan(&mut agent, &[false, false, false]), "plans");

            let update = |agent: &mut SmallAgent| {
                agent.prepare_update();
                trace_ops(|| agent.update()).unwrap().1
            };
            update(&mut agent);
            let second = update(&mut agent);
            assert_eq!(second, update(&mut agent), "updates, multitask={multitask}");
        }
    }
}
