#!/usr/bin/env bash
# Runs the tests that need a CUDA GPU (ignored by the normal suite): tests/fused_kernels.rs (our
# NVRTC-compiled kernels against torch's operations), tests/cuda_graphs.rs (the CUDA-graph shim), tests/device_paths.rs (one rank through NCCL in a forced group, two ranks
# sharing one GPU through gloo, runs with graphs stopped and resumed) and the official parity
# fixtures on CUDA (tests/parity.rs).
#
#   scripts/gpu_check.sh                 on a GPU machine with Rust: build and run them
#   scripts/gpu_check.sh --build [DIR]   build the test binaries and tdmpc2 only and copy them to
#                                        DIR (default target/gpu-check), for a GPU machine
#                                        without Rust; with them dm_control and MuJoCo from the
#                                        venv (dmc.tar.xz, for --learn, --walker and the
#                                        trainers of --compare)
#   scripts/gpu_check.sh --run [DIR]     run those prebuilt binaries on the GPU machine
#   scripts/gpu_check.sh --run DIR --bench
#                                        instead of the tests, the GPU figures: plan and update
#                                        ms eager and as CUDA graphs, and the kernels of each
#                                        (bench --cases graphs --kernels; at sizes 19 and 48
#                                        ms, peak memory and the update's share of a large
#                                        matmul's rate), and the training
#                                        loop's agent steps/s without and with graphs, and
#                                        with graphs and the fused kernels (bench --cases
#                                        loop); each JSON line also lands in
#                                        $OUT/gpu_bench.jsonl when $OUT is set
#   scripts/gpu_check.sh --run DIR --all [SECONDS]
#                                        the tests, --bench and --learn in one call, learning
#                                        until SECONDS (default 540) have passed since the
#                                        start: one 10-minute device call; logs in $OUT
#   scripts/gpu_check.sh --run DIR --compare [SIZES] [OPTIONS ...]
#                                        the official code compiled as it runs by default beside
#                                        ours on this GPU (scripts/compare_official.sh --device
#                                        cuda --rounds 1; SIZES default 1,5; OPTIONS go to it,
#                                        e.g. --dims dog or --trainer-steps 2000), with the
#                                        official checkout and wheels that --build carried when
#                                        TDMPC2_OFFICIAL_CHECKOUT named a checkout, and the
#                                        dm_control it packed (for the trainers); lines in
#                                        $OUT/compare.jsonl
#   scripts/gpu_check.sh --run DIR --walker RUNS [SECONDS] [KEY=VALUE ...]
#                                        instead of the tests, walker-run at model size 5 with
#                                        graphs: the named runs of scripts/time_to_return.py
#                                        (official-ratio, spu4, spu16, spu4-b1024, spu16-b4096;
#                                        comma-separated) one after
#                                        another until SECONDS (default 540) have passed, each
#                                        watched for its first evaluation at 700; KEY=VALUE go to
#                                        every run; metrics, summaries and logs land in $OUT
#   scripts/gpu_check.sh --run DIR --learn [SECONDS]
#                                        instead of the tests, cartpole-swingup at model size 1
#                                        with graphs and the fused kernels (their first whole
#                                        run; without them it learnt on an H100 and an H200)
#                                        for 50k agent steps (at most SECONDS,
#                                        default 420; about 330 on an H200), evaluated every
#                                        10k; the log and eval.csv land in $OUT when it is set
#
# Prebuilt binaries need the same torch wheel version there; its libraries (and the site-packages
# the embedded Python imports torch from) are found through $TDMPC2_VENV/bin/python when set,
# else the python3 on PATH.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# Test binaries with ignored tests that need a GPU; "binary test" runs only that test of it.
# Those proven on a GPU first: a first run of the fused kernels that hangs must not leave them
# no time.
tests=(cuda_graphs device_paths "parity matches_the_official_implementation_on_cuda" fused_kernels
    "parity matches_the_official_implementation_on_cuda_with_fused_kernels")
names=("${tests[@]%% *}")

# The arguments that run entry $1 of `tests` after `--ignored`.
only() {
    [[ $1 == *" "* ]] && echo "--exact ${1#* }"
    return 0
}

usage() {
    echo "usage: scripts/gpu_check.sh [--build [DIR] | --run [DIR] [--bench | --compare [SIZES] [OPTIONS ...] | --learn [SECONDS] | --walker RUNS [SECONDS] [KEY=VALUE ...] | --all [SECONDS]]]" >&2
    exit 2
}

