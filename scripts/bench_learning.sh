#!/usr/bin/env bash
# Learning-quality benchmark (not a CI test): trains model_size=1 and prints the eval curve and
# the wall time.
#   scripts/bench_learning.sh                      # Pendulum-v1, 10k agent steps (target >= -250)
#   scripts/bench_learning.sh cartpole-swingup 50000 world_size=2   # target >= 750
set -euo pipefail
task=${1:-Pendulum-v1}
steps=${2:-10000}
shift $(( $# > 2 ? 2 : $# ))
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$here/setup.sh" >&2
source "$here/env.sh"
bin=$(cargo metadata --manifest-path "$tdmpc2_root/Cargo.toml" --format-version 1 --no-deps \
    | python -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/tdmpc2
run_dir=${RUN_DIR:-$tdmpc2_root/runs/bench_learning/$task-$(date +%Y%m%d-%H%M%S)}
start=$(date +%s)
"$bin" train task="$task" model_size=1 steps="$steps" eval_freq=$(( steps / 10 )) \
    run_dir="$run_dir" enable_tensorboard=false "$@" >&2
end=$(date +%s)
echo "eval curve ($task, $steps agent steps):"
python - "$run_dir/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["phase"] == "eval":
        print(f'  step {r["step"]:>8}  return {r["episode_reward"]:9.1f} ± {r.get("episode_reward_std", 0):6.1f}')
PY
echo "wall time: $(( end - start )) s"
