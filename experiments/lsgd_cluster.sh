#!/usr/bin/env bash
# Reproduces docs/results.md "Leader SGD against averaging and elastic averaging": the
# Fashion-MNIST CNN on 4 and 8 ranks of the emulated cluster (experiments/cluster.sh) at
# 1 Gbit/s, trained by DDP with dense all-reduce, DDP with gradcomp's dgc hook, local SGD,
# EASGD, Leader SGD and Leader SGD with compressed leaders (experiments/lsgd_cluster.py),
# the same initial parameters and data order for each, and Leader SGD again with a pull of
# 0.5. Needs root (network namespaces);
# run it alone. Raw JSON and logs in build/lsgd/, the report printed and the plot written
# to build/lsgd/lsgd_accuracy.png. About 25 minutes an epoch.
#
#   bash experiments/lsgd_cluster.sh [EPOCHS] [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${1:-1}
python=${2:-build/venv/bin/python3}
out=build/lsgd
rm -rf "$out" && mkdir -p "$out"
bash experiments/cluster.sh --ranks 8 --rate 1gbit --check 2>&1 | tee "$out/1gbit-check.txt"
for world in 4 8; do
  for method in dense dgc local_sgd easgd lsgd lsgd_compressed; do
    echo "== $world ranks: $method"
    bash experiments/cluster.sh --ranks "$world" --rate 1gbit --timeout 1500 -- \
      "$python" -m experiments.lsgd_cluster --method "$method" --epochs "$epochs" \
      --out "$out/w$world-$method.json" > "$out/w$world-$method.log" 2>&1 ||
      echo "$world ranks $method: status $?" | tee -a "$out/failures.txt"
    tail -1 "$out/w$world-$method.log"
  done
  # Leader SGD again with a pull of 0.5 (the authors' 0.1 above): how much the weak pull costs.
  for method in lsgd lsgd_compressed; do
    label=${method}_pull0.5
    echo "== $world ranks: $label"
    bash experiments/cluster.sh --ranks "$world" --rate 1gbit --timeout 1500 -- \
      "$python" -m experiments.lsgd_cluster --method "$method" --pull 0.5 --label "$label" --epochs "$epochs" \
      --out "$out/w$world-$label.json" > "$out/w$world-$label.log" 2>&1 ||
      echo "$world ranks $label: status $?" | tee -a "$out/failures.txt"
    tail -1 "$out/w$world-$label.log"
  done
done
# The report's plot needs matplotlib (Debian's python3-matplotlib: scripts/setup.sh results).
"$python" -m experiments.lsgd_report "$out" --plot "$out/lsgd_accuracy.png" | tee "$out/report.md"
