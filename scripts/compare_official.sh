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
# The official code needs `tensordict`, which the project's venv does not have: see
# scripts/official_env.sh for where it goes (the venv is not changed).
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

source "$root/scripts/official_env.sh"
official_env "$checkout"
[[ -x $bin ]] || fail "no tdmpc2 binary at $bin; build it with scripts/setup.sh (or cargo build --release --bins), or pass --bin PATH"

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
