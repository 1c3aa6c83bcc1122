#!/usr/bin/env bash
# Reproduces "What it buys at scale" in docs/results.md: on the emulated cluster
# (experiments/cluster.sh), for each rate and rank count, the measurements the step-time
# model takes (experiments/plan_calibrate.py), then short runs of the MLP of
# experiments/ddp_cluster.py under each hook whose step time it must predict, then the
# report (experiments/plan_report.py): the validation and the GPU predictions. About 40
# minutes on this machine (2 cores). Environment:
#   RUNS   rate-wRANKS pairs (default "1gbit-w4 10gbit-w4 1gbit-w8 10gbit-w8")
#   STEPS  training steps per run, the first 10 dense (default 40)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-"1gbit-w4 10gbit-w4 1gbit-w8 10gbit-w8"}
steps=${STEPS:-40}
bash scripts/setup.sh results
/usr/bin/python3 -m venv --system-site-packages build/venv
build/venv/bin/python -m pip install --quiet --no-build-isolation --no-deps --no-index .
python=build/venv/bin/python
out=build/plan
rm -rf "$out"
for run in $runs; do
  rate=${run%-w*}
  ranks=${run#*-w}
  dir=$out/$run
  mkdir -p "$dir"
  echo "== $run: calibration"
  bash experiments/cluster.sh --ranks "$ranks" --rate "$rate" --timeout 900 -- \
    "$python" -m experiments.plan_calibrate --out "$dir/calibration.json" > "$dir/calibration.log" 2>&1
  hooks="none dense fp16 powersgd1 powersgd4 topk_ef dgc scalecom"
  ((ranks <= 4)) || hooks="none dense topk_ef ok_topk"  # 8 ranks share 2 cores: the hooks of results.md's 8-rank run
  for hook in $hooks; do
    name=$hook options=()
    if [[ $hook == powersgd* ]]; then  # how torch's PowerSGD runs on gloo (docs/results.md, "Time, not bytes")
      name=$hook-onebucket options=(--one-bucket)
    fi
    echo "== $run: $name"
    bash experiments/cluster.sh --ranks "$ranks" --rate "$rate" --timeout 900 -- \
      "$python" -m experiments.ddp_cluster --hook "$hook" "${options[@]}" --steps "$steps" --eval-every 100000 \
      --test-images 100 --out "$dir/$name.json" > "$dir/$name.log" 2>&1
  done
done
# shellcheck disable=SC2046  # the run directories: words
PYTHONPATH=python "$python" -m experiments.plan_report $(for run in $runs; do echo "$out/$run"; done) | tee "$out/report.md"
