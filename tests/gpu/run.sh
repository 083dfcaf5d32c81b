#!/bin/sh
# The real-GPU proof (docs/real-gpu.md): nvshim-runtime -> runc with this machine's own NVIDIA
# driver (driver root /) and GPU. One command, as root, from anywhere in the checkout:
#
#   tests/gpu/run.sh              run tests/gpu (extra arguments go to pytest)
#   tests/gpu/run.sh --install    first ./install.sh --dev (venv, runc, busybox, gcc ...)
#
# NVSHIM_PYTHON picks the interpreter (default: the installed venv's).
set -eu
cd "$(dirname "$0")/../.."

die() { printf 'run.sh: %s\n' "$*" >&2; exit 1; }

if [ "${1:-}" = "--install" ]; then
    shift
    ./install.sh --dev
fi

PY=${NVSHIM_PYTHON:-/opt/nvshim/venv/bin/python}
[ "$(id -u)" = 0 ] || die "run as root (containers, cgroups, mounts)"
[ -e /dev/nvidia0 ] || die "no /dev/nvidia0: this machine has no NVIDIA GPU with its driver loaded"
[ -r /proc/driver/nvidia/version ] || die "no /proc/driver/nvidia/version: the nvidia kernel module is not loaded"
command -v nvidia-smi >/dev/null || die "nvidia-smi is not on PATH: install the NVIDIA driver's utilities"
[ -x "$PY" ] || die "$PY not found: run tests/gpu/run.sh --install (or ./install.sh --dev)"
for tool in runc busybox gcc nvshim-runtime; do
    command -v "$tool" >/dev/null || die "$tool is not installed: run tests/gpu/run.sh --install"
done

printf 'run.sh: %s\n' "$(head -n1 /proc/driver/nvidia/version)" >&2
nvidia-smi -L >&2
NVSHIM_REAL_GPU=1 exec "$PY" -m pytest -v -p no:cacheprovider -rs tests/gpu "$@"
