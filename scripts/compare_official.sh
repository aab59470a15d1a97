#!/usr/bin/env bash
# Times plan and update of the official TD-MPC2 code (a checkout of nicklashansen/tdmpc2 that you
# provide) and of this project, on the CPU or on CUDA, with the same torch (the project's venv),
# in one sitting: rounds alternate ours, official, ours, official, ... so that a machine whose
# speed drifts affects both alike. Optionally also the agent steps/s of both trainers. Prints
# every measurement as a JSON line (`tdmpc2 bench` lines with "impl" and "round"), then a table:
# per side the lowest of the rounds' medians (other load only slows calls down), each round's own
# ratio, the fastest single calls and, with compile, the official compile warm-up.
#
#   scripts/compare_official.sh OFFICIAL_CHECKOUT [--device cpu|cuda] [--compile true|false]
#       [--rounds N] [--model-sizes 1,5,19,48] [--dims walker|dog] [--threads N] [--repeats N]
#       [--trainer-steps N] [--trainer-seed-steps N] [--bin PATH] [--out FILE]
#   scripts/compare_official.sh OFFICIAL_CHECKOUT --download-wheels DIR
#
# Defaults: --device cpu; --compile true on cuda (the official default), false on the CPU;
# 2 rounds; model sizes 1 and 5 (any of the official presets 1, 5, 19, 48); walker-run
# dimensions (obs 24, action 6; --dims dog: dog-run, obs 223, action 38, 8 MPPI iterations);
# 2 threads; 10 timed calls per measurement; batch 256; the official config.yaml with its
# model-size presets; no trainer timing.
#
# The official plan is timed through `agent.act` after a first call with t0=True (warm start),
# its update through `agent.update` on a random batch (scripts/compare_official.py: the warm-up
# rule with compile, the cold compile cache, what it adapts on the CPU; on CUDA it runs as is).
# Ours: `tdmpc2 bench --cases agent` (eager; on the CPU either way, since ours compiles nothing
# on the CPU), or with --device cuda --compile true `tdmpc2 bench --cases graphs` (plan and
# update as CUDA graphs, our `compile=true`, with our fused kernels off and on). Both use TF32 on
# CUDA (the official train.py's 'high').
#
# --trainer-steps N (after the rounds, per model size): the official OnlineTrainer on
# walker-run, one environment, --trainer-seed-steps seeding steps (default 500, one episode; the
# official default is 2500; at the end of seeding it pretrains with as many updates), then N
# timed agent steps; ours: `tdmpc2 bench --cases loop --loop-task walker-run --pipeline false`
# with 1 and with 16 environments, one update per vector step (one episode of seeding an
# environment, then N agent steps), on CUDA with graphs also with our fused kernels. Both report
# agent steps/s from the first planned step to the end; the official line also the median
# step's rate and the steps that compiling slowed. It needs torchrl and gymnasium 0.29.1 besides
# tensordict.
#
# The official code's packages (tensordict; with --trainer-steps torchrl and gymnasium) are
# installed beside the venv, not into it: see scripts/official_env.sh. --download-wheels DIR
# downloads their wheels (and those of their requirements) for this venv's Python on manylinux
# x86_64 into DIR and exits; on a machine without network set TDMPC2_OFFICIAL_WHEELS=DIR.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/env.sh"

usage() {
    { echo usage:; sed -n '10,13p' "$0" | sed 's/^#//'; } >&2
    exit 2
}
fail() {
    echo "compare_official.sh: $*" >&2
    exit 2
}

[[ $# -ge 1 && $1 != -* ]] || usage
checkout=$1
shift
rounds=2 sizes=1,5 threads=2 repeats=10 out="" device=cpu compile="" dims=walker
trainer_steps=0 trainer_seed_steps=500 wheels=""
bin=${CARGO_TARGET_DIR:-$root/target}/release/tdmpc2
while [[ $# -gt 0 ]]; do
    [[ $# -ge 2 ]] || fail "option $1 needs a value"
    case $1 in
    --device) device=$2 ;;
    --compile) compile=$2 ;;
    --rounds) rounds=$2 ;;
    --model-sizes) sizes=$2 ;;
    --dims) dims=$2 ;;
    --threads) threads=$2 ;;
    --repeats) repeats=$2 ;;
    --trainer-steps) trainer_steps=$2 ;;
    --trainer-seed-steps) trainer_seed_steps=$2 ;;
    --bin) bin=$2 ;;
    --out) out=$2 ;;
    --download-wheels) wheels=$2 ;;
    *) fail "unknown option '$1'; allowed: --device, --compile, --rounds, --model-sizes, --dims, --threads, --repeats, --trainer-steps, --trainer-seed-steps, --bin, --out, --download-wheels" ;;
    esac
    shift 2
done

source "$root/scripts/official_env.sh"
if [[ -n $wheels ]]; then
    official_checkout "$checkout"
    official_download_wheels "$wheels"
    echo "carry $wheels to the machine and set TDMPC2_OFFICIAL_WHEELS=$wheels there" >&2
    exit 0
fi

for name in rounds threads repeats; do
    [[ ${!name} =~ ^[1-9][0-9]*$ ]] || fail "--$name must be a positive integer, got '${!name}'"
done
[[ $trainer_steps =~ ^[0-9]+$ ]] || fail "--trainer-steps must be a whole number of agent steps (0: no trainer timing), got '$trainer_steps'"
[[ $trainer_seed_steps =~ ^[0-9]+$ && $trainer_seed_steps -ge 500 ]] ||
    fail "--trainer-seed-steps must be a whole number of at least 500 (one walker-run episode), got '$trainer_seed_steps'"
