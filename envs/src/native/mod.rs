//! Environments implemented in Rust, numerically identical to their gymnasium originals.
pub mod mountain_car;
pub mod pendulum;

pub use mountain_car::MountainCarContinuous;
pub use pendulum::Pendulum;

/// Task names served natively (the gymnasium ids they reproduce).
pub const TASKS: [&str; 2] = [pendulum::ID, mountain_car::ID];
