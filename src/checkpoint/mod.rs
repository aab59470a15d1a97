//! Checkpoints written by rank 0.
pub mod store;