[[ $device == cpu || $device == cuda ]] || fail "--device must be cpu or cuda, got '$device'"
compile=${compile:-$([[ $device == cuda ]] && echo true || echo false)}
[[ $compile == true || $compile == false ]] || fail "--compile must be true or false, got '$compile'"
[[ $sizes =~ ^(1|5|19|48)(,(1|5|19|48))*$ ]] ||
    fail "--model-sizes must be a comma-separated list of the official presets 1, 5, 19 and 48 (e.g. 1,5), got '$sizes'"
case $dims in
walker) task=walker-run ;;
dog) task=dog-run ;;
*) fail "--dims must be walker (walker-run: obs 24, action 6) or dog (dog-run: obs 223, action 38), got '$dims'" ;;
esac
if [[ $trainer_steps -gt 0 && $trainer_seed_steps -ne 500 ]]; then
    echo "note: ours always seeds one episode an environment (500 steps each) in bench --cases loop; the official trainer seeds $trainer_seed_steps" >&2
fi

if [[ $trainer_steps -gt 0 ]]; then
    official_env "$checkout" trainer
else
    official_env "$checkout"
fi
[[ -x $bin ]] || fail "no tdmpc2 binary at $bin; build it with scripts/setup.sh (or cargo build --release --bins), or pass --bin PATH"

if [[ -z $out ]]; then
    out=$(mktemp -t compare_official.XXXXXX.jsonl)
fi
: >"$out"
load() { cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo null; }
# The official side's JSON lines (scripts/compare_official.py with the given arguments).
official_lines() { "$python" "$root/scripts/compare_official.py" "$@" | tee -a "$out"; }
# Tags the JSON lines of ours with impl, round and the load average before and after.
tag() { sed "s/^{/{\"impl\":\"ours\",\"round\":$1,\"load_average\":[$2,$(load)],/"; }

# Ours with graphs measures the fused kernels off and on in calls of their own: a failure of
# the fused kernels must not take the figures without them along.
if [[ $device == cuda && $compile == true ]]; then
    ours_calls=("--fused-kernels false" "--fused-kernels true")
    ours=("$bin" bench --cases graphs --device cuda --tasks "$task" --model-sizes "$sizes"
        --agent-repeats "$repeats")
else
    ours_calls=("")
    ours=("$bin" bench --cases agent --device "$device" --tasks "$task" --model-sizes "$sizes"
        --threads "$threads" --agent-repeats "$repeats")
fi
official=(--device "$device" --compile "$compile" --threads "$threads")

# A measurement that fails is named and the others go on (one device call must bring back
# every figure it can); the exit status says whether any failed.
failed=()
measure() {
    local what=$1
    shift
    "$@" || {
        echo "compare_official.sh: $what failed; going on with the rest" >&2
        failed+=("$what")
    }
}
# Ours: one bench call ($2 ...), its lines tagged with round $1 and the load average.
ours_lines() {
    local round=$1 before
    shift
    before=$(load)
    "$@" | tag "$round" "$before" | tee -a "$out"
}

trainer_note=""
if [[ $trainer_steps -gt 0 ]]; then
    trainer_note=", then $trainer_steps trainer steps after $trainer_seed_steps seeding steps"
fi
echo "torch $("$python" -c 'import torch; print(torch.__version__)'), device $device, compile=$compile, $task dims, $threads threads, $rounds rounds, model sizes $sizes, $repeats calls per measurement$trainer_note; lines in $out" >&2
for ((round = 1; round <= rounds; round++)); do
    for call in "${ours_calls[@]}"; do
        # shellcheck disable=SC2086 # the call's options are separate words
        measure "ours, round $round${call:+ ($call)}" ours_lines "$round" "${ours[@]}" $call
    done
    # One process per size: each compiles from a cold cache, as a fresh run would.
    for size in ${sizes//,/ }; do
        measure "the official plan and update at model size $size, round $round" \
            official_lines time "$checkout" --model-sizes "$size" --dims "$dims" "${official[@]}" \
            --repeats "$repeats" --round "$round"
    done
done
# Ours on walker-run at model size $1 with $2 environments (one update per vector step) for as
# many agent steps as the official trainer's, the rest of the arguments given to the bench.
ours_trainer() {
    local size=$1 envs=$2
    shift 2
    ours_lines 0 "$bin" bench --cases loop --loop-task walker-run --model-sizes "$size" \
        --num-envs "$envs" --pipeline false --compile "$compile" \
        --loop-steps $(((trainer_steps + envs - 1) / envs)) --device "$device" \
        --threads "$threads" "$@"
}
if [[ $trainer_steps -gt 0 ]]; then
    for size in ${sizes//,/ }; do
        # The official trainer first: its compile takes minutes, ours are short and known, and
        # a limit that cuts the call then cuts ours.
        PYTHONPATH="$official_trainer_path:$PYTHONPATH" measure \
            "the official trainer at model size $size" official_lines trainer "$checkout" \
            --model-sizes "$size" "${official[@]}" --steps "$trainer_steps" \
            --seed-steps "$trainer_seed_steps"
        for envs in 1 16; do
            measure "our loop at model size $size, $envs environments" ours_trainer "$size" "$envs"
            if [[ $device == cuda && $compile == true ]]; then
                measure "our loop at model size $size, $envs environments, fused kernels" \
                    ours_trainer "$size" "$envs" --loop-set fused_kernels=true
            fi
        done
    done
fi
"$python" "$root/scripts/compare_official.py" summary "$out" || failed+=("the summary")
if [[ ${#failed[@]} -gt 0 ]]; then
    printf 'compare_official.sh: failed: %s\n' "${failed[@]}" >&2
    exit 1
fi
