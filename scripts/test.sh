#!/usr/bin/env bash
# Sets everything up, builds everything, and runs the whole test suite under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
phase() { echo "test.sh: $1 after $((SECONDS - started)) s" >&2; }
kill_tree() { local child; for child in $(pgrep -P "$1"); do kill_tree "$child"; done; kill "$1" 2>/dev/null || true; }
trap 'for job in $(jobs -p); do kill_tree "$job"; done' EXIT  # no build left running when a step fails
bash scripts/setup.sh test
phase "setup"
# torch 2.x from PyPI (below) downloads while the C++ builds, then gradcomp is built there
# at a lower priority: it takes what the builds and tests before it leave of the CPU.
# The package's selector units include no torch header, so both builds of it compile the
# same code: ccache keeps what the torch 2.15 build compiles for the torch 1.13 build,
# which therefore waits for it. Paths under the repository are hashed relative to the
# build directory, as deep in build/torch2-src as here, and the directory is not hashed
# (Python's flags ask for -g, which the package's -g0 turns off).
export CCACHE_DIR="$PWD/build/ccache" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
ccache=/usr/lib/ccache  # put first on PATH, it runs the compilers through ccache
mkdir -p build
(bash scripts/torch2_env.sh && PATH="$ccache:$PATH" nice -n 10 bash scripts/torch2_env.sh --gradcomp) \
  > build/torch2_env.log 2>&1 &
torch2_build=$!
# Without a GPU the CUDA tests cannot run here: they are compiled only, for one architecture
# with their host code unoptimised (CMakeLists.txt, GRADCOMP_CUDA_COMPILE_ONLY).
compile_only=ON
nvidia-smi -L >/dev/null 2>&1 && compile_only=OFF
cmake --preset release -DGRADCOMP_CUDA_COMPILE_ONLY=$compile_only
cmake --build --preset release -j"$(nproc)"
phase "the C++ build"
ctest --test-dir build/release --output-on-failure --no-tests=error -j"$(nproc)" --output-junit ctest.xml
phase "ctest"

# The PyTorch package (python/, docs/torch.md) and its whole pytest suite (DDP on 2 and 4
# gloo ranks, the Python API reference; the CUDA tests report themselves skipped without
# a GPU) under each torch it supports: Debian's torch 1.13, the oldest, in a virtual
# environment that sees the system's packages (Debian's Python is externally managed),
# built without fetching anything; then torch 2.15 from PyPI, what users have, in an
# environment of its own with gradcomp built there for the CPU, Lightning and Accelerate
# (scripts/torch2_env.sh, about 5 GB). FSDP2 and the integrations' tests skip under 1.13.
wait "$torch2_build" || { cat build/torch2_env.log >&2; exit 1; }
phase "the package under torch 2.15 built"
/usr/bin/python3 -m venv --system-site-packages build/venv
ccache --zero-stats >/dev/null
PATH="$ccache:$PATH" build/venv/bin/python -m pip install --quiet --no-build-isolation --no-deps --no-index .
ccache --print-stats | awk '$1 ~ /^(direct|preprocessed)_cache_hit$/ {hit += $2} $1 == "cache_miss" {miss = $2}
  END {printf "test.sh: %d of the %d units compiled for torch 1.13 came from ccache\n", hit, hit + miss}' >&2

# The C++ sources formatted and the Python lint-clean (scripts/format.sh; ruff comes from
# PyPI, which Debian 12 does not package).
build/venv/bin/python -m pip install --quiet "ruff==0.17.6"
bash scripts/format.sh --check
phase "the package under torch 1.13 built"

# The unit and MPI tests run once more under AddressSanitizer and UndefinedBehaviorSanitizer
# (CMakePresets.json "debug", at -Og, which runs them in half the time -O0 takes for a
# little more build): the SIMD kernels' loads and stores stay in bounds, and
# ranks configured differently never write past a buffer. Their build and run take the
# lowest priority beside the Python suites, whose ranks leave a core mostly idle as they
# wait on each other (the sanitized tests' time limits allow for it: tests/CMakeLists.txt).
(cmake --preset debug && nice -n 19 cmake --build --preset debug -j"$(nproc)" &&
  nice -n 19 ctest --test-dir build/debug --output-on-failure --no-tests=error -j"$(nproc)" -L "^(unit|mpi)$" \
    --output-junit ctest.xml) > build/debug_tests.log 2>&1 &
debug_tests=$!

# Two pytest workers (pytest-xdist): a test's ranks spend much of their time waiting on
# each other, which the other worker's test fills (the torch 2.15 suite: 508 s with one,
# 354 s with two on this 2-core machine type, 2026-11-28).
(cd build && venv/bin/python -m pytest -q -rs -n 2 --durations=8 --timeout=900 --junitxml=pytest.xml ../python/tests)
phase "pytest under torch 1.13"
torch2="$PWD/build/venv-torch2/bin/python"
(cd build && "$torch2" -m pytest -q -rs -n 2 -p no:cacheprovider --durations=8 --timeout=900 \
  --junitxml=pytest-torch2.xml ../python/tests)
phase "pytest under torch 2.15"

wait "$debug_tests" || { cat build/debug_tests.log >&2; exit 1; }
tail -n 4 build/debug_tests.log >&2
phase "ctest under ASan+UBSan"

# One line per suite: how many ran, what was skipped and why (the CUDA tests without a GPU).
/usr/bin/python3 scripts/test_summary.py "ctest=build/release/ctest.xml" "pytest under torch 1.13=build/pytest.xml" \
  "pytest under torch 2.15=build/pytest-torch2.xml" "ctest under ASan+UBSan=build/debug/ctest.xml"
