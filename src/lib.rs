//! tdmpc2: a distributed TD-MPC2 trainer.
pub mod buffer;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod dist;
pub mod error;
pub mod logging;

pub use config::Config;
pub use error::{Error, Result};
