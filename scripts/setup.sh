#!/usr/bin/env bash
# Sets up everything tdmpc2 needs, idempotently: a Python venv with the pinned requirements
# (torch is the libtorch the Rust side links against), then the release build.
# A second run with nothing changed takes seconds.
#
# Environment:
#   TDMPC2_VENV            venv directory (default: .venv in the repository)
#   TDMPC2_PYTHON          interpreter for a new venv (default: python3.12, python3.11, else
#                          python3): Python 3.11 or 3.12 with a shared libpython and its headers
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

# One setup at a time per venv (a demo and a test run, or two CI jobs sharing a cache): two
# pips in one venv break it. The lock is released when this script exits.
# (A folder where no lock can be made, read-only, goes without.)
if command -v flock >/dev/null && { exec 9>"$venv.setup-lock"; } 2>/dev/null; then
    if ! flock -n 9; then
        say "another setup of $venv is running: waiting for it"
        flock 9
    fi
fi

# What the project needs of its Python: 3.11 or 3.12 (MyoSuite's MuJoCo 4.0 needs 3.11, and
# dm_control's labmaze has no wheels past 3.12), a shared libpython (the binary embeds it) and
# its headers (torch's bindings compile against Python.h). Prints why not, or nothing.
python_problem() {
    "$1" - <<'PY' 2>/dev/null || echo "it does not run"
import os, sys, sysconfig
if not (3, 11) <= sys.version_info[:2] <= (3, 12):
    print(f"it is Python {sys.version.split()[0]}, not 3.11 or 3.12")
elif not sysconfig.get_config_var("Py_ENABLE_SHARED"):
    print("it has no shared libpython (pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared)")
elif not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
    print(f"it lacks its headers (apt: python{sys.version_info[0]}.{sys.version_info[1]}-dev)")
PY
}

# The first interpreter that the project can use (a pyenv shim for a version that is not
# selected exists on PATH but fails).
find_python() {
    local pyenv_root=${PYENV_ROOT:-$HOME/.pyenv} candidate problem
    if [ -n "${TDMPC2_PYTHON:-}" ]; then
        problem=$(python_problem "$TDMPC2_PYTHON")
        [ -z "$problem" ] || { echo "TDMPC2_PYTHON=$TDMPC2_PYTHON: $problem" >&2; return 1; }
        command -v "$TDMPC2_PYTHON"
        return
    fi
    for candidate in "$pyenv_root"/versions/3.12.*/bin/python3.12 python3.12 \
        "$pyenv_root"/versions/3.11.*/bin/python3.11 python3.11 python3; do
        if command -v "$candidate" >/dev/null && [ -z "$(python_problem "$candidate")" ]; then
            command -v "$candidate"
            return
        fi
    done
    echo "no usable Python found (python3: $(python_problem python3)); install Python 3.12 with its headers (apt: python3.12-dev python3.12-venv), or set TDMPC2_PYTHON" >&2
    return 1
}

# pip over a flaky network: retries, and a timeout longer than its 15 s; never a --user install.
export PIP_RETRIES=${PIP_RETRIES:-5} PIP_DEFAULT_TIMEOUT=${PIP_DEFAULT_TIMEOUT:-60} PIP_USER=0

# A venv without pip (its creation failed half-way, or made by a tool that leaves pip out) gets
# pip from ensurepip; one of ours that cannot (no python3-venv package) is made again, another
# is never removed.
if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    if "$venv/bin/python" -m ensurepip --upgrade >/dev/null 2>&1; then
        say "the venv $venv had no pip: installed it"
    elif [ -f "$venv/pyvenv.cfg" ] && { [ "$venv" = "$root/.venv" ] || [ -f "$venv/.tdmpc2-requirements" ]; }; then
        say "the venv $venv has no pip (its creation failed?): making it again"
        rm -rf "$venv"
    else
        echo "setup.sh: the venv $venv has no pip and ensurepip cannot add it; install pip in it, or point TDMPC2_VENV at another folder" >&2
        exit 1
    fi
fi
stamp_file=$venv/.tdmpc2-requirements
if [ ! -x "$venv/bin/python" ]; then
    # One of ours whose Python is gone: venv keeps the dead links of an existing folder.
    if [ -f "$venv/pyvenv.cfg" ] && { [ "$venv" = "$root/.venv" ] || [ -f "$stamp_file" ]; }; then
        rm -rf "$venv"
    fi
    python=$(find_python)
    say "creating venv $venv with $python ($("$python" --version 2>&1))"
    # A venv made again where one was (its Python gone) keeps nothing of the old one's.
    rm -f "$stamp_file"
    if ! "$python" -m venv "$venv"; then
        rm -rf "$venv"
        echo "setup.sh: $python cannot make a venv; install its venv module (apt: python3-venv, or python3.12-venv)" >&2
        exit 1
    fi
fi
problem=$(python_problem "$venv/bin/python")
if [ -n "$problem" ]; then
    echo "setup.sh: the venv $venv cannot serve: $problem; remove it to make it again with a usable Python, or point TDMPC2_VENV elsewhere" >&2
    exit 1
fi

# The stamp records what the venv was built from; pip runs only when it changes.
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
    # Its Python is the project venv's: one of ours made before that changed is made again.
    local version='import sys; print(sys.version)'
    if [ -x "$dir/bin/python" ] && [ "$("$dir/bin/python" -c "$version")" != "$("$venv/bin/python" -c "$version")" ]; then
        if [ "$dir" != "$venv-$family" ] && [ ! -f "$dir/.tdmpc2-requirements" ]; then
            echo "setup.sh: the $family venv $dir runs another Python than $venv (the binary embeds that one); point $var at another folder" >&2
            exit 1
        fi
        say "the $family venv $dir has another Python than $venv: making it again"
        rm -rf "$dir"
    fi
    if [ ! -x "$dir/bin/python" ]; then
        base=$("$venv/bin/python" -c 'import sys; print(sys._base_executable)')
        say "creating the $family venv $dir with $base"
        "$base" -m venv "$dir" || { rm -rf "$dir"; echo "setup.sh: $base cannot make the $family venv" >&2; exit 1; }
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
    # From the repository: a rust-toolchain.toml or .cargo/config.toml above the caller's
    # folder must not pick the toolchain or the target folder. The venv's lock is not held
    # through the build (a compiler cache's server would inherit and keep it).
    cd "$root"
    exec 9>&-
    cargo build --release --manifest-path "$root/Cargo.toml" --bins
    say "ready: $(cd "$root" && cargo metadata --format-version 1 --no-deps 2>/dev/null \
        | "$venv/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/tdmpc2"
fi
