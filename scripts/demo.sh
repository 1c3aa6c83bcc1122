#!/usr/bin/env bash
# Sets everything up, builds, and runs the demo: `gradcomp eval` on the embedded
# synthetic gradient stream. Extra arguments go to `gradcomp eval`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
cmake --preset demo
cmake --build --preset demo -j"$(nproc)"
build/demo/tools/gradcomp eval "$@"
