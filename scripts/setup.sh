#!/usr/bin/env bash
# Sets up everything tdmpc2 needs, idempotently: a Python venv with the pinned requirements
# (torch is the libtorch the Rust side links against), then the release build.
# A second run with nothing changed takes seconds.
#
# Environment:
#   TDMPC2_VENV            venv directory (default: .venv in the repository)
#   TDMPC2_PYTHON          interpreter for a new venv (default: python3.12, else python3)
#   TDMPC2_TORCH_INDEX_URL install torch from this package index instead of PyPI, e.g. PyTorch's
#                          own CUDA 12.x wheel index for drivers that predate CUDA 13
#   TDMPC2_SKIP_BUILD=1    only the venv
#   TDMPC2_VENV_<FAMILY>   a family's venv (default: the venv's path with -<family> appended)
#
# Options:
#   --family NAME          also make the venv of a task family whose simulator cannot share the
#                          project's venv: metaworld, myosuite, or all (repeatable). Their
#                          environments step in worker processes that use it.
set -euo pipefail

families=()
while [ $# -gt 0 ]; do
    case $1 in
        --family) families+=("${2:?--family needs a name: metaworld, myosuite or all}"); shift 2 ;;
        --family=*) families+=("${1#--family=}"); shift ;;
        *) echo "setup.sh: unknown argument $1 (allowed: --family metaworld|myosuite|all)" >&2; exit 2 ;;
    esac
done
known_families=(metaworld myosuite)
selected=()
for family in "${families[@]}"; do
    case $family in
        all) selected+=("${known_families[@]}") ;;
        metaworld|myosuite) selected+=("$family") ;;
        *) echo "setup.sh: --family $family is not a family with a venv of its own (allowed: metaworld, myosuite, all)" >&2; exit 2 ;;
    esac
done

source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
root=$tdmpc2_root
venv=${TDMPC2_VENV%/}
say() { printf '[setup] %s\n' "$*" >&2; }

# The first interpreter that actually runs (a pyenv shim for a version that is not selected
# exists on PATH but fails).
find_python() {
    local pyenv_root=${PYENV_ROOT:-$HOME/.pyenv} candidate
    for candidate in ${TDMPC2_PYTHON:-} "$pyenv_root"/versions/3.12.*/bin/python3.12 python3.12 python3; do
        if "$candidate" -c 'import sys; assert sys.version_info >= (3, 10)' >/dev/null 2>&1; then
            command -v "$candidate"
            return
        fi
    done
    echo "no Python >= 3.10 found; set TDMPC2_PYTHON" >&2
    return 1
}

# A venv whose creation failed half-way (no python3-venv package: a python but no pip) is made
# again, not left to fail every later run.
if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    say "the venv $venv has no pip (its creation failed?): making it again"
    rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
    python=$(find_python)
    say "creating venv $venv with $python ($("$python" --version 2>&1))"
    if ! "$python" -m venv "$venv"; then
        rm -rf "$venv"
        echo "setup.sh: $python cannot make a venv; install its venv module (apt: python3-venv, or python3.12-venv)" >&2
        exit 1
    fi
fi

# The stamp records what the venv was built from; pip runs only when it changes.
stamp_file=$venv/.tdmpc2-requirements
stamp=$(cat "$root/requirements.txt"; echo "torch index=${TDMPC2_TORCH_INDEX_URL:-pypi}")
if [ "$(cat "$stamp_file" 2>/dev/null)" != "$stamp" ]; then
    say "installing Python requirements (torch is a few GB on the first run)"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    if [ -n "${TDMPC2_TORCH_INDEX_URL:-}" ]; then
        # A local build such as 2.11.0+cu126 satisfies the requirements' torch==2.11.0 pin.
        "$venv/bin/python" -m pip install --quiet "torch==2.11.0" --index-url "$TDMPC2_TORCH_INDEX_URL"
    fi
    "$venv/bin/python" -m pip install --quiet -r "$root/requirements.txt"
    printf '%s' "$stamp" > "$stamp_file"
else
    say "venv up to date: $venv"
fi

# A family's venv: the same Python as the project's venv (the binary embeds that one), its own
# pinned requirements, a stamp like the project's.
install_family() {
    local family=$1 var dir requirements stamp base
    var="TDMPC2_VENV_$(echo "$family" | tr '[:lower:]' '[:upper:]')"
    dir=${!var:-$venv-$family}
    requirements=$root/requirements-$family.txt
    if [ ! -x "$dir/bin/python" ]; then
        base=$("$venv/bin/python" -c 'import sys; print(sys._base_executable)')
        say "creating the $family venv $dir with $base"
        "$base" -m venv "$dir"
    fi
    stamp=$(cat "$requirements")
    if [ "$(cat "$dir/.tdmpc2-requirements" 2>/dev/null)" != "$stamp" ]; then
        say "installing the $family requirements into $dir"
        "$dir/bin/python" -m pip install --quiet --upgrade pip
        "$dir/bin/python" -m pip install --quiet -r "$requirements"
        printf '%s' "$stamp" > "$dir/.tdmpc2-requirements"
    else
        say "$family venv up to date: $dir"
    fi
}
for family in "${selected[@]}"; do
    install_family "$family"
done

# Rendering (pixel observations, `tdmpc2 doctor`) goes through EGL headless: libEGL and a Mesa
# or GPU driver, system packages this script cannot install. State runs do not need them.
# ldconfig lives in /sbin, which a user's PATH may lack.
ldconfig=$(PATH="$PATH:/sbin:/usr/sbin" command -v ldconfig || echo ldconfig)
if ! "$ldconfig" -p 2>/dev/null | grep -q 'libEGL\.so\.1'; then
    say "note: no libEGL.so.1 on this machine: MuJoCo cannot render (pixel observations); install libegl1 and libgl1-mesa-dri (apt), or your GPU driver's EGL; state runs are unaffected"
fi

if [ "${TDMPC2_SKIP_BUILD:-0}" != 1 ]; then
    # torch-sys asks `python` for torch's location: env.sh put the venv first on PATH.
    say "building (release; the first build compiles libtorch bindings, ~5 minutes)"
    cargo build --release --manifest-path "$root/Cargo.toml" --bins
    say "ready: $(cd "$root" && cargo metadata --format-version 1 --no-deps 2>/dev/null \
        | "$venv/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/tdmpc2"
fi
