//! tdmpc2: a distributed TD-MPC2 trainer.
// `println!` panics when its reader is gone: `outln!` and `errln!` instead (`terminal`).
#![deny(clippy::print_stdout, clippy::print_stderr)]
#[macro_use]
pub mod terminal;
pub mod actor;
pub mod agent;
pub mod arg_values;
pub mod bench;
pub mod buffer;
pub mod cache;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod cuda;
pub mod dataset;
pub mod ddp;
pub mod device;
pub mod error;
pub mod learner;
pub mod logging;
pub mod memory;
pub mod partial_files;
pub mod this_binary;
pub mod tools;
pub mod trainer;
pub mod whole_file;
pub mod zip_crc;

pub use config::Config;
pub use error::{Error, Result};
