#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py), for a lent GPU machine: bf16 Hydra vs single vs
# deep ensemble latency on CUDA, and ONNX Runtime's CUDA execution provider against its CPU
# one. About 3-5 minutes on one H100; stopped at 9 minutes whatever happens.
#
#   benchmarks/gpu_check.sh [--quick]
#
# It needs a CUDA build of torch and onnxruntime-gpu in .venv (or PYTHON=...); it installs
# nothing (a lent machine may have no network) and says so in one line when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
nvidia-smi -L || { echo "gpu_check: no NVIDIA GPU visible (nvidia-smi failed)"; exit 2; }
export PYTHONPATH="benchmarks${PYTHONPATH:+:$PYTHONPATH}"
timeout 540 "$PYTHON" benchmarks/gpu_check.py "$@"
