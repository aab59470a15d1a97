//! Benchmarks: the agent's plan and update (`agent`, with the operator counts of `op_count`),
//! and the trainer's parts and whole.
pub mod agent;
pub mod buffer;
pub mod command;
pub mod dataset;
pub mod ddp;
pub mod env;
pub mod graphs;
pub mod op_count;
mod scratch;
pub mod train_loop;
pub mod video;

use tch::Device;

use crate::config::{Config, Source};
use crate::error::Result;

/// Sets the matmul precision the trainer runs with (`tf32`, the config's default: TF32 on CUDA,
/// as the official code), so that a bench on CUDA times what training runs; nothing on the CPU.
pub fn trainer_precision(device: Device) -> Result<bool> {
    let tf32 = Config::load(&Source::default())?.tf32;
    crate::device::set_tf32(device, tf32)?;
    Ok(tf32 && device.is_cuda())
}
