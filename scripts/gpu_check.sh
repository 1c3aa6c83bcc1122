#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, in one bounded run (docs/benchmarks.md records
# what it found, with the device's name and the date):
#   1. the CUDA test binaries and bench_cuda, built beforehand with CMake for every
#      architecture and optimised (`cmake --preset release -DGRADCOMP_CUDA_COMPILE_ONLY=OFF`,
#      then `cmake --build build/release`: doctest and Google Benchmark need not be on the GPU
#      machine), run from BIN;
#   2. the torch extension built with its CUDA backend against the machine's torch, then
#      pytest's CUDA tests (-m cuda), experiments/torch_gpu.py and experiments/gpu_step_cost.py.
# The extension compiles in the background while the binaries run.
#
#   bash scripts/gpu_check.sh BIN OUT
# BIN holds test_cuda_*, example_cuda_thrust, bench_cuda and any shared library they need
# that the machine lacks (Google Benchmark's); NCCL is taken from torch's nvidia-nccl.
# Logs and JSON go to OUT (seven files). TESTS names the binaries to run (all by default);
# BENCH=0 leaves out bench_cuda. Exits non-zero when any step fails.
set -u
bin=$(cd "$1" && pwd)
out=$(mkdir -p "$2" && cd "$2" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
nccl=$("$python" -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH="$bin${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
failed=()
step() {  # name log seconds command...: runs it bounded, its output added to OUT/log
  local name=$1 log=$2 limit=$3
  shift 3
  local start=$SECONDS
  echo "=== $name" >>"$out/$log"
  timeout --kill-after=5 "$limit" "$@" >>"$out/$log" 2>&1
  local rc=$?
  echo "$name: rc $rc in $((SECONDS - start)) s"
  [ $rc -eq 0 ] || failed+=("$name")
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1

rcfile=$(mktemp)
(cd "$root" && MAX_JOBS=${MAX_JOBS:-14} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} \
  timeout 330 "$python" setup.py build_ext --inplace >"$out/extension_build.log" 2>&1
  echo $? >"$rcfile") &
build=$!

# Each test case's time as it ends (line-buffered, so a test stopped at its limit shows
# how far it got).
for t in ${TESTS:-test_cuda_exact_topk test_cuda_compressor test_cuda_conformance test_cuda_messages test_cuda_graph \
  test_cuda_nccl example_cuda_thrust}; do
  case $t in
    test_*) step "$t" cuda_tests.log 300 stdbuf -oL "$bin/$t" --duration=true ;;
    *) step "$t" cuda_tests.log 60 "$bin/$t" ;;
  esac
done
if [ "${BENCH:-1}" = 1 ]; then
  step bench_cuda bench.log 150 "$bin/bench_cuda" --benchmark_min_time=0.1 --benchmark_out="$out/bench_cuda.json" \
    --benchmark_out_format=json
fi

wait $build
built=$(cat "$rcfile")
echo "extension_build: rc $built"
if [ "$built" = 0 ]; then
  cd "$root/python"  # the in-place build put gradcomp/_C there
  export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
  # -s: a C++ abort's message reaches the log (pytest's capture would swallow it)
  # With pytest-xdist a test that aborts loses its worker, not the rest of the run.
  workers=()
  "$python" -c "import xdist" 2>/dev/null && workers=(-n 4)
  # A C++ abort or fault prints its native stack too (scripts/crash_backtrace.c).
  preload=$(mktemp -d)/crash_backtrace.so
  cc -shared -fPIC -o "$preload" "$root/scripts/crash_backtrace.c" || preload=
  step pytest_cuda pytest_cuda.log 150 env ${preload:+LD_PRELOAD=$preload} "$python" -m pytest -q -s \
    -p no:cacheprovider -m cuda tests -o addopts="" --timeout=140 "${workers[@]}"
  step torch_gpu bench.log 90 "$python" ../experiments/torch_gpu.py --out "$out/torch_gpu.json"
  # What each hook adds to a bf16 training step of a ResNet-50 and a GPT-2 small (#40, item 4)
  step step_cost bench.log 200 env PYTHONPATH="$root:$PYTHONPATH" PYTHONUNBUFFERED=1 "$python" \
    -m experiments.gpu_step_cost --out "$out/step_cost.json"
  [ -s "$out/pytest_cuda.log" ] && tail -5 "$out/pytest_cuda.log"
else
  failed+=(extension_build)
  tail -30 "$out/extension_build.log"
fi
grep -h "^=== \|test cases" "$out/cuda_tests.log"
[ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
echo "all GPU checks passed"
