#!/usr/bin/env bash
# Installs the Debian 12 packages gradcomp builds, tests and benchmarks with.
# Idempotent: installs only what is missing. Needs root (or sudo).
set -euo pipefail

# Extra packages can be named on the command line (scripts/bench.sh adds libtorch-dev).
packages=(
  build-essential cmake          # compiler and build system
  doctest-dev                    # unit tests
  clang libclang-rt-14-dev       # libFuzzer and sanitizers for the decoder fuzz test
  libbenchmark-dev               # Google Benchmark suites
  libtrilinos-kokkos-dev         # the Kokkos backend (Kokkos 3.4.1, Serial)
  libopenmpi-dev openmpi-bin     # MPI collectives, tested under mpirun
  libeigen3-dev zlib1g-dev dataset-fashion-mnist   # examples/train_fashion_mnist (model math, IDX.gz, data)
  python3 python3-numpy python3-matplotlib   # benchmark tables and plots
 "$@"
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
