#!/usr/bin/env bash
# Install nope_lightning (editable, with the test tools) into the active Python environment:
#   python3 -m venv .venv && . .venv/bin/activate && ./install.sh
#
# torch goes first, because `pip install -e .` alone takes PyPI's default torch, a CUDA build with over
# 3 GB of nvidia-* packages, even on a machine without a GPU. So: with an NVIDIA GPU (nvidia-smi lists
# one) PyPI's CUDA build; without, the CPU build (a local wheel from pip's configured find-links if there
# is one, else PyTorch's CPU index). `./install.sh cpu` or `./install.sh cuda` overrides the detection.
# A torch already installed in the supported range is kept (uninstall it first to switch builds).
# Then the package itself.
set -euo pipefail
cd "$(dirname "$0")"

TORCH="torch>=2.5,<2.15"  # the range pyproject.toml allows
CPU_INDEX="https://download.pytorch.org/whl/cpu"
pip() { python -m pip "$@" >&2; }  # stdout stays free for the command that follows (its JSON)

build="${1:-}"
if [[ -z "$build" ]]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then build=cuda; else build=cpu; fi
fi
case "$build" in cpu | cuda) ;; *) echo "usage: ./install.sh [cpu|cuda]" >&2; exit 2 ;; esac

if [[ "$build" == cuda ]]; then
    echo "install.sh: installing the CUDA build of torch (PyPI's default)" >&2
    pip install "$TORCH"
else
    echo "install.sh: installing the CPU build of torch" >&2
    # A local wheel alone (no index can offer a CUDA build); its dependencies come with the package below.
    pip install --no-index --no-deps "$TORCH" 2>/dev/null || pip install "$TORCH" --index-url "$CPU_INDEX"
fi
pip install -e ".[dev]"
python -c 'import torch; print("install.sh: done: torch %s, CUDA %s" % (torch.__version__, torch.version.cuda or "none"))' >&2
