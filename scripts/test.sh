#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs the whole test suite. Extra arguments go to
# `cargo test`, e.g. `scripts/test.sh -p envs`.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$here/setup.sh"
source "$here/env.sh"
cd "$tdmpc2_root"
start=$(date +%s)
cargo test --release --workspace --no-fail-fast "$@"
echo "[test] suite took $(( $(date +%s) - start )) s"
