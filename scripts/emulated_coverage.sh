#!/usr/bin/env bash
# Which lines of the CUDA-only headers the emulated device's tests run (docs/design.md,
# "The device emulated on the CPU"): builds tests/cuda's binaries for the emulated device
# with gcc's line coverage into build/coverage, runs them (not test_cuda_compressor's
# grids, which outrun their limit under coverage on two cores), and lists each header's
# lines run and those never run, over all the binaries. About 30 minutes on two cores.
#   bash scripts/emulated_coverage.sh [--report-only]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${COVERAGE_BUILD:-$root/build/coverage}
if [ "${1:-}" != --report-only ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g --coverage" \
    -DCMAKE_EXE_LINKER_FLAGS=--coverage -DGRADCOMP_BUILD_TESTS=ON -DGRADCOMP_BUILD_TOOLS=OFF \
    -DGRADCOMP_BUILD_EXAMPLES=OFF -DGRADCOMP_BUILD_EXPERIMENTS=OFF -DGRADCOMP_BUILD_BENCHMARKS=OFF \
    -DGRADCOMP_USE_CUDA=OFF -DGRADCOMP_RACES=OFF -DGRADCOMP_FUZZ=OFF >/dev/null
  targets=$(cd "$root/tests/cuda" && ls test_cuda_*.cu | sed 's/^/emulated_/; s/\.cu$//')
  find "$build" -name '*.gcda' -delete
  # shellcheck disable=SC2086
  cmake --build "$build" -j2 --target $targets
  ctest --test-dir "$build" -L emulated_cuda -E grid -j2 --timeout 3000 --output-on-failure
fi
python3 - "$build" <<'PY'
import collections, glob, json, os, subprocess, sys
build = sys.argv[1]
cuda_only = ("/backend/cuda.cuh", "/backend/stream_order.cuh", "/comm/nccl.cuh", "/detail/cuda/", "/device_messages.cuh")
runs = collections.defaultdict(dict)  # header -> line -> most runs in any binary
for gcda in glob.glob(f"{build}/tests/CMakeFiles/emulated_*.dir/**/*.gcda", recursive=True):
    out = subprocess.run(["gcov", "--json-format", "--stdout", "-o", os.path.dirname(gcda), gcda],
                         capture_output=True, text=True, check=True).stdout
    for doc in (line for line in out.splitlines() if line.startswith("{")):
        for f in json.loads(doc)["files"]:
            name = os.path.realpath(f["file"])
            if "/include/gradcomp/" in name and any(part in name for part in cuda_only):
                for line in f["lines"]:
                    n = line["line_number"]
                    runs[name][n] = max(runs[name].get(n, 0), line["count"])
run_total = all_total = 0
for name, lines in sorted(runs.items()):
    never = sorted(n for n, count in lines.items() if count == 0)
    run_total += len(lines) - len(never)
    all_total += len(lines)
    print(f"{name.split('/include/')[1]}: {len(lines) - len(never)} of {len(lines)} lines run; never: {never}")
print(f"all: {run_total} of {all_total} lines run")
PY
