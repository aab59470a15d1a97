#!/usr/bin/env bash
# A dataset in the official format (chunk_<i>.pt files) from any trained agent, for offline
# training with `tdmpc2 train data_dir=OUT_DIR`:
#   scripts/collect_dataset.sh OUT_DIR EPISODES [key=value ...]
#   scripts/collect_dataset.sh data/mine 300 "task=[walker-run,cup-catch]" checkpoint=runs/.../1
# Without checkpoint=, the episodes play uniform random actions. A checkpoint a run saved is
# played with the task and model settings of its run's config.yaml, unless given here. Sets
# everything up on first use.
# Environment: TDMPC2_BIN (default: the release build's tdmpc2; given, setup is skipped).
set -euo pipefail
usage="usage: $0 OUT_DIR EPISODES [key=value ...]"
if [ $# -lt 2 ]; then
    echo "$usage" >&2
    exit 2
fi
out=$1 episodes=$2
shift 2
# Checked before the setup, which can take minutes.
if [[ -z ${out//[[:space:]]/} || $out == -* ]]; then
    echo "$0: OUT_DIR is '$out': give the folder to write the dataset in" >&2
    echo "$usage" >&2
    exit 2
fi
if ! [[ $episodes =~ ^[1-9][0-9]*$ ]]; then
    echo "$0: EPISODES is '$episodes', not a positive whole number" >&2
    echo "$usage" >&2
    exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -z "${TDMPC2_BIN:-}" ]; then "$here/setup.sh" >&2; fi
source "$here/env.sh"
bin=${TDMPC2_BIN:-$(cargo metadata --manifest-path "$tdmpc2_root/Cargo.toml" --format-version 1 \
    --no-deps | python -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/tdmpc2}
exec "$bin" collect --out="$out" --episodes "$episodes" "$@"
