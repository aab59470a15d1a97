//! Loading, overrides, validation and resolution, through `Config::load` as a user meets them.
use serde_yaml_ng::Value;

use super::resources::Machine;
use super::*;

fn load(overrides: &[&str]) -> Result<Config> {
    Config::load(&Source {
        overrides: overrides.iter().map(|s| s.to_string()).collect(),
        ..Source::default()
    })
}

fn error(overrides: &[&str]) -> String {
    load(overrides).expect_err("should be rejected").to_string()
}

mod checks;
mod parsing;
mod resolution;
