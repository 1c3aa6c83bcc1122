#!/usr/bin/env bash
# Reproduces docs/results.md "FSDP2: a transformer on a slow link": the byte-level
# transformer of experiments/fsdp_lm.py under fully_shard on 4 ranks of the emulated
# cluster (experiments/cluster.sh), once per reduce-scatter and link rate, under torch 2.x
# from PyPI (scripts/torch2_env.sh builds gradcomp there), then the table and the plot
# (experiments/fsdp_lm_report.py). Environment:
#   RATES    link rates, as tc writes them (default "1gbit 10gbit")
#   METHODS  reduce-scatters (default: dense int4 topk_ef topk_ef_m8)
#   STEPS    dense's training steps (default 240); the others run 1.5 times as many, so that
#            a method slower to converge can still reach dense's final loss
#   ARGS     more arguments for experiments/fsdp_lm.py
set -euo pipefail
cd "$(dirname "$0")/.."
rates=${RATES:-"1gbit 10gbit"}
methods=${METHODS:-"dense int4 topk_ef topk_ef_m8"}
steps=${STEPS:-240}
bash scripts/setup.sh results
python="$(bash scripts/torch2_env.sh --gradcomp)"
out=build/fsdp_lm_results
mkdir -p "$out"
for rate in $rates; do
  rm -f "$out/$rate-check.txt"
  for try in 1 2 3; do  # a busy moment can cost the rate check its 10%
    ! bash experiments/cluster.sh --ranks 4 --rate "$rate" --check 2>&1 | tee -a "$out/$rate-check.txt" || break
    ((try < 3)) || { echo "fsdp_lm_cluster: the $rate link did not hold its rate in 3 tries" >&2; exit 1; }
  done
  for method in $methods; do
    run_steps=$steps
    [[ $method == dense ]] || run_steps=$((steps * 3 / 2))
    echo "== $rate $method ($run_steps steps)"
    rm -f "$out/$rate-$method".*  # no result of an earlier run mixes in
    # shellcheck disable=SC2086  # ARGS: words
    bash experiments/cluster.sh --ranks 4 --rate "$rate" --timeout 1800 -- \
      "$python" -m experiments.fsdp_lm --method "$method" --steps "$run_steps" ${ARGS:-} --out "$out/$rate-$method.json" \
      > "$out/$rate-$method.log" 2>&1 || { tail -n 20 "$out/$rate-$method.log" >&2; exit 1; }
    tail -n 1 "$out/$rate-$method.log"
  done
done
/usr/bin/python3 -m experiments.fsdp_lm_report "$out" --plot "$out/fsdp_lm.png" | tee "$out/report.md"
