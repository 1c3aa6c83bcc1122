#!/usr/bin/env bash
# Reproduces the PyTorch table of docs/results.md: a CNN on Fashion-MNIST with DDP on 4
# gloo ranks of this machine, once per hook (dense, fp16, PowerSGD rank 1 and 4,
# gradcomp's topk_ef, dgc and scalecom at density 0.001). About 20 minutes on 2 cores.
# Extra arguments go to the example (e.g. --epochs 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh results
/usr/bin/python3 -m venv --system-site-packages build/venv
build/venv/bin/python -m pip install --quiet --no-build-isolation --no-deps --no-index .
build/venv/bin/python -m experiments.ddp_hooks --epochs 5 --out build/torch_results.json "$@"
