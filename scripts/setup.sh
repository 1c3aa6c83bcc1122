#!/usr/bin/env bash
# Installs the Debian 12 packages one purpose needs, and nothing more:
#   bash scripts/setup.sh demo      the CLI demo (a compiler and CMake)
#   bash scripts/setup.sh test      everything the test suite builds and runs (C++, MPI,
#                                   Kokkos, fuzzing, the PyTorch package, the API docs)
#   bash scripts/setup.sh bench     the benchmark suites (libtorch for torch.topk, plots)
#   bash scripts/setup.sh results   the training results of docs/results.md
#   bash scripts/setup.sh --print PURPOSE   lists the packages, installs nothing
# Idempotent: installs only what is missing. Needs root (or sudo).
set -euo pipefail

print_only=0
if [[ ${1:-} == --print ]]; then
  print_only=1
  shift
fi
purpose=${1:-test}
demo=(build-essential cmake)
cpp_tests=(
  doctest-dev                    # unit tests
  clang libclang-rt-14-dev       # libFuzzer and sanitizers (fuzz targets)
  libbenchmark-dev               # Google Benchmark suites (smoke-tested by ctest)
  libtrilinos-kokkos-dev         # the Kokkos backend (Kokkos 3.4.1, Serial)
  libopenmpi-dev openmpi-bin     # MPI collectives, tested under mpirun
  libeigen3-dev zlib1g-dev dataset-fashion-mnist   # experiments/train_fashion_mnist (model math, IDX.gz, data)
  doxygen                        # the API reference, checked for undocumented entities
  clang-format-16 git            # the C++ sources stay formatted (scripts/format.sh --check)
  iproute2                       # the emulated cluster (experiments/cluster.sh: ip netns, tc tbf)
)
python_tests=(
  python3 python3-venv python3-setuptools python3-wheel python3-numpy             # the package's build
  python3-pytest python3-pytest-timeout python3-pytest-xdist                   # and its tests
  python3-sphinx                                                                # the Python API reference
  python3-torch libtorch-dev pybind11-dev ninja-build                       # the torch extension's build
  ccache                         # its selector units, compiled once for both torches (scripts/test.sh)
)
case "$purpose" in
  demo) packages=("${demo[@]}") ;;
  test) packages=("${demo[@]}" "${cpp_tests[@]}" "${python_tests[@]}") ;;
  bench) packages=("${demo[@]}" "${cpp_tests[@]}" libtorch-dev python3-numpy python3-matplotlib) ;;
  results) packages=("${demo[@]}" libopenmpi-dev openmpi-bin libeigen3-dev zlib1g-dev dataset-fashion-mnist iproute2 python3-matplotlib
                     dict-gcide   # the text experiments/fsdp_lm.py trains on
                     "${python_tests[@]}") ;;
  *) echo "setup.sh: unknown purpose '$purpose' (demo, test, bench or results)" >&2; exit 2 ;;
esac

if ((print_only)); then
  echo "${packages[*]}"
  exit 0
fi

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
  echo "setup: all packages for '$purpose' present"
fi
