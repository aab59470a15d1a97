//! Distributed execution: who each rank is, and the collectives between ranks.
pub mod affinity;
pub mod group;
pub mod heartbeat;
pub mod lifeline;
mod meeting;
pub mod rank;
pub mod rendezvous;
mod supervision;

pub use group::{Backend, GroupSettings, ProcessGroup};
pub use rank::{LaunchedBy, RankInfo};
pub use supervision::STOPPING_NOTICE;
pub mod launcher;
