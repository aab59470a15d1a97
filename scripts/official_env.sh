# shellcheck shell=bash
# Sourced by the scripts that run the official TD-MPC2 code beside ours (compare_official.sh,
# check_parity.sh), after scripts/env.sh and with a `fail` function (prints, exits 2).
#
# `official_env CHECKOUT [trainer]` checks that CHECKOUT is a checkout of nicklashansen/tdmpc2
# (its root, or its tdmpc2/ folder) and sets `checkout` to its root and `python` to the project's
# venv. The official agent needs `tensordict`, which the venv does not have: the version that the
# checkout's docker/environment.yaml pins (0.8.3 if it names none) is installed with
# `pip install --target --no-deps` into $TDMPC2_OFFICIAL_DEPS (default
# ~/.cache/tdmpc2/official-deps), and that folder goes on PYTHONPATH; the venv is not changed.
# With `trainer`, the official online trainer's needs are added: `torchrl` (its buffer; pin
# 0.8.1) into the same folder, and `gymnasium` at its pin (0.29.1: the venv's gymnasium 1.x
# refuses the official dm_control wrappers, which are no gymnasium.Env) into
# $TDMPC2_OFFICIAL_DEPS/trainer-only, which `official_trainer_path` names: put it first on
# PYTHONPATH for the official trainer only. The trainer's other imports (numpy, cloudpickle,
# packaging, orjson, importlib_metadata, dm_control) are the venv's; one that is missing is
# installed into the deps folder too. hydra, omegaconf, termcolor, pandas and wandb are not
# needed: the scripts build the official config themselves (with PyYAML, installed likewise
# where missing) and drop the official Logger. A Python without pip unpacks the wheels of
# $TDMPC2_OFFICIAL_WHEELS instead (below).
#
# Offline (a machine without network): `official_download_wheels DIR` (after official_checkout)
# downloads the pinned wheels and those requirements for this venv's Python (or
# $TDMPC2_WHEELS_PYTHON, e.g. 3.12) on manylinux x86_64 into DIR; there, with
# TDMPC2_OFFICIAL_WHEELS=DIR set, everything is installed from DIR (`pip --no-index
# --find-links DIR`).

# Requirements of tensordict, torchrl and gymnasium that a venv may lack: module, then the
# distribution pip installs it from.
official_requirements=(orjson:orjson cloudpickle:cloudpickle packaging:packaging
    importlib_metadata:importlib-metadata zipp:zipp farama_notifications:farama-notifications
    typing_extensions:typing-extensions yaml:PyYAML)

official_checkout() {
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
}

# The version of NAME that the checkout's docker/environment.yaml pins, else DEFAULT.
official_pin() {
    local pin
    pin=$(sed -n "s/^[[:space:]-]*$1==\([0-9][0-9.]*\).*/\1/p" "$checkout/docker/environment.yaml" 2>/dev/null | head -n 1)
    echo "${pin:-$2}"
}

# Where pip takes packages from: the index, or the wheels in $TDMPC2_OFFICIAL_WHEELS only.
official_pip_source() {
    if [[ -n ${TDMPC2_OFFICIAL_WHEELS:-} ]]; then
        [[ -d $TDMPC2_OFFICIAL_WHEELS ]] || fail "TDMPC2_OFFICIAL_WHEELS '$TDMPC2_OFFICIAL_WHEELS' is not a directory; download the wheels with scripts/compare_official.sh OFFICIAL_CHECKOUT --download-wheels DIR"
        pip_source=(--no-index --find-links "$TDMPC2_OFFICIAL_WHEELS")
        pip_from="the wheels in $TDMPC2_OFFICIAL_WHEELS"
    else
        pip_source=()
        pip_from="the package index"
    fi
}

