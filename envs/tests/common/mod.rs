//! Helpers shared by the integration tests.
#![allow(dead_code)]
use envs::np_random::NpRandom;
use pyo3::prelude::*;

/// Imports test-only Python source and calls `f` with it, holding the crate's import lock
/// (concurrent imports from several test threads are not safe).
pub fn with_module<T>(
    source: &str,
    name: &str,
    f: impl for<'py> FnOnce(&Bound<'py, PyModule>) -> PyResult<T>,
) -> T {
    embedded_python::attach_exclusive(|py| -> embedded_python::Result<T> {
        Ok(f(&embedded_python::load_module(py, source, name)?)?)
    })
    .expect("python helper")
}

/// A fixed pseudo-random action sequence in [-1, 1].
pub fn actions(seed: u64, n: usize, dim: usize) -> Vec<Vec<f32>> {
    let mut rng = NpRandom::new(seed);
    (0..n)
        .map(|_| (0..dim).map(|_| rng.uniform(-1.0, 1.0) as f32).collect())
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).abs())
        .fold(0.0, f64::max)
}
