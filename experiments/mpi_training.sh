# Sourced by the scripts that reproduce docs/results.md's MPI training runs: installs what
# they need, builds train_fashion_mnist (CMakePresets.json "results") and defines
# `train RANKS ARGS...`, which runs it under mpirun (oversubscribed, bounded in time).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh results
cmake --preset results >/dev/null
cmake --build --preset results -j"$(nproc)" >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
train() { timeout 3600 mpirun --oversubscribe -n "$1" build/results/experiments/train_fashion_mnist "${@:2}"; }
