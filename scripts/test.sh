#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs the whole test suite. Extra arguments go to
# `cargo test`, e.g. `scripts/test.sh -p envs`.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The task families with venvs of their own (Meta-World, MyoSuite) are tested too.
"$here/setup.sh" --family all
source "$here/env.sh"
cd "$tdmpc2_root"
start=$(date +%s)
# Tests that pass without checking all they would elsewhere (no golden run for this CPU kind,
# no rendering) add a line here (tests/common: not_checked); cargo hides passing tests' output.
export TDMPC2_NOT_CHECKED="${CARGO_TARGET_DIR:-$tdmpc2_root/target}/not_checked.txt"
mkdir -p "$(dirname "$TDMPC2_NOT_CHECKED")"
rm -f "$TDMPC2_NOT_CHECKED"
status=0
cargo test --release --workspace --no-fail-fast "$@" || status=$?
if [[ -s $TDMPC2_NOT_CHECKED ]]; then
    echo "[test] passed without checking everything on this machine:"
    sort -u "$TDMPC2_NOT_CHECKED" | sed 's/^/[test]   /'
fi
echo "[test] suite took $(( $(date +%s) - start )) s"
exit "$status"
