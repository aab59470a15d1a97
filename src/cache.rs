//! The user's cache folder for what the trainer keeps between runs (dataset stamps, compiled
//! GPU kernels): `$XDG_CACHE_HOME/tdmpc2`, or `~/.cache/tdmpc2`.
use std::path::PathBuf;

/// The folder, or `None` where neither variable is set.
pub fn user_cache() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .map(|cache| cache.join("tdmpc2"))
}
