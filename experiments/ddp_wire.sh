#!/usr/bin/env bash
# Reproduces docs/results.md "Bytes on the wire": what a rank's link carries per DDP step
# with gradcomp's hook (topk_ef, density 0.001, one bucket) over the sparse all-gather and
# over Ok-Topk's global top-k (aggregation="sparse_allreduce"), at W = 2, 4, 8 and 16 ranks
# of the emulated cluster (experiments/cluster.sh, 10 Gbit/s links), next to what the hook
# reports. Needs root (network namespaces); run it alone. Environment:
#   RANKS    rank counts (default "2 4 8 16")
#   PARAMS   bucket sizes (default "930000 10000000": k about 930 and 10,000)
#   PYTHON   the Python with torch and gradcomp (default build/venv/bin/python)
# Raw JSON in build/ddp_wire/, the table printed. About 15 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-build/venv/bin/python}
out=build/ddp_wire
rm -rf "$out" && mkdir -p "$out"
for params in ${PARAMS:-930000 10000000}; do
  for ranks in ${RANKS:-2 4 8 16}; do
    for aggregation in allgather sparse_allreduce; do
      OMP_NUM_THREADS=1 bash experiments/cluster.sh --ranks "$ranks" --rate 10gbit --timeout 900 -- \
        "$python" -m experiments.wire_traffic --params "$params" --aggregation "$aggregation" \
        --out "$out/$params-$ranks-$aggregation.json" 2>&1 | grep -v "^cluster:" | tee -a "$out/log.txt"
    done
  done
done
"$python" - "$out" <<'PY'
import glob, json, sys
rows = [json.load(open(f)) for f in glob.glob(sys.argv[1] + "/*.json")]
rows.sort(key=lambda r: (r["params"], r["aggregation"], r["ranks"]))
print("| n | aggregation | W | received on the link | sent on the link | the hook's received | the hook's sent | collectives |")
print("|---:|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    mean = lambda key: sum(p[key] for p in r["per_rank"]) / r["ranks"]
    print(f"| {r['params']:,} | {r['aggregation']} | {r['ranks']} | {mean('wire_received'):,.0f} | "
          f"{mean('wire_sent'):,.0f} | {mean('hook_received'):,.0f} | {mean('hook_sent'):,.0f} | "
          f"{mean('collectives'):.1f} |")
PY
