#!/usr/bin/env bash
# Reproduces "Time, not bytes" in docs/results.md: the MLP of bench/ddp_cluster.py on 4
# DDP ranks of the emulated cluster (scripts/cluster.sh, one network namespace per rank),
# once per hook and link rate, then the tables and the plot (bench/cluster_report.py).
# About 25 minutes per rate on this machine (2 cores). Environment:
#   RATES  link rates, as tc writes them (default "1gbit 10gbit")
#   HOOKS  hooks (default: none dense fp16 powersgd1 powersgd4 topk_ef dgc scalecom)
#   STEPS  training steps per run (default 200)
set -euo pipefail
cd "$(dirname "$0")/.."
rates=${RATES:-"1gbit 10gbit"}
hooks=${HOOKS:-"none dense fp16 powersgd1 powersgd4 topk_ef dgc scalecom"}
steps=${STEPS:-200}
bash scripts/setup.sh results
/usr/bin/python3 -m venv --system-site-packages build/venv
build/venv/bin/python -m pip install --quiet --no-build-isolation --no-deps --no-index .
out=build/cluster_results
mkdir -p "$out"
: > "$out/failures.txt"
for rate in $rates; do
  bash scripts/cluster.sh --ranks 4 --rate "$rate" --check | tee "$out/$rate-check.txt"
  for hook in $hooks; do
    echo "== $rate $hook"
    status=0
    bash scripts/cluster.sh --ranks 4 --rate "$rate" --timeout 900 -- \
      build/venv/bin/python bench/ddp_cluster.py --hook "$hook" --steps "$steps" --out "$out/$rate-$hook.json" \
      > "$out/$rate-$hook.log" 2>&1 || status=$?
    ((status == 0)) || { echo "$rate $hook: status $status (see $out/$rate-$hook.log)" | tee -a "$out/failures.txt"; }
  done
done
build/venv/bin/python bench/cluster_report.py "$out" --plot docs/cluster_accuracy.png | tee "$out/report.md"
