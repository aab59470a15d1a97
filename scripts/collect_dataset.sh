#!/usr/bin/env bash
# A dataset in the official format (chunk_<i>.pt files) from any trained agent, for offline
# training with `tdmpc2 train data_dir=OUT_DIR`:
#   scripts/collect_dataset.sh OUT_DIR EPISODES [key=value ...]
#   scripts/collect_dataset.sh data/mine 300 "task=[walker-run,cup-catch]" checkpoint=runs/.../1
# Without checkpoint=, the episodes play uniform random actions. The agent's settings (task,
# model_size, ...) must be those it was trained with. Sets everything up on first use.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 OUT_DIR EPISODES [key=value ...]" >&2
    exit 2
fi
out=$1 episodes=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$here/setup.sh" >&2
source "$here/env.sh"
bin=$(cargo metadata --manifest-path "$tdmpc2_root/Cargo.toml" --format-version 1 --no-deps \
    | python -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/tdmpc2
exec "$bin" collect --out "$out" --episodes "$episodes" "$@"