# official_install TARGET SPEC [why]: pip install --target TARGET --no-deps SPEC; for a Python
# without pip, the wheel of SPEC in $TDMPC2_OFFICIAL_WHEELS unpacked into TARGET (what pip
# --no-deps does with these wheels, which have no .data folder).
official_install() {
    local pip_source pip_from
    if ! "$python" -m pip --version >/dev/null 2>&1; then
        [[ -n ${TDMPC2_OFFICIAL_WHEELS:-} ]] ||
            fail "$python has no pip to install $2 with; install pip, or set TDMPC2_OFFICIAL_WHEELS to a folder of wheels (see scripts/official_env.sh)"
        echo "unpacking $2${3:+ ($3)} from the wheels in $TDMPC2_OFFICIAL_WHEELS into $1 ($python has no pip)" >&2
        "$python" - "$1" "$2" "$TDMPC2_OFFICIAL_WHEELS" <<'EOF' >&2 || fail "could not unpack $2 into $1"
import glob, os, re, sys, zipfile
target, spec, folder = sys.argv[1:4]
name, _, version = spec.partition("==")
norm = lambda text: re.sub(r"[-_.]+", "_", text).lower()
found = sorted(
    path for path in glob.glob(os.path.join(folder, "*.whl"))
    if norm(os.path.basename(path).split("-")[0]) == norm(name)
    and (not version or os.path.basename(path).split("-")[1] == version)
)
if not found:
    sys.exit(f"no wheel of {spec} in {folder}")
os.makedirs(target, exist_ok=True)
with zipfile.ZipFile(found[-1]) as wheel:
    wheel.extractall(target)
EOF
        return 0
    fi
    official_pip_source
    echo "installing $2${3:+ ($3)} from $pip_from into $1 (pip --target, --no-deps)" >&2
    "$python" -m pip install --quiet --upgrade --target "$1" --no-deps "${pip_source[@]}" "$2" >&2 ||
        fail "pip could not install $2 into $1 from $pip_from${TDMPC2_OFFICIAL_WHEELS:+ (is its wheel in that folder? see scripts/official_env.sh)}"
}

# official_pinned TARGET NAME VERSION: installs NAME==VERSION into TARGET unless Python already
# finds that version with TARGET first on its path.
official_pinned() {
    local installed
    installed=$(PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}" "$python" -c \
        'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$2" 2>/dev/null || true)
    [[ $installed == "$3" ]] || official_install "$1" "$2==$3" "pinned by the checkout"
}

official_env() {
    official_checkout "$1"
    local trainer=${2:-} deps modules missing tries pair found
    [[ -z $trainer || $trainer == trainer ]] || fail "official_env: unknown argument '$trainer' (allowed: trainer)"
    deps=${TDMPC2_OFFICIAL_DEPS:-$HOME/.cache/tdmpc2/official-deps}
    official_trainer_path=$deps/trainer-only
    export PYTHONPATH="$deps${PYTHONPATH:+:$PYTHONPATH}"
    official_pinned "$deps" tensordict "$(official_pin tensordict 0.8.3)"
    modules=(yaml tensordict)
    if [[ $trainer == trainer ]]; then
        official_pinned "$deps" torchrl "$(official_pin torchrl 0.8.1)"
        official_pinned "$official_trainer_path" gymnasium "$(official_pin gymnasium 0.29.1)"
        modules+=(torchrl torchrl.data.replay_buffers gymnasium)
    fi
    # What the installed packages import and the venv lacks goes into the deps folder too.
    for ((tries = 0; tries < ${#official_requirements[@]} + 1; tries++)); do
        missing=$(PYTHONPATH="$official_trainer_path:$PYTHONPATH" "$python" -W ignore -c '
import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        print((e.name or "?").split(".")[0])
        break' "${modules[@]}" 2>/dev/null) || fail "importing ${modules[*]} failed; run: PYTHONPATH=$official_trainer_path:$PYTHONPATH $python -c 'import ${modules[*]}'"
        [[ -n $missing ]] || return 0
        found=""
        for pair in "${official_requirements[@]}"; do
            if [[ ${pair%%:*} == "$missing" ]]; then found=${pair#*:}; fi
        done
        [[ -n $found ]] || fail "the official code's packages (${modules[*]}) need the module '$missing', which neither the venv nor $deps has"
        official_install "$deps" "$found" "imported by ${modules[*]}, not in the venv"
    done
    fail "could not make ${modules[*]} importable (still missing: $missing)"
}

# official_download_wheels DIR: the pinned packages and their requirements as wheels, for
# TDMPC2_OFFICIAL_WHEELS=DIR on a machine without network.
official_download_wheels() {
    local dir=$1 version pair requirements=()
    version=${TDMPC2_WHEELS_PYTHON:-$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}
    [[ $version =~ ^3\.[0-9]+$ ]] || fail "TDMPC2_WHEELS_PYTHON must be a Python version like 3.12, got '$version'"
    for pair in "${official_requirements[@]}"; do
        requirements+=("${pair#*:}")
    done
    mkdir -p "$dir" || fail "cannot create the wheel folder '$dir'"
    echo "downloading wheels for Python $version, manylinux x86_64, into $dir" >&2
    "$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$version" \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" \
        "tensordict==$(official_pin tensordict 0.8.3)" "torchrl==$(official_pin torchrl 0.8.1)" \
        "gymnasium==$(official_pin gymnasium 0.29.1)" "${requirements[@]}" >&2 ||
        fail "pip could not download the wheels into $dir"
    ls -l "$dir" >&2
}
