//! This very binary, which starts ranks, environment workers and sweep runs as processes of
//! its own.
use std::path::PathBuf;

use crate::error::{Error, Result};

/// The binary this process runs (see [`envs::running_binary`]: after a rebuild, the one still
/// running).
pub fn path() -> Result<PathBuf> {
    envs::running_binary::path().map_err(|e| Error::io("locate the tdmpc2 binary", e))
}
