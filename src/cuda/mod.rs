//! CUDA-only machinery that tch does not offer: graph capture and replay.
mod graph;

pub use graph::{cuda_graphs_available, synchronize, CudaGraph, GraphError, GraphPool};
