#!/usr/bin/env bash
# Reproduces "Time, not bytes" in docs/results.md: the MLP of experiments/ddp_cluster.py on 4
# DDP ranks of the emulated cluster (experiments/cluster.sh, one network namespace per rank),
# once per hook and link rate, then the tables and the plot (experiments/cluster_report.py).
# torch's PowerSGD hook (ranks 1 and 4) runs three ways: in the same 4 buckets as every
# other hook under Debian's torch 1.13 and under torch 2.x from PyPI (scripts/torch2_env.sh;
# both abort inside gloo, docs/results.md says why), and in one bucket under torch 1.13
# (how it runs on gloo). Every other hook under torch 1.13 with gradcomp. About 45 minutes
# per rate on this machine (2 cores). Environment:
#   RATES   link rates, as tc writes them (default "1gbit 10gbit")
#   HOOKS   hooks (default: none dense fp16 powersgd1 powersgd4 topk_ef dgc scalecom)
#   STEPS   training steps per run (default 200)
#   TORCH2  0: skip the torch 2.x runs (and its 5 GB download)
set -euo pipefail
cd "$(dirname "$0")/.."
rates=${RATES:-"1gbit 10gbit"}
hooks=${HOOKS:-"none dense fp16 powersgd1 powersgd4 topk_ef dgc scalecom"}
steps=${STEPS:-200}
bash scripts/setup.sh results
/usr/bin/python3 -m venv --system-site-packages build/venv
build/venv/bin/python -m pip install --quiet --no-build-isolation --no-deps --no-index .
torch1=build/venv/bin/python
torch2=
[[ ${TORCH2:-1} == 0 || $hooks != *powersgd* ]] || torch2=$(bash scripts/torch2_env.sh)
out=build/cluster_results
rm -rf "$out"  # one run: no result of an earlier one mixes in
mkdir -p "$out"
: > "$out/failures.txt"
# Why a run failed, in one line: gloo's failed check, else a collective that timed out
# (a hang, ended by the benchmark's gloo timeout), else the first exception; no paths.
failure() {
  local trim='s/enforce fail at [^]]*\] //; s/\. Received data size.*//; s/(RuntimeError: )?Got the following error when running the callback: //g; s/\[[^]]*\.cc:[0-9]+\] //; s/\. This is typically.*//'
  { grep -m1 -o -E "enforce fail.*" "$1" || grep -m1 -o -E "Timed out waiting [0-9]+ms for [a-z]+ operation" "$1" ||
    grep -m1 -o -E "[A-Za-z]*Error: .*" "$1" || echo "see $1"; } | sed -E "$trim"
}
for rate in $rates; do
  # At 10 Gbit/s the transfer itself needs a core of the two: a busy moment can cost the
  # check its 10%, so up to 3 tries (each one's figure is kept).
  for try in 1 2 3; do
    ! bash experiments/cluster.sh --ranks 4 --rate "$rate" --check 2>&1 | tee -a "$out/$rate-check.txt" || break
    ((try < 3)) || { echo "cluster_results: the $rate link did not hold its rate in 3 tries" >&2; exit 1; }
  done
  for hook in $hooks; do
    runs=("$hook:$torch1")  # name:python[:options]
    if [[ $hook == powersgd* ]]; then
      [[ -z $torch2 ]] || runs+=("$hook-torch2:$torch2")
      runs+=("$hook-onebucket:$torch1:--one-bucket")
    fi
    for run in "${runs[@]}"; do
      IFS=: read -r name python options <<< "$run"
      echo "== $rate $name"
      status=0
      # shellcheck disable=SC2086  # options: words
      bash experiments/cluster.sh --ranks 4 --rate "$rate" --timeout 900 -- \
        "$python" -m experiments.ddp_cluster --hook "$hook" $options --steps "$steps" --out "$out/$rate-$name.json" \
        > "$out/$rate-$name.log" 2>&1 || status=$?
      if ((status != 0)); then  # the reason, as gloo or Python gave it, for the report
        why=$(failure "$out/$rate-$name.log")
        echo "$rate $name: status $status: $why" | tee -a "$out/failures.txt"
      fi
    done
  done
done
build/venv/bin/python3 -m experiments.cluster_report "$out" --plot docs/cluster_accuracy.png | tee "$out/report.md"
