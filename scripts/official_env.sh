# Sourced by the scripts that run the official TD-MPC2 code beside ours (compare_official.sh,
# check_parity.sh), after scripts/env.sh and with a `fail` function (prints, exits 2).
#
# `official_env CHECKOUT` checks that CHECKOUT is a checkout of nicklashansen/tdmpc2 (its root,
# or its tdmpc2/ folder) and sets `checkout` to its root and `python` to the project's venv. The
# official code needs `tensordict`, which the venv does not have: the version that the
# checkout's docker/environment.yaml pins (0.8.3 if it names none) is installed with
# `pip install --target --no-deps` into $TDMPC2_OFFICIAL_DEPS (default
# ~/.cache/tdmpc2/official-deps), and that folder goes on PYTHONPATH; the venv is not changed.
official_env() {
    checkout=$1
    [[ -d $checkout ]] || fail "OFFICIAL_CHECKOUT '$checkout' is not a directory; pass a checkout of the official TD-MPC2 repository (nicklashansen/tdmpc2)"
    checkout=$(cd "$checkout" && pwd)
    if [[ ! -f $checkout/tdmpc2/tdmpc2.py && -f $checkout/tdmpc2.py && -f $checkout/../tdmpc2/tdmpc2.py ]]; then
        checkout=$(cd "$checkout/.." && pwd)
    fi
    local file
    for file in tdmpc2/tdmpc2.py tdmpc2/config.yaml tdmpc2/common/world_model.py tdmpc2/common/__init__.py; do
        [[ -f $checkout/$file ]] || fail "OFFICIAL_CHECKOUT '$checkout' is not a checkout of the official TD-MPC2 repository (nicklashansen/tdmpc2): $file is missing"
    done

    python=$TDMPC2_VENV/bin/python
    [[ -x $python ]] || fail "no Python venv at $TDMPC2_VENV; run scripts/setup.sh first (or set TDMPC2_VENV)"

    local deps pin installed
    deps=${TDMPC2_OFFICIAL_DEPS:-$HOME/.cache/tdmpc2/official-deps}
    pin=$(sed -n 's/.*tensordict==\([0-9][0-9.]*\).*/\1/p' "$checkout/docker/environment.yaml" 2>/dev/null | head -n 1)
    pin=${pin:-0.8.3}
    export PYTHONPATH="$deps${PYTHONPATH:+:$PYTHONPATH}"
    installed=$("$python" -c 'import tensordict; print(tensordict.__version__)' 2>/dev/null || true)
    if [[ $installed != "$pin" ]]; then
        echo "installing tensordict==$pin (pinned by the checkout) into $deps (pip --target, --no-deps)" >&2
        "$python" -m pip install --quiet --upgrade --target "$deps" --no-deps "tensordict==$pin" >&2 ||
            fail "pip could not install tensordict==$pin into $deps"
    fi
}
