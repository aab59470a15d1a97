//! What users reach for around a run: `tdmpc2 plot`, `tdmpc2 doctor`, `tdmpc2 collect`, what
//! `tdmpc2 eval` reports, and sweeps
//! (`tdmpc2 train --multirun`).
pub mod collect;
pub mod curves;
pub mod doctor;
pub mod eval_report;
pub mod playing_policy;
pub mod plot;
pub mod run_settings;
pub mod sweep;
