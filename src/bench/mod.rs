//! Benchmarks of the trainer as a whole (the agent's own are in `agent::bench`).
pub mod buffer;
pub mod dataset;
pub mod ddp;
pub mod env;
pub mod graphs;
pub mod train_loop;
pub mod video;
