#!/usr/bin/env bash
# Data-parallel scaling, measured: the same task to the same total agent steps with each rank
# count, same seed, with lr_scale none and sqrt; then eval return against agent steps and
# against wall time, drawn by `tdmpc2 plot`.
#   scripts/bench_scaling.sh TASK STEPS [RANKS...] [key=value ...]
#   scripts/bench_scaling.sh Pendulum-v1 3000 1 2 eval_freq=500
# Environment: OUT (default runs/scaling/TASK/<time>), LR_SCALES (default none,sqrt), TDMPC2_BIN.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 TASK STEPS [RANKS...] [key=value ...]" >&2
    exit 2
fi
task=$1 steps=$2
shift 2
ranks=()
while [ $# -gt 0 ] && [[ $1 != *=* ]]; do ranks+=("$1"); shift; done
[ ${#ranks[@]} -gt 0 ] || ranks=(1 2)
ranks_csv=$(IFS=,; echo "${ranks[*]}")

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/env.sh"
bin=${TDMPC2_BIN:-$(cargo metadata --manifest-path "$tdmpc2_root/Cargo.toml" --format-version 1 \
    --no-deps | python -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/tdmpc2}
out=${OUT:-runs/scaling/$task/$(date +%Y%m%d-%H%M%S)}

# One sweep: every rank count with every lr_scale, one job at a time so they do not compete.
status=0
"$bin" train --multirun task="$task" steps="$steps" seed=1 world_size="$ranks_csv" \
    lr_scale="${LR_SCALES:-none,sqrt}" run_dir="$out" "$@" || status=$?
"$bin" plot "$out"/*/ --out "$out/return_vs_steps.png" \
    --title "$task: eval return vs agent steps (ranks $ranks_csv)"
"$bin" plot "$out"/*/ --x elapsed_time --out "$out/return_vs_time.png" \
    --title "$task: eval return vs wall time (ranks $ranks_csv)"
echo "summary: $out/sweep.csv; figures: $out/return_vs_steps.png, $out/return_vs_time.png"
exit $status
