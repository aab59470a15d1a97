//! Machinery that tch does not offer, through a C++ shim built against a CUDA torch wheel:
//! CUDA-graph capture and replay, torch random generators of our own, and many norms in one call;
//! and our own fused kernels, compiled at run time by NVRTC.
pub mod fused;
mod fused_adam;
mod generator;
mod graph;
mod memory;
mod norms;
pub mod nvrtc;
mod replayed;

pub use fused_adam::{fused_adam, AdamSlice};
pub use generator::{Draw, Generator, SharedGenerator};
pub use graph::{
    cuda_graphs_available, generator_turn, synchronize, why_no_graphs, CudaGraph, GraphError,
    GraphPool,
};
pub use memory::{memory_peak, MemoryPeak};
pub use norms::norms;
pub use replayed::Replayed;