# Runs $2 ... for at most $1 seconds (SIGKILL 10 s after the SIGTERM), and never past $deadline
# (SECONDS) when it is set: a hung collective must not take the rest of a device call with it.
# Says so when the limit cut it, or when no time was left to start it.
limited() {
    local limit=$1 rc=0
    shift
    if [[ -n ${deadline:-} ]] && ((deadline - SECONDS < limit)); then
        limit=$((deadline - SECONDS))
    fi
    # (timeout takes 0 for no limit at all, and refuses a negative one.)
    if ((limit < 10)); then
        echo "[gpu_check] no time left for: $*" >&2
        return 124
    fi
    timeout -k 10 "$limit" "$@" || rc=$?
    if [[ $rc == 124 || $rc == 137 ]]; then
        echo "[gpu_check] cut after $limit s: $*" >&2
    fi
    return $rc
}

# The GPU tests, one at a time (their own GPU lock aside, two test binaries must not share it).
run_tests() {
    local failed=0
    for test in "${tests[@]}"; do
        echo "[gpu_check] $test"
        # shellcheck disable=SC2046 # `only` prints separate words
        limited "${TEST_LIMIT:-300}" "$dir/${test%% *}" --ignored --test-threads=1 $(only "$test") \
            2>&1 | tee "$tmp/test.log" || failed=1
        # A name that matches no test runs none and exits 0.
        if grep -q "^running 0 tests" "$tmp/test.log"; then
            echo "[gpu_check] $test: no test of that name ran" >&2
            failed=1
        fi
    done
    return $failed
}

# The GPU figures, each JSON line also in $out/gpu_bench.jsonl.
run_bench() {
    local failed=0
    bench() {
        echo "[gpu_check] bench $*"
        limited "${BENCH_LIMIT:-150}" "$dir/tdmpc2" bench "$@" | tee -a "$out/gpu_bench.jsonl" ||
            failed=1
    }
    # Without and with the fused kernels in calls of their own: a failure of the fused kernels
    # must not take the figures without them along.
    for fused in false true; do
        bench --cases graphs --device cuda --tasks walker-run --model-sizes 1,5 --kernels \
            --agent-repeats 20 --fused-kernels $fused
    done
    # The seed runs' sizes: ms, peak memory and the update's share of a large matmul's rate.
    for fused in false true; do
        bench --cases graphs --device cuda --tasks walker-run --model-sizes 19,48 \
            --agent-repeats 20 --fused-kernels $fused
    done
    bench --cases loop --device cuda --compile false,true --model-sizes 1 --num-envs 1 \
        --pipeline false,true --loop-steps 300
    bench --cases loop --device cuda --compile false,true --model-sizes 5 --num-envs 16 \
        --pipeline false,true --loop-steps 60
    # The same loops with graphs and the fused kernels (issue targets: 300 and 2,000 steps/s).
    bench --cases loop --device cuda --compile true --model-sizes 1 --num-envs 1 \
        --pipeline false,true --loop-steps 300 --loop-set fused_kernels=true
    bench --cases loop --device cuda --compile true --model-sizes 5 --num-envs 16 \
        --pipeline false,true --loop-steps 60 --loop-set fused_kernels=true
    return $failed
}

