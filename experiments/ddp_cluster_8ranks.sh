#!/usr/bin/env bash
# Reproduces docs/results.md "Step time at 8 ranks": the MLP of experiments/ddp_cluster.py on 8
# DDP ranks of the emulated cluster (experiments/cluster.sh) at 1 Gbit/s, topk_ef over the
# sparse all-gather against ok_topk (Ok-Topk's global top-k), dense all-reduce and no communication; a
# short run each (--steps, default 40). Needs root (network namespaces); run it alone.
# Raw JSON and logs in build/cluster_scaling/, the report printed. About 20 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-40}
out=build/cluster_scaling
rm -rf "$out" && mkdir -p "$out"
bash experiments/cluster.sh --ranks 8 --rate 1gbit --check 2>&1 | tee "$out/1gbit-check.txt"
for hook in none topk_ef ok_topk dense; do
  echo "== 1gbit $hook"
  bash experiments/cluster.sh --ranks 8 --rate 1gbit --timeout 1200 -- \
    build/venv/bin/python3 -m experiments.ddp_cluster --hook "$hook" --steps "$steps" --eval-every "$steps" \
    --test-images 500 --probe-steps 6 --out "$out/1gbit-$hook.json" > "$out/1gbit-$hook.log" 2>&1 ||
    echo "1gbit $hook: status $?" | tee -a "$out/failures.txt"
done
build/venv/bin/python3 -m experiments.cluster_report "$out" --only-run | tee "$out/report.md"
