//! CUDA-only machinery that tch does not offer: graph capture and replay.
mod graph;
mod replayed;

pub use graph::{cuda_graphs_available, synchronize, CudaGraph, GraphError, GraphPool};
pub use replayed::Replayed;
