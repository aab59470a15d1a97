//! CUDA graphs on a real GPU. Ignored by default; `scripts/gpu_check.sh` runs them. Each one
//! fails, not passes, when asked to run where graphs are unavailable.
use std::sync::{Mutex, MutexGuard, PoisonError};

use tch::{Device, Kind, Tensor};
use tdmpc2::cuda::{cuda_graphs_available, synchronize, CudaGraph, GraphError, GraphPool};

/// One test on the GPU at a time: eager work from another test thread would invalidate a
/// capture in progress.
static GPU: Mutex<()> = Mutex::new(());

fn gpu() -> (MutexGuard<'static, ()>, Device) {
    let guard = GPU.lock().unwrap_or_else(PoisonError::into_inner);
    assert!(
        cuda_graphs_available(),
        "CUDA graphs are unavailable here: {}",
        CudaGraph::capture(Device::Cuda(0), None, 0, || Ok::<_, GraphError>(()))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    );
    (guard, Device::Cuda(0))
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
fn replay_recomputes_from_refilled_inputs() {
    let (_gpu, device) = gpu();
    let mut x = Tensor::randn([64, 32], (Kind::Float, device));
    let w = Tensor::randn([32, 16], (Kind::Float, device));
    let (graph, y) =
        CudaGraph::capture(device, None, 3, || Ok::<_, GraphError>(x.matmul(&w) + 1.0))
            .expect("capture");
    let mut previous = y.copy();
    for _ in 0..3 {
        let fresh = Tensor::randn([64, 32], (Kind::Float, device));
        x.copy_(&fresh);
        graph.replay().expect("replay");
        let eager = fresh.matmul(&w) + 1.0;
        assert!(max_abs_diff(&y, &eager) < 1e-4, "replay differs from eager");
        assert!(
            max_abs_diff(&y, &previous) > 1e-3,
            "replay left y unchanged"
        );
        previous = y.copy();
    }
    synchronize(device).expect("synchronize");
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
fn random_draws_are_new_on_every_replay() {
    let (_gpu, device) = gpu();
    let n = 1 << 16;
    let (graph, draw) = CudaGraph::capture(device, None, 1, || {
        Ok::<_, GraphError>(Tensor::randn([n], (Kind::Float, device)))
    })
    .expect("capture");
    graph.replay().expect("replay");
    let first = draw.to_kind(Kind::Double);
    graph.replay().expect("replay");
    let second = draw.to_kind(Kind::Double);
    assert!(!first.equal(&second), "two replays drew the same numbers");
    let correlation = (&first * &second).mean(Kind::Double).double_value(&[]);
    assert!(
        correlation.abs() < 0.03,
        "consecutive draws correlate: {correlation}"
    );

    let replays = 64;
    let (mut sum, mut sum_sq) = (0.0, 0.0);
    for _ in 0..replays {
        graph.replay().expect("replay");
        let d = draw.to_kind(Kind::Double);
        sum += d.sum(Kind::Double).double_value(&[]);
        sum_sq += d.square().sum(Kind::Double).double_value(&[]);
    }
    let count = (replays * n) as f64;
    let mean = sum / count;
    let var = sum_sq / count - mean * mean;
    // Standard errors over 4.2M draws: 5e-4 for the mean, 7e-4 for the variance.
    assert!(mean.abs() < 5e-3, "mean {mean}");
    assert!((var - 1.0).abs() < 1e-2, "variance {var}");
}

/// A graph replayed on one thread draws what it draws alone while another thread captures
/// graphs that draw too (as a pipelined actor captures its plans while the learner replays its
/// update): torch marks its generator as capturing for every thread, so without the captures
/// and replays taking turns a replay's advance would be counted into the other capture.
#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
fn replays_draw_the_same_while_another_thread_captures() {
    let (_gpu, device) = gpu();
    let n = 1 << 12;
    let (graph, draw) = CudaGraph::capture(device, None, 1, || {
        Ok::<_, GraphError>(Tensor::randn([n], (Kind::Float, device)))
    })
    .expect("capture");
    let replays = |graph: &CudaGraph| -> Vec<Vec<f32>> {
        (0..200)
            .map(|_| {
                graph.replay().expect("replay");
                Vec::<f32>::try_from(&draw.to_device(Device::Cpu)).unwrap()
            })
            .collect()
    };
    tch::manual_seed(7);
    let alone = replays(&graph);
    tch::manual_seed(7);
    let beside_captures = std::thread::scope(|scope| {
        let capturing = scope.spawn(|| {
            for _ in 0..50 {
                // No warm-up: an eager draw would advance the generator the replays read.
                let (other, _) = CudaGraph::capture(device, None, 0, || {
                    Ok::<_, GraphError>(Tensor::randn([n], (Kind::Float, device)))
                })
                .expect("capture beside replays");
                drop(other);
            }
        });
        let drawn = replays(&graph);
        capturing.join().expect("the capturing thread");
        drawn
    });
    assert!(
        alone == beside_captures,
        "replays drew other numbers beside captures"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
fn graphs_share_a_pool_and_replay_in_capture_order() {
    let (_gpu, device) = gpu();
    let pool = GraphPool::new().expect("pool");
    let mut x = Tensor::zeros([1024], (Kind::Float, device));
    let (first, doubled) =
        CudaGraph::capture(device, Some(&pool), 2, || Ok::<_, GraphError>(&x * 2.0))
            .expect("first capture");
    let (second, result) = CudaGraph::capture(device, Some(&pool), 2, || {
        Ok::<_, GraphError>(&doubled + 1.0)
    })
    .expect("second capture");
    for _ in 0..2 {
        let fresh = Tensor::randn([1024], (Kind::Float, device));
        x.copy_(&fresh);
        first.replay().expect("replay first");
        second.replay().expect("replay second");
        let eager = &fresh * 2.0 + 1.0;
        assert!(max_abs_diff(&result, &eager) < 1e-6);
    }
}

/// The clipping norm through `_foreach_norm` on CUDA: the CPU's value (torch's own, as
/// tests/parity.rs shows) up to float32 summation order, at a size where that order shows (3.2M
/// entries in 40 pieces of very different scales), and the same when captured in a graph.
#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
fn the_clipping_norm_on_cuda_equals_the_cpus_and_is_capturable() {
    use tdmpc2::agent::adam::grad_norm;
    let (_gpu, device) = gpu();
    let sizes: Vec<i64> = (0..40)
        .map(|i| [512 * 512, 512, 1_024, 223 * 256][i % 4])
        .collect();
    let numel: i64 = sizes.iter().sum();
    let mut grads = Tensor::arange(numel, (Kind::Float, Device::Cpu))
        .g_mul_scalar(0.37)
        .sin();
    let mut offset = 0;
    for (i, &size) in sizes.iter().enumerate() {
        let _ = grads
            .narrow(0, offset, size)
            .g_mul_scalar_(10f64.powi(i as i32 % 4 - 2));
        offset += size;
    }
    let pieces = |flat: &Tensor| -> Vec<Tensor> {
        let mut offset = 0;
        sizes
            .iter()
            .map(|&size| {
                offset += size;
                flat.narrow(0, offset - size, size)
            })
            .collect()
    };
    let cpu = grad_norm(&grads, &pieces(&grads))
        .expect("CPU norm")
        .double_value(&[]);
    grads = grads.to_device(device);
    let views = pieces(&grads);
    let eager = grad_norm(&grads, &views)
        .expect("CUDA norm")
        .double_value(&[]);
    assert!(
        (eager - cpu).abs() <= 1e-6 * cpu,
        "CUDA {eager} vs CPU {cpu}"
    );
    let (graph, captured) =
        CudaGraph::capture(device, None, 2, || grad_norm(&grads, &views)).expect("capture");
    let _ = grads.g_mul_scalar_(2.0);
    graph.replay().expect("replay");
    let replayed = captured.double_value(&[]);
    assert!(
        (replayed - 2.0 * eager).abs() <= 1e-6 * eager,
        "replayed {replayed} vs twice the eager {eager}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
fn a_failed_capture_reports_the_cause_and_the_next_one_works() {
    let (_gpu, device) = gpu();
    let x = Tensor::randn([256], (Kind::Float, device));
    // Reading a value on the host inside a capture is forbidden: the torch error comes back.
    let err = CudaGraph::capture(device, None, 1, || -> tdmpc2::Result<f64> {
        Ok(x.f_sum(Kind::Float)?.f_double_value(&[])?)
    })
    .err()
    .expect("a host read inside a capture must fail");
    assert!(matches!(err, tdmpc2::Error::Torch(_)), "{err}");

    // The same read through tch's panicking call: an error as well, with torch's words.
    let err = CudaGraph::capture(device, None, 1, || {
        Ok::<_, GraphError>(x.sum(Kind::Float).double_value(&[]))
    })
    .err()
    .expect("a panicking host read inside a capture must fail");
    assert!(
        matches!(&err, GraphError::CallPanicked(why) if why.contains("captur")),
        "{err}"
    );

    // A call that fails on its own during the capture: its error, not the capture's.
    let mut calls = 0;
    let err = CudaGraph::capture(device, None, 1, || {
        calls += 1;
        if calls == 2 {
            return Err(tdmpc2::Error::Other("failed while capturing".into()));
        }
        Ok(&x + 1.0)
    })
    .err()
    .expect("the captured call failed");
    assert_eq!(err.to_string(), "failed while capturing");

    // The caller's stream is back and capturing still works.
    let eager = &x * 3.0;
    let (graph, y) = CudaGraph::capture(device, None, 1, || Ok::<_, GraphError>(&x * 3.0))
        .expect("capture after failures");
    graph.replay().expect("replay");
    assert!(max_abs_diff(&y, &eager) < 1e-6);
}

/// A small agent's config (obs 5, action 2), with `overrides` laid over it.
fn small_config(overrides: &[&str]) -> tdmpc2::config::Config {
    let base = [
        "batch_size=32",
        "horizon=3",
        "latent_dim=16",
        "enc_dim=32",
        "mlp_dim=32",
        "num_samples=64",
        "num_elites=8",
        "num_pi_trajs=4",
        "iterations=3",
        "dropout=0.01",
        "obs_shape=[5]",
        "action_dim=2",
        "discount=0.99",
        "lr_warmup_steps=3",
    ];
    let overrides = base.iter().chain(overrides).map(|s| s.to_string());
    tdmpc2::config::Config::load(&tdmpc2::config::Source {
        overrides: overrides.collect(),
        ..Default::default()
    })
    .expect("a valid config")
}

/// Two tasks of one and two actions, for a multitask model of `small_config`'s sizes.
fn two_tasks() -> tdmpc2::agent::task::Tasks {
    tdmpc2::agent::task::Tasks {
        task_dim: 8,
        action_dims: vec![2, 1],
        discounts: vec![0.99, 0.9],
    }
}

/// Batches of `config`'s shapes on `device`, the same on every call (drawn on the host); with
/// `multitask`, of both tasks of [`two_tasks`].
fn batches(
    count: usize,
    device: Device,
    episodic: bool,
    multitask: bool,
) -> Vec<tdmpc2::buffer::Batch> {
    use tdmpc2::agent::{HostNoise, Noise};
    let mut noise = HostNoise::seeded(11);
    (0..count)
        .map(|_| {
            let mut draw = |shape: &[i64]| noise.randn(shape, device).unwrap();
            let terminated = match episodic {
                true => draw(&[3, 32, 1]).gt(1.5).to_kind(Kind::Float),
                false => Tensor::zeros([3, 32, 1], (Kind::Float, device)),
            };
            tdmpc2::buffer::Batch {
                obs: draw(&[4, 32, 5]),
                action: draw(&[3, 32, 2]).clamp(-1.0, 1.0),
                reward: draw(&[3, 32, 1]),
                terminated,
                task: multitask.then(|| draw(&[32]).gt(0.0).to_kind(Kind::Int64)),
            }
        })
        .collect()
}

/// The update captured as one graph does what the eager update does, draw for draw: the same
/// parameters, optimiser state, statistics and step counts after several updates (the first
/// warms up and captures, the others replay), episodic, multitask or neither, and with two
/// micro-batches per update (the synchronised update's path, its collectives those of a lone
/// rank).
#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
fn a_captured_update_equals_the_eager_update() {
    use tdmpc2::ddp::{ProcessGroup, RankInfo};
    use tdmpc2::learner::{Learner, LearnerSettings};
    let (_gpu, device) = gpu();
    let cases = [
        (false, false, 1),
        (true, false, 1),
        (false, true, 1),
        (false, false, 2),
    ];
    for (episodic, multitask, sync_freq) in cases {
        let episodic_setting = format!("episodic={episodic}");
        let sync_setting = format!("sync_freq={sync_freq}");
        let config = small_config(&[&episodic_setting, &sync_setting]);
        let group = ProcessGroup::alone(RankInfo::single(&config));
        let run = |capture: bool| {
            let mut settings = LearnerSettings::from_config(&config)
                .unwrap()
                .with_capacity(64);
            settings.agent.tasks = multitask.then(two_tasks);
            let mut learner = Learner::new(&settings, device, &group).unwrap();
            if capture {
                learner
                    .capture_updates()
                    .expect("one rank on CUDA captures");
            }
            let stats: Vec<_> = batches(5 * sync_freq, device, episodic, multitask)
                .chunks(sync_freq)
                .map(|micro_batches| learner.update_on(micro_batches).unwrap())
                .map(|info| info.fetch().unwrap())
                .collect();
            let state = learner.updater().model_optim.state();
            let mut tensors = learner.model().named_tensors();
            tensors.push(("model_optim.exp_avg_sq".into(), state.exp_avg_sq.copy()));
            (tensors, stats, learner.updater().step_counts())
        };
        let (eager, eager_stats, eager_steps) = run(false);
        let (graphed, graphed_stats, graphed_steps) = run(true);
        assert_eq!(eager_steps, [5, 5]);
        assert_eq!(graphed_steps, eager_steps, "the host counts replayed steps");
        for ((name, a), (_, b)) in eager.iter().zip(&graphed) {
            let scale = a.abs().max().double_value(&[]).max(1.0);
            let diff = max_abs_diff(a, b);
            assert!(
                diff <= 1e-5 * scale,
                "episodic={episodic}, multitask={multitask}, sync_freq={sync_freq}: {name} differs by {diff}"
            );
        }
        assert_ne!(eager_stats[3].total_loss, eager_stats[4].total_loss);
        for (i, (a, b)) in eager_stats.iter().zip(&graphed_stats).enumerate() {
            for ((name, x), (_, y)) in a.named().iter().zip(b.named()) {
                assert!(
                    (x - y).abs() <= 1e-4 * x.abs().max(1.0),
                    "episodic={episodic}, multitask={multitask}, sync_freq={sync_freq}, update {i}: \
                     {name} {x} vs {y}"
                );
            }
        }
    }
}

/// Plans through graphs (one per eval_mode) act as eager plans do on the same draws, whichever
/// environments start an episode, for a multitask policy whichever tasks they play, and for a
/// policy drawing from a generator of its own (a pipelined actor's), which the graphs register.
#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
fn captured_plans_equal_eager_plans() {
    let (_gpu, device) = gpu();
    for (multitask, own) in [(false, false), (true, false), (false, true)] {
        let (eager, graphed) = (
            plans(device, multitask, own, false),
            plans(device, multitask, own, true),
        );
        assert_ne!(eager[4], eager[5]);
        for (i, (a, b)) in eager.iter().zip(&graphed).enumerate() {
            let diff = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(
                diff <= 1e-4,
                "multitask={multitask}, own generator={own}, call {i}: actions differ by \
                 {diff}: {a:?} vs {b:?}"
            );
        }
    }
}

/// The actions of six plans for 4 environments (some starting episodes, some in eval mode),
/// captured or not; a multitask policy's environments change tasks between plans; with `own`,
/// the policy draws from a generator of its own, reseeded in place after three plans.
fn plans(device: Device, multitask: bool, own: bool, capture: bool) -> Vec<Vec<f32>> {
    use tdmpc2::actor::Policy;
    use tdmpc2::agent::{AgentConfig, TorchNoise};
    let mut agent = AgentConfig::from_config(&small_config(&[])).unwrap();
    agent.tasks = multitask.then(two_tasks);
    let obs: Vec<f32> = (0..20).map(|i| (i as f32 * 0.37).sin()).collect();
    let calls = [
        ([true, true, true, true], false),
        ([false, true, false, false], false),
        ([false, false, false, false], true),
        ([false, false, true, false], false),
        ([true, false, false, false], true),
        ([false, false, false, false], false),
    ];
    let noise = Box::new(TorchNoise::seeded(3));
    let mut policy = Policy::new(&agent, device, 4, noise).unwrap();
    if own {
        policy.draw_on_its_own(7).unwrap();
    }
    if capture {
        policy.capture_plans().expect("a plan on CUDA captures");
    }
    calls
        .iter()
        .enumerate()
        .map(|(i, (t0, eval_mode))| {
            if multitask {
                let tasks = [i % 2, 1, 0, (i / 2) % 2].map(|t| t as u32);
                policy.set_tasks(&tasks).unwrap();
            }
            if own && i == 3 {
                policy.draw_on_its_own(8).unwrap();
            }
            policy.act(&obs, t0, *eval_mode).unwrap()
        })
        .collect()
}
