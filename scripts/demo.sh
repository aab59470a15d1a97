#!/usr/bin/env bash
# The main job in miniature: sets everything up, then trains TD-MPC2 on the native Pendulum-v1
# with two ranks on CPU (one rank per GPU when two or more are visible) and prints rank 0's eval
# lines.
# Extra key=value arguments override the demo's settings. Each demo writes a run directory of its
# own (runs/demo/<time>): a run directory holding checkpoints only takes a resume.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$here/setup.sh"
source "$here/env.sh"
cd "$tdmpc2_root"
bin=$(cargo metadata --format-version 1 --no-deps | python -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/tdmpc2

gpus=$(python -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
# One rank per GPU with two or more; otherwise two ranks on CPU (a single GPU cannot host two
# NCCL ranks).
if (( gpus > 1 )); then world_size=$gpus device=cuda; else world_size=2 device=cpu; fi
# A smaller planner and batch than the official defaults keep the CPU demo to a few minutes.
# 1600 agent steps a rank (600 of them seeding), however many ranks.
steps=$((1600 * world_size))
exec "$bin" train task=Pendulum-v1 model_size=1 world_size="$world_size" device="$device" \
    steps="$steps" seed_steps=600 eval_freq=$((steps / 2)) eval_episodes=4 batch_size=64 \
    num_samples=128 num_elites=16 num_pi_trajs=8 iterations=3 \
    exp_name=demo run_dir="runs/demo/$(date +%Y%m%d-%H%M%S)" "$@"
