#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, in one bounded run (docs/benchmarks.md records
# what it found, with the device's name and the date):
#   1. the CUDA test binaries and bench_cuda, built beforehand with CMake for every
#      architecture and optimised (`cmake --preset release -DGRADCOMP_CUDA_COMPILE_ONLY=OFF`,
#      then `cmake --build build/release`: doctest and Google Benchmark need not be on the GPU
#      machine), run from BIN;
#   2. the torch extension built with its CUDA backend against the machine's torch, then
#      pytest's CUDA tests (-m cuda), experiments/torch_gpu.py, experiments/gpu_step_cost.py and
#      experiments/fsdp_gpu_cost.py.
# The extension compiles in the background while the binaries run.
#
#   bash scripts/gpu_check.sh BIN OUT
# BIN holds test_cuda_*, example_cuda_thrust, bench_cuda and any shared library they need
# that the machine lacks (Google Benchmark's); NCCL is taken from torch's nvidia-nccl.
# Logs and JSON go to OUT (eight files at most, what the device machine brings back).
# TESTS names the binaries to run (all by default); BENCH=0 leaves out bench_cuda,
# PROFILE=0 its per-kernel profile (ncu, summed by bench/kernel_profile.py), STEP_COST=0
# experiments/gpu_step_cost.py, FSDP_COST=0 experiments/fsdp_gpu_cost.py. The benchmarks
# run first, alone on the GPU; the tests then run side by side. Exits non-zero when any
# step fails.
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

# The benchmarks first, alone on the GPU (the extension compiles on the CPU meanwhile).
if [ "${BENCH:-1}" = 1 ]; then
  step bench_cuda bench.log 200 "$bin/bench_cuda" --benchmark_min_time=0.1 --benchmark_out="$out/bench_cuda.json" \
    --benchmark_out_format=json
fi
# Where a step's time goes: every kernel of one step, timed alone by Nsight Compute, per
# benchmark at a 25 MB bucket and at 10^8 (density 0.001), and exact_topk and topk_ef at
# 10^8 and density 0.01 too (where their time grows with k). The kernels' sum against the
# step's event time above is the share spent between kernels (launches, host reads).
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
if [ "${PROFILE:-1}" = 1 ] && [ -n "$ncu" ]; then
  profile='for b in exact_topk threshold sampled_threshold chunk_local topk_ef_step dgc_step; do
      for at in 6500000/1000 100000000/1000 100000000/100; do
        case $b/$at in exact_topk/*/100 | topk_ef_step/*/100 | */1000) ;; *) continue ;; esac
        echo "### $b/$at"
        "$0" --clock-control none --metrics gpu__time_duration.sum --csv "$1/bench_cuda" \
          --benchmark_filter="^$b/$at/" --benchmark_min_time=0.000001 || exit 1
      done
    done'
  step ncu_profile ncu_profile.csv 180 bash -c "$profile" "$ncu" "$bin"
fi

# The correctness tests, side by side (the GPU has room): test_cuda_compressor, the
# longest, in shards of its test cases (doctest's --first/--last). Each test case's time
# as it ends (line-buffered, so a test stopped at its limit shows how far it got).
shards=()
for t in ${TESTS:-test_cuda_exact_topk test_cuda_compressor test_cuda_conformance test_cuda_messages test_cuda_graph \
  test_cuda_nccl example_cuda_thrust}; do
  case $t in
    test_cuda_compressor) for r in 1:1 2:2 3:3 4:4 5:5 6:6 7:8 9:99; do
      shards+=("$t ${r%:*} ${r#*:}"); done ;;
    *) shards+=("$t 0 0") ;;
  esac
done
shard_name() { if [ "$2" = 0 ]; then echo "$1"; else echo "$1.$2-$3"; fi; }
tests_start=$SECONDS
for shard in "${shards[@]}"; do
  read -r t first last <<<"$shard"
  name=$(shard_name "$t" "$first" "$last")
  (
    case $t in
      test_*) range=()
        [ "$first" = 0 ] || range=(--first="$first" --last="$last")
        timeout --kill-after=5 300 stdbuf -oL "$bin/$t" --duration=true "${range[@]}" ;;
      *) timeout --kill-after=5 60 "$bin/$t" ;;
    esac >"$out/shard.$name.log" 2>&1
    echo $? >"$out/shard.$name.rc"
  ) &
done
# Waits for the C++ test shards, then adds their logs in order to cuda_tests.log, one rc each.
collect_shards() {
  wait
  local shard t first last name rc
  for shard in "${shards[@]}"; do
    read -r t first last <<<"$shard"
    name=$(shard_name "$t" "$first" "$last")
    { echo "=== $name"; cat "$out/shard.$name.log"; } >>"$out/cuda_tests.log"
    rc=$(cat "$out/shard.$name.rc" 2>/dev/null || echo missing)
    echo "$name: rc $rc (the tests took $((SECONDS - tests_start)) s side by side)"
    [ "$rc" = 0 ] || failed+=("$name")
    rm -f "$out/shard.$name.log" "$out/shard.$name.rc"
  done
}
wait $build
built=$(cat "$rcfile")
echo "extension_build: rc $built"
if [ "$built" = 0 ]; then
  rm -f "$out/extension_build.log"  # kept where the build failed: OUT brings back eight files at most
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
    -p no:cacheprovider -m cuda tests -o addopts="" --timeout=140 "${workers[@]}"  # beside the C++ tests
  collect_shards
  step torch_gpu bench.log 90 "$python" ../experiments/torch_gpu.py --out "$out/torch_gpu.json"
  # What each hook adds to a bf16 training step of a ResNet-50 and a GPT-2 small (#40, item 4)
  [ "${STEP_COST:-1}" = 1 ] && step step_cost bench.log 200 env PYTHONPATH="$root:$PYTHONPATH" PYTHONUNBUFFERED=1 "$python" \
    -m experiments.gpu_step_cost --out "$out/step_cost.json"
  # What FSDP2's compressed reduce-scatter costs per step, settled once a step or per call, the workspace kept or
  # given back (#40, items 2 and 4)
  [ "${FSDP_COST:-1}" = 1 ] && step fsdp_cost bench.log 120 env PYTHONPATH="$root:$PYTHONPATH" PYTHONUNBUFFERED=1 \
    "$python" -m experiments.fsdp_gpu_cost --out "$out/fsdp_cost.json"
  [ -s "$out/pytest_cuda.log" ] && tail -5 "$out/pytest_cuda.log"
else
  collect_shards
  failed+=(extension_build)
  tail -30 "$out/extension_build.log"
fi
grep -h "^=== \|test cases" "$out/cuda_tests.log"
[ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
echo "all GPU checks passed"
