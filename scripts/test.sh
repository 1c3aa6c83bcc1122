#!/usr/bin/env bash
# Sets everything up, builds everything, and runs the whole test suite under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
cmake --preset release
cmake --build --preset release -j"$(nproc)"
ctest --test-dir build/release --output-on-failure --no-tests=error -j"$(nproc)" --output-junit ctest.xml

# The PyTorch package (python/, docs/torch.md): built against Debian's torch in a virtual
# environment that sees the system's packages (Debian's Python is externally managed),
# without fetching anything, then its pytest suite (DDP on 2 and 4 gloo ranks; the CUDA
# tests report themselves skipped without a GPU).
/usr/bin/python3 -m venv --system-site-packages build/venv
build/venv/bin/python -m pip install --quiet --no-build-isolation --no-deps --no-index .

# The C++ sources formatted and the Python lint-clean (scripts/format.sh; ruff comes from
# PyPI, which Debian 12 does not package).
build/venv/bin/python -m pip install --quiet "ruff==0.17.6"
bash scripts/format.sh --check
(cd build && venv/bin/python -m pytest -q -rs --timeout=900 --junitxml=pytest.xml ../python/tests)

# FSDP2 (gradcomp.torch.fsdp) needs torch 2.x, which Debian lacks: torch 2.15 from PyPI in
# an environment of its own with gradcomp built there for the CPU (scripts/torch2_env.sh,
# about 5 GB), then the FSDP tests, which skip under 1.13 above.
torch2="$PWD/$(bash scripts/torch2_env.sh --gradcomp)"
(cd build && "$torch2" -m pytest -q -rs -p no:cacheprovider --timeout=900 --junitxml=pytest-torch2.xml \
  ../python/tests/test_fsdp.py)

# The unit and MPI tests once more under AddressSanitizer and UndefinedBehaviorSanitizer
# (CMakePresets.json "debug"): the SIMD kernels' loads and stores stay in bounds, and
# ranks configured differently never write past a buffer.
cmake --preset debug
cmake --build --preset debug -j"$(nproc)"
ctest --test-dir build/debug --output-on-failure --no-tests=error -j"$(nproc)" -L "unit|mpi" --output-junit ctest.xml

# One line per suite: how many ran, what was skipped and why (the CUDA tests without a GPU).
/usr/bin/python3 scripts/test_summary.py "ctest=build/release/ctest.xml" "pytest=build/pytest.xml" \
  "pytest under torch 2.x (FSDP2)=build/pytest-torch2.xml" "ctest under ASan+UBSan=build/debug/ctest.xml"
