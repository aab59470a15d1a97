# shellcheck shell=bash
# Sourced by the other scripts: the venv and the variables that tch, torch-sys and pyo3 need.
tdmpc2_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export TDMPC2_VENV=${TDMPC2_VENV:-$tdmpc2_root/.venv}
# Absolute: the scripts and cargo's build scripts run from other folders.
case $TDMPC2_VENV in /*) ;; *) TDMPC2_VENV=$PWD/$TDMPC2_VENV ;; esac
export PATH="$TDMPC2_VENV/bin:$PATH"
export PYO3_PYTHON="$TDMPC2_VENV/bin/python"
export LIBTORCH_USE_PYTORCH=1
