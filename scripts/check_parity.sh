#!/usr/bin/env bash
# Holds this project's agent to the official TD-MPC2 code (a checkout of nicklashansen/tdmpc2
# that you provide) at full size: records a parity fixture with scripts/record_parity.py at a
# model-size preset with the official batch size (256) and dropout (0.01), too large to keep in
# the repository, into a temporary folder, and runs tests/parity.rs's comparison on it
# (components, every recorded update, every plan; the tolerances of the fixtures in tests/data).
#
#   scripts/check_parity.sh OFFICIAL_CHECKOUT [key=value ...]
#
# key=value: settings of scripts/record_parity.py; model_size=5 obs=state updates=2 unless
# given (e.g. `model_size=1`, `obs=rgb`, `episodic=true`, `multitask=true`). The fixture is
# removed afterwards unless TDMPC2_KEEP_FIXTURE=1. The official code runs as
# scripts/compare_official.sh runs it (scripts/official_env.sh: its tensordict beside the venv).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/env.sh"

fail() {
    echo "check_parity.sh: $*" >&2
    exit 2
}
[[ $# -ge 1 ]] || { { echo usage:; sed -n '8p' "$0" | sed 's/^#//'; } >&2; exit 2; }
source "$root/scripts/official_env.sh"
official_env "$1"
shift
for setting in "$@"; do
    [[ $setting == *=* ]] || fail "expected key=value, got '$setting'"
done

fixture=$(mktemp -d -t tdmpc2_parity.XXXXXX)
[[ ${TDMPC2_KEEP_FIXTURE:-0} == 1 ]] || trap 'rm -rf "$fixture"' EXIT
echo "recording from the official code into $fixture: model_size=5 obs=state updates=2 $*" >&2
"$python" "$root/scripts/record_parity.py" "$checkout" "$fixture" \
    model_size=5 obs=state updates=2 "$@" >&2
cd "$root"
TDMPC2_PARITY_FIXTURE=$fixture cargo test --release --test parity -- --ignored \
    --exact matches_the_official_implementation_with_a_recorded_fixture --nocapture
