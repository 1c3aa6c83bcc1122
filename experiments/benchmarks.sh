#!/usr/bin/env bash
# Sets everything up (with libtorch for the torch.topk baseline), builds the benchmark
# suites, runs them and writes build/bench/report.md and build/bench/selection.png.
# Extra arguments go to bench_select (e.g. --benchmark_filter=N:25000000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh bench
cmake --preset bench
cmake --build --preset bench -j"$(nproc)"
build/bench/bench/bench_select --benchmark_out=build/bench/select.json --benchmark_out_format=json "$@"
build/bench/bench/bench_pipeline --benchmark_out=build/bench/pipeline.json --benchmark_out_format=json
if [[ -x build/bench/bench/bench_kokkos ]]; then  # Kokkos<Serial> against the host backend on one thread
  OMP_NUM_THREADS=1 build/bench/bench/bench_kokkos --benchmark_out=build/bench/kokkos.json --benchmark_out_format=json
fi
/usr/bin/python3 bench/report.py build/bench/selection.png build/bench/select.json build/bench/pipeline.json \
  $(ls build/bench/kokkos.json 2>/dev/null) > build/bench/report.md
echo "wrote build/bench/report.md and build/bench/selection.png"
