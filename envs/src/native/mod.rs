//! Environments implemented in Rust, numerically identical to their gymnasium originals.
pub mod mountain_car;
pub mod pendulum;

pub use mountain_car::MountainCarContinuous;
pub use pendulum::Pendulum;

/// Task names served natively (the gymnasium ids they reproduce).
pub const TASKS: [&str; 2] = [pendulum::ID, mountain_car::ID];

/// Those whose episodes can end early (MountainCar at its goal), with or without the `gym:`
/// prefix that forces gymnasium's version.
pub fn terminates(task: &str) -> bool {
    task.strip_prefix(crate::gym::PREFIX).unwrap_or(task) == mountain_car::ID
}
