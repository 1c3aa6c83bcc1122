#!/usr/bin/env bash
# Reproduces docs/results.md "FSDP2": fully_shard training on Fashion-MNIST with 4 gloo
# ranks, a dense reduce-scatter against gradcomp.torch.fsdp's (topk_ef), under torch 2.x
# (scripts/torch2_env.sh builds gradcomp there). Prints the table; about 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test >/dev/null
python="$(bash scripts/torch2_env.sh --gradcomp)"
OMP_NUM_THREADS=1 timeout 3600 "$python" -m experiments.fsdp_fashion_mnist --out build/fsdp_results.json "$@"
