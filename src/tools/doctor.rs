//! `tdmpc2 doctor`.
