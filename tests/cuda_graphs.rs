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
