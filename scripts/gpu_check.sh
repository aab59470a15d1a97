#!/usr/bin/env bash
# Runs the tests that need a CUDA GPU (tests/cuda_graphs.rs; ignored by the normal suite).
#
#   scripts/gpu_check.sh                 on a GPU machine with Rust: build and run them
#   scripts/gpu_check.sh --build [DIR]   build the test binary only and copy it to DIR
#                                        (default target/gpu-check), for a GPU machine without Rust
#   scripts/gpu_check.sh --run [BINARY]  run that prebuilt binary (default
#                                        target/gpu-check/cuda_graphs) on the GPU machine
#
# A prebuilt binary needs the same torch wheel version there; its libraries are found through
# $TDMPC2_VENV/bin/python when set, else the python3 on PATH.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
default_bin=$root/target/gpu-check/cuda_graphs

case "${1:-}" in
"")
    source "$here/env.sh"
    cd "$root"
    cargo test --release --test cuda_graphs -- --ignored
    ;;
--build)
    source "$here/env.sh"
    cd "$root"
    dir=${2:-$root/target/gpu-check}
    exe=$(cargo test --release --test cuda_graphs --no-run --message-format=json |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cuda_graphs" and m.get("executable"):
        print(m["executable"])')
    [[ -n $exe ]] || { echo "[gpu_check] cargo built no cuda_graphs test binary" >&2; exit 1; }
    mkdir -p "$dir"
    # Without debug info it is a few MiB instead of ~90, small enough to carry to the GPU machine.
    if command -v strip >/dev/null; then
        strip --strip-debug -o "$dir/cuda_graphs" "$exe"
    else
        cp "$exe" "$dir/cuda_graphs"
    fi
    echo "[gpu_check] test binary: $dir/cuda_graphs (run it with: scripts/gpu_check.sh --run)"
    ;;
--run)
    bin=${2:-$default_bin}
    [[ -x $bin ]] || { echo "[gpu_check] no test binary at $bin: build it with --build" >&2; exit 2; }
    python=python3
    if [[ -n ${TDMPC2_VENV:-} && -x $TDMPC2_VENV/bin/python ]]; then
        python=$TDMPC2_VENV/bin/python
    fi
    # torch/lib, the nvidia wheels' lib folders and libpython, in case the venv the binary was
    # linked against (its rpath) is not at the same place here.
    libs=$("$python" -c '
import glob, os, sysconfig, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
dirs = [os.path.join(os.path.dirname(torch.__file__), "lib")]
dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))
dirs.append(sysconfig.get_config_var("LIBDIR"))
print(":".join(dirs))')
    LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bin" --ignored
    ;;
*)
    echo "usage: scripts/gpu_check.sh [--build [DIR] | --run [BINARY]]" >&2
    exit 2
    ;;
esac
