#!/usr/bin/env bash
# Sets everything up, builds, and runs the demo: `gradcomp eval` on the embedded
# synthetic gradient stream. Extra arguments go to `gradcomp eval`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DGRADCOMP_BUILD_TESTS=OFF -DGRADCOMP_BUILD_BENCHMARKS=OFF
cmake --build build/release --target gradcomp_cli -j"$(nproc)"
build/release/tools/gradcomp eval "$@"
