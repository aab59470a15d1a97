#!/usr/bin/env bash
# Multi-GPU training in one line, as the seed project's launcher:
#   scripts/run_ddp.sh TASK MODEL_SIZE [WORLD_SIZE=8] [SYNC_FREQ=1] [key=value ...]
#   scripts/run_ddp.sh dog-run 5 8 1 steps=20000000 eval_freq=100000
# Sets everything up on first use, then starts WORLD_SIZE local ranks with the built-in launcher.
# Environment: TDMPC2_BIN (default: the release build's tdmpc2; given, setup is skipped).
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    echo "usage: $0 TASK MODEL_SIZE [WORLD_SIZE=8] [SYNC_FREQ=1] [key=value ...]"
    echo "Trains TASK with WORLD_SIZE local ranks, averaging gradients every SYNC_FREQ updates;"
    echo 'key=value settings and --config-name=NAME as for `tdmpc2 train`; `tdmpc2 train --cfg job`'
    echo 'prints them all, resolved.'
    echo "e.g. $0 dog-run 5 8 1 steps=20000000 eval_freq=100000"
    exit 0
fi
if [ $# -lt 2 ]; then
    echo "usage: $0 TASK MODEL_SIZE [WORLD_SIZE=8] [SYNC_FREQ=1] [key=value ...]" >&2
    exit 2
fi
task=$1 model_size=$2
shift 2
world_size=8 sync_freq=1
# A positional is neither key=value nor an option (a negative number is one, refused below).
positional() { [[ $1 != *=* && ($1 != -* || $1 =~ ^-[0-9.]) ]]; }
if [ $# -gt 0 ] && positional "$1"; then world_size=$1; shift; fi
if [ $# -gt 0 ] && positional "$1"; then sync_freq=$1; shift; fi
# Checked before the setup, which can take minutes.
for pair in "MODEL_SIZE=$model_size" "WORLD_SIZE=$world_size" "SYNC_FREQ=$sync_freq"; do
    if ! [[ ${pair#*=} =~ ^[1-9][0-9]*$ ]]; then
        echo "$0: ${pair%%=*} is '${pair#*=}', not a positive whole number" >&2
        echo "usage: $0 TASK MODEL_SIZE [WORLD_SIZE=8] [SYNC_FREQ=1] [key=value ...]" >&2
        exit 2
    fi
done

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -z "${TDMPC2_BIN:-}" ]; then "$here/setup.sh" >&2; fi
source "$here/env.sh"
bin=${TDMPC2_BIN:-$(cargo metadata --manifest-path "$tdmpc2_root/Cargo.toml" --format-version 1 \
    --no-deps | python -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/tdmpc2}
# config_ddp unless the arguments name another file, or a folder of their own (read as the
# binary reads one alone: its config.yaml, or the --config-name given).
config_name=(--config-name=config_ddp)
for arg in "$@"; do
    case $arg in
    --config-name | --config-name=* | -cn | -cn=* | --config-path | --config-path=* | -cp | \
        -cp=* | --config-dir | --config-dir=* | -cd | -cd=*) config_name=() ;;
    esac
done
# launcher=builtin: these ranks are local even inside a SLURM step (an `srun --pty bash`),
# whose variables launcher=auto would follow; a key=value after it still wins.
exec "$bin" train ${config_name[@]+"${config_name[@]}"} task="$task" model_size="$model_size" \
    world_size="$world_size" sync_freq="$sync_freq" launcher=builtin "$@"
