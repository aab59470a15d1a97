#!/usr/bin/env bash
# Times plan and update of the official TD-MPC2 code (a checkout of nicklashansen/tdmpc2 that you
# provide) and of this project on the CPU, with the same torch (the project's venv), in one
# sitting: rounds alternate ours, official, ours, official, ... so that a machine whose speed
# drifts affects both alike. Prints every measurement as a `tdmpc2 bench --cases agent` JSON line
# (with "impl" and "round"), then a table: per side the lowest of the rounds' medians (other load
# only slows calls down), each round's own ratio, and the fastest single calls.
#
#   scripts/compare_official.sh OFFICIAL_CHECKOUT [--rounds N] [--model-sizes 1,5]
#       [--threads N] [--repeats N] [--bin PATH] [--out FILE]
#
# Defaults: 2 rounds, model sizes 1 and 5, 2 threads, 10 timed calls per measurement (after one
# warm-up call), walker-run dimensions (obs 24, action 6), batch 256, the official config.yaml with
# its model-size presets and compile=false. The official plan is timed through `agent.act` after a
# first call with t0=True (warm start), its update through `agent.update` on a random batch.
#
# The official code needs `tensordict`, which the project's venv does not have: this script
# installs the version that the checkout's docker/environment.yaml pins (0.8.3 if it names none)
# with `pip install --target --no-deps` into $TDMPC2_OFFICIAL_DEPS (default
# ~/.cache/tdmpc2/official-deps) and puts that folder on PYTHONPATH; the venv is not changed.
# Nothing of the official code is modified; scripts/compare_official.py says what it adapts at
# run time to build the agent on the CPU (the hard-coded cuda:0 device, Adam's capturable flag).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/env.sh"

usage() {
    { echo usage:; sed -n '8,9p' "$0" | sed 's/^#//'; } >&2
    exit 2
}
fail() {
    echo "compare_official.sh: $*" >&2
    exit 2
}

[[ $# -ge 1 ]] || usage
checkout=$1
shift
rounds=2 sizes=1,5 threads=2 repeats=10 out=""
bin=${CARGO_TARGET_DIR:-$root/target}/release/tdmpc2
while [[ $# -gt 0 ]]; do
    [[ $# -ge 2 ]] || fail "option $1 needs a value"
    case $1 in
    --rounds) rounds=$2 ;;
    --model-sizes) sizes=$2 ;;
    --threads) threads=$2 ;;
    --repeats) repeats=$2 ;;
    --bin) bin=$2 ;;
    --out) out=$2 ;;
    *) fail "unknown option '$1'; allowed: --rounds, --model-sizes, --threads, --repeats, --bin, --out" ;;
    esac
    shift 2
done
for name in rounds threads repeats; do
    [[ ${!name} =~ ^[1-9][0-9]*$ ]] || fail "--$name must be a positive integer, got '${!name}'"
done
[[ $sizes =~ ^(1|5)(,(1|5))*$ ]] || fail "--model-sizes must be 1, 5 or 1,5 (the sizes both sides bench), got '$sizes'"

# The checkout: the repository root (tdmpc2/tdmpc2.py inside), or its tdmpc2/ folder.
[[ -d $checkout ]] || fail "OFFICIAL_CHECKOUT '$checkout' is not a directory; pass a checkout of the official TD-MPC2 repository (nicklashansen/tdmpc2)"
checkout=$(cd "$checkout" && pwd)
if [[ ! -f $checkout/tdmpc2/tdmpc2.py && -f $checkout/tdmpc2.py && -f $checkout/../tdmpc2/tdmpc2.py ]]; then
    checkout=$(cd "$checkout/.." && pwd)
fi
for file in tdmpc2/tdmpc2.py tdmpc2/config.yaml tdmpc2/common/world_model.py tdmpc2/common/__init__.py; do
    [[ -f $checkout/$file ]] || fail "OFFICIAL_CHECKOUT '$checkout' is not a checkout of the official TD-MPC2 repository (nicklashansen/tdmpc2): $file is missing"
done

[[ -x $bin ]] || fail "no tdmpc2 binary at $bin; build it with scripts/setup.sh (or cargo build --release --bins), or pass --bin PATH"
python=$TDMPC2_VENV/bin/python
[[ -x $python ]] || fail "no Python venv at $TDMPC2_VENV; run scripts/setup.sh first (or set TDMPC2_VENV)"

# tensordict for the official code, beside the venv.
deps=${TDMPC2_OFFICIAL_DEPS:-$HOME/.cache/tdmpc2/official-deps}
pin=$(sed -n 's/.*tensordict==\([0-9][0-9.]*\).*/\1/p' "$checkout/docker/environment.yaml" 2>/dev/null | head -n 1)
pin=${pin:-0.8.3}
export PYTHONPATH="$deps${PYTHONPATH:+:$PYTHONPATH}"
installed=$("$python" -c 'import tensordict; print(tensordict.__version__)' 2>/dev/null || true)
if [[ $installed != "$pin" ]]; then
    echo "installing tensordict==$pin (pinned by the checkout) into $deps (pip --target, --no-deps)" >&2
    "$python" -m pip install --quiet --upgrade --target "$deps" --no-deps "tensordict==$pin" >&2 ||
        fail "pip could not install tensordict==$pin into $deps"
fi

if [[ -z $out ]]; then
    out=$(mktemp -t compare_official.XXXXXX.jsonl)
fi
: >"$out"
load() { cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo null; }

echo "torch $("$python" -c 'import torch; print(torch.__version__)'), $threads threads, $rounds rounds, model sizes $sizes, $repeats calls per measurement; lines in $out" >&2
for ((round = 1; round <= rounds; round++)); do
    before=$(load)
    lines=$("$bin" bench --cases agent --tasks walker-run --model-sizes "$sizes" \
        --threads "$threads" --agent-repeats "$repeats")
    printf '%s\n' "$lines" |
        sed "s/^{/{\"impl\":\"ours\",\"round\":$round,\"load_average\":[$before,$(load)],/" |
        tee -a "$out"
    "$python" "$root/scripts/compare_official.py" time "$checkout" --model-sizes "$sizes" \
        --threads "$threads" --repeats "$repeats" --round "$round" | tee -a "$out"
done
"$python" "$root/scripts/compare_official.py" summary "$out"