# The official compiled code beside ours (sizes $1, the rest of the arguments options of
# compare_official.sh), from what --build carried; the GPU machine has no venv, so its python3
# stands in for one.
run_compare() {
    local sizes=$1 venv
    shift
    [[ -d $dir/official/tdmpc2 && -d $dir/official-wheels ]] || {
        echo "[gpu_check] no official checkout or wheels in $dir: build with TDMPC2_OFFICIAL_CHECKOUT set" >&2
        return 2
    }
    # torch.compile's Triton kernels need a C compiler and Python's headers here: say so in
    # seconds, not after the official side's minutes (ours is measured either way).
    limited 120 "$python" -c 'import torch; f = torch.compile(lambda x: x * 2 + 1); f(torch.ones(4, device="cuda"))' ||
        echo "[gpu_check] torch.compile does not work here (a C compiler and Python.h are needed): the official compile=true side will fail" >&2
    # The trainers (--trainer-steps) run walker-run: without dm_control they would fail only
    # after the rounds' minutes of compiling.
    if [[ " $* " == *" --trainer-steps "* ]]; then
        with_dm_control || return 2
    fi
    venv=$(mktemp -d)
    mkdir -p "$venv/bin"
    # A wrapper, not a link: a link would hide the venv (or the installation) the Python is in.
    printf '#!/bin/sh\nexec %q "$@"\n' "$(command -v "$python")" >"$venv/bin/python"
    chmod +x "$venv/bin/python"
    echo "[gpu_check] official vs ours on CUDA, model sizes $sizes $*: $out/compare.jsonl, compare.log"
    # What is left of a 10-minute call (less 25 s to bring the files back), unless said.
    TDMPC2_VENV=$venv TDMPC2_OFFICIAL_WHEELS=$dir/official-wheels \
        TDMPC2_OFFICIAL_DEPS=$(mktemp -d) limited "${COMPARE_LIMIT:-$((575 - SECONDS))}" \
        "$here/compare_official.sh" "$dir/official" \
        --device cuda --rounds 1 --model-sizes "$sizes" --bin "$dir/tdmpc2" \
        --out "$out/compare.jsonl" "$@" 2>&1 | tee "$out/compare.log"
}

# Puts the dm_control that --build packed on PYTHONPATH, for the DMControl tasks.
with_dm_control() {
    [[ -f $dir/dmc.tar.xz ]] || { echo "[gpu_check] no $dir/dmc.tar.xz: see --build" >&2; return 2; }
    local extra
    extra=$(mktemp -d)
    # By Python's tarfile: the device may have no xz program.
    # filter="data" where this Python has it (3.12, and backports to 3.8.17+).
    "$python" -c '
import sys, tarfile
archive = tarfile.open(sys.argv[1])
try:
    archive.extractall(sys.argv[2], filter="data")
except TypeError:
    archive.extractall(sys.argv[2])' \
        "$dir/dmc.tar.xz" "$extra" || { echo "[gpu_check] cannot unpack $dir/dmc.tar.xz" >&2; return 2; }
    export PYTHONPATH="$extra${PYTHONPATH:+:$PYTHONPATH}" MUJOCO_GL=disable
    # What it needs from this Python (numpy, scipy, lxml, absl) is here, or nothing can run.
    "$python" -c 'from dm_control import suite; suite.load("walker", "run")' || {
        echo "[gpu_check] dm_control does not load with $python" >&2
        return 2
    }
}

# The walker-run runs $1 of scripts/time_to_return.py until $2 seconds have passed since this
# script started (its own start-up, unpacking dm_control, counts), the rest of the arguments
# going to it (overrides for every run, --grace).
run_walker() {
    with_dm_control || return 2
    local runs=$1 total=$2 seconds=$(($2 - SECONDS))
    shift 2
    if ((seconds < 60)); then
        echo "[gpu_check] --walker: $seconds s left of $total, too few for a run" >&2
        return 2
    fi
    # Each run brings back two files, and a device call at most 8 in all.
    if [[ $runs == *,*,* ]]; then
        echo "[gpu_check] --walker $runs: at most two runs a call (a device call brings back 8 files)" >&2
        return 2
    fi
    echo "[gpu_check] walker-run $runs, $seconds s at most: $out/walker.jsonl"
    "$python" "$here/time_to_return.py" --bin "$dir/tdmpc2" --out "$out" --runs "$runs" \
        --seconds "$seconds" "$@"
}

# cartpole-swingup at model size 1 with graphs and the fused kernels, for at most $1 seconds,
# with the dm_control that --build packed; the log and eval.csv in $out. A run cut at its
# limit is not a failure: its evaluations so far are the result.
run_learn() {
    if [[ $1 -lt 60 ]]; then
        echo "[gpu_check] no learning run: $1 s left, fewer than a minute" >&2
        return 0
    fi
    with_dm_control || return 2
    local run rc=0
    run=$(mktemp -d)/cartpole
    echo "[gpu_check] cartpole-swingup, model size 1, graphs, fused kernels, $1 s at most: $out/cartpole.log"
    timeout -k 15 -s INT "$1" \
        "$dir/tdmpc2" train task=cartpole-swingup model_size=1 steps=50000 eval_freq=10000 \
        eval_episodes=4 save_freq=1000000 device=cuda compile=true fused_kernels=true \
        run_dir="$run" \
        >"$out/cartpole.log" 2>&1 || rc=$?
    cp "$run/eval.csv" "$out/cartpole_eval.csv" 2>/dev/null || true
    grep -E "^eval|compile=true|finished" "$out/cartpole.log" || true
    case $rc in
    0) return 0 ;;
    124 | 137) echo "[gpu_check] the learning run was cut at its $1 s limit" >&2; return 0 ;;
    *) return 1 ;;
    esac
}

