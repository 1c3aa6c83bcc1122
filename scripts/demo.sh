#!/usr/bin/env bash
# Sets everything up, builds, and runs the demo: `gradcomp eval` on the embedded
# synthetic gradient stream. Extra arguments go to `gradcomp eval`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
cmake -S . -B build/demo -DCMAKE_BUILD_TYPE=Release -DGRADCOMP_BUILD_TESTS=OFF -DGRADCOMP_BUILD_BENCHMARKS=OFF -DGRADCOMP_BUILD_EXAMPLES=OFF
cmake --build build/demo --target gradcomp_cli -j"$(nproc)"
build/demo/tools/gradcomp eval "$@"