case "${1:-}" in
"")
    source "$here/env.sh"
    cd "$root"
    for test in "${tests[@]}"; do
        # shellcheck disable=SC2046 # `only` prints separate words
        cargo test --release --test "${test%% *}" -- --ignored $(only "$test")
    done
    ;;
--build)
    source "$here/env.sh"
    cd "$root"
    dir=${2:-$root/target/gpu-check}
    mkdir -p "$dir"
    cargo build --release --bins
    artifacts=$(cargo test --release --no-run --message-format=json "${names[@]/#/--test=}")
    for test in "${names[@]}" tdmpc2; do
        exe=$(python3 -c '
import json, sys
name = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == name and m.get("executable"):
        print(m["executable"])' "$test" <<<"$artifacts" | tail -n 1)
        if [[ $test == tdmpc2 && -z $exe ]]; then
            exe=$(cargo metadata --format-version 1 --no-deps |
                python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/tdmpc2
        fi
        [[ -n $exe && -x $exe ]] || { echo "[gpu_check] cargo built no $test binary" >&2; exit 1; }
        # Without debug info they are a few MiB instead of ~90, small enough to carry.
        if command -v strip >/dev/null; then
            strip --strip-debug -o "$dir/$test" "$exe"
        else
            cp "$exe" "$dir/$test"
        fi
    done
    # dm_control for the runs on walker-run and cartpole-swingup, without what state-based tasks
    # never load (locomotion, the renderers), small enough to carry.
    site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if [[ -d $site/dm_control && -d $site/mujoco ]]; then
        tar -C "$site" -c --exclude=__pycache__ --exclude=mujoco/experimental \
            --exclude='mujoco/_render_filament*' --exclude=dm_control/locomotion \
            --exclude=dm_control/blender --exclude=dm_control/suite/dog_assets \
            --exclude=dm_control/mujoco/testing --exclude='*_test.py' \
            mujoco dm_control dm_env tree glfw |
            xz -T2 -6 >"$dir/dmc.tar.xz"
    else
        echo "[gpu_check] no dm_control in $site: --learn, --walker and --compare's trainers will not run" >&2
    fi
    # The official code and the wheels it needs there, for --compare.
    if [[ -n ${TDMPC2_OFFICIAL_CHECKOUT:-} ]]; then
        official=$TDMPC2_OFFICIAL_CHECKOUT
        # Its tdmpc2/ folder names the checkout too, as scripts/official_env.sh takes it.
        if [[ ! -d $official/docker && -d $official/../docker ]]; then official=$official/..; fi
        [[ -d $official/tdmpc2 && -d $official/docker ]] || {
            echo "[gpu_check] TDMPC2_OFFICIAL_CHECKOUT=$TDMPC2_OFFICIAL_CHECKOUT is no checkout of the official code (no tdmpc2/ and docker/)" >&2
            exit 2
        }
        rm -rf "$dir/official" "$dir/official-wheels"
        mkdir -p "$dir/official"
        cp -r "$official/tdmpc2" "$official/docker" "$dir/official/"
        "$here/compare_official.sh" "$official" --download-wheels "$dir/official-wheels"
    else
        echo "[gpu_check] TDMPC2_OFFICIAL_CHECKOUT is not set: --compare will not run" >&2
    fi
    # Which source the binaries are: --run copies it beside the results.
    { git -C "$root" rev-parse HEAD && git -C "$root" status --short; } >"$dir/BUILD" 2>/dev/null || true
    # The device takes the working tree and what is carried, 64 MiB in all.
    tree=$(git -C "$root" ls-files -z --cached --others --exclude-standard |
        (cd "$root" && du -cb --files0-from=- 2>/dev/null) | tail -n 1 | cut -f1) || true
    tree=${tree:-0}
    carried=$(du -sb "$dir" | cut -f1)
    echo "[gpu_check] working tree $((tree >> 20)) MiB + $dir $((carried >> 20)) MiB = $(((tree + carried) >> 20)) MiB (the device takes 64)"
    if ((tree + carried > 64 << 20)); then
        echo "[gpu_check] too large to carry whole: carry fewer of $dir's files" >&2
    fi
    echo "[gpu_check] binaries in $dir (run them with: scripts/gpu_check.sh --run $dir)"
    ;;
--run)
    dir=${2:-$root/target/gpu-check}
    [[ -f $dir/tdmpc2 ]] || { echo "[gpu_check] no binaries in $dir: build them with --build" >&2; exit 2; }
    # A copy may lose the files' modes.
    chmod +x "$dir"/tdmpc2 "${names[@]/#/$dir/}" 2>/dev/null || true
    python=python3
    if [[ -n ${TDMPC2_VENV:-} && -x $TDMPC2_VENV/bin/python ]]; then
        python=$TDMPC2_VENV/bin/python
    fi
    # torch/lib, the nvidia wheels' lib folders and libpython, in case the venv the binaries
    # were linked against (their rpath) is not at the same place here.
    mapfile -t found < <("$python" -c '
import glob, os, sys, sysconfig, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
dirs = [os.path.join(os.path.dirname(torch.__file__), "lib")]
dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))
python_dirs = [sysconfig.get_config_var("LIBDIR"), os.path.join(sys.base_prefix, "lib")]
print(site)
print(":".join(d for d in dirs if d))
print(":".join(d for d in python_dirs if d))')
    if [[ ${#found[@]} -lt 2 ]]; then
        echo "[gpu_check] $python cannot import torch: the binaries need its libraries" >&2
        exit 2
    fi
    export TDMPC2_SITE_PACKAGES=${TDMPC2_SITE_PACKAGES:-${found[0]}}
    # torch's libraries first; libpython's folders after those the machine's LD_LIBRARY_PATH
    # names (a driver's, where it names one).
    export LD_LIBRARY_PATH="${found[1]}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}${found[2]:+:${found[2]}}"
    export TDMPC2_BIN=$dir/tdmpc2
    # A library the binaries cannot find fails every step within seconds: name it first.
    if missing=$(ldd "$dir/tdmpc2" 2>/dev/null | grep "not found"); then
        echo "[gpu_check] libraries not found for tdmpc2 (LD_LIBRARY_PATH=$LD_LIBRARY_PATH):" >&2
        echo "$missing" >&2
    fi
    tmp=$(mktemp -d)
    # The parity fixtures, where this checkout has them (the binaries name the build's).
    export TDMPC2_TEST_DATA=$root/tests/data
    out=${OUT:-$(mktemp -d)}
    if [[ -f $dir/BUILD ]]; then
        cp "$dir/BUILD" "$out/BUILD"
        echo "[gpu_check] binaries built from $(head -n 1 "$dir/BUILD")"
    fi
    status=0
    case "${3:-}" in
    "") run_tests ;;
    --bench) run_bench ;;
    --compare)
        if [[ -z ${4:-} || $4 == -* ]]; then
            run_compare 1,5 "${@:4}" || status=1
        else
            run_compare "$4" "${@:5}" || status=1
        fi
        ;;
    --learn) run_learn "${4:-420}" ;;
    --walker)
        [[ -n ${4:-} ]] || usage
        if [[ ${5:-} =~ ^[0-9]+$ ]]; then
            run_walker "$4" "$5" "${@:6}" || status=1
        else
            run_walker "$4" 540 "${@:5}" || status=1 # no SECONDS: overrides or options
        fi
        ;;
    --all)
        # One device call does it all: the tests, the figures, then learning until SECONDS. The
        # tests may take at most 40 % of it and the figures until 75 %, whatever each step's own
        # limit, so that every phase has its turn.
        total=${4:-540}
        end=$((SECONDS + total))
        deadline=$((SECONDS + total * 40 / 100))
        run_tests 2>&1 | tee "$out/tests.log" || status=1
        deadline=$((SECONDS > end - total / 4 ? SECONDS + 30 : end - total / 4))
        deadline=$((deadline > end ? end : deadline))
        run_bench >"$out/bench.log" 2>&1 || status=1
        deadline=
        run_learn $((end - SECONDS)) || status=1
        ;;
    *)
        usage
        ;;
    esac
    exit $status
    ;;
*)
    usage
    ;;
esac
