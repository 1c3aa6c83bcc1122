#!/usr/bin/env bash
# Creates build/venv-torch2: torch 2.x from PyPI (about 5 GB with its CUDA libraries; it
# runs on the CPU here) beside Debian's torch 1.13, for what 1.13 lacks: FSDP2
# (gradcomp.torch.fsdp's tests and benchmark) and torch 2.x's PowerSGD hook in the
# cluster measurement (experiments/ddp_cluster_hooks.sh). Idempotent: does nothing when the
# environment already has this torch. Prints the environment's python.
#   --gradcomp  also builds gradcomp there (for the CPU) from a copy of the sources, whose
#               objects must not mix with those of the torch 1.13 build in build/ (the copy
#               keeps the sources' times, so a rebuild compiles only what changed), and
#               installs what its tests use: pytest, Lightning and Accelerate.
set -euo pipefail
cd "$(dirname "$0")/.."
version=2.15.0
venv=build/venv-torch2
if ! "$venv/bin/python" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
  echo "torch2_env: installing torch $version from PyPI into $venv" >&2
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$version" numpy >&2
fi
if [ "${1:-}" = "--gradcomp" ]; then
  python="$PWD/$venv/bin/python"
  "$python" -m pip install --quiet --disable-pip-version-check "pytest==8.3.5" "pytest-timeout==2.3.1" \
    "pytest-xdist==3.6.1" "lightning==2.6.6" "accelerate==1.15.0" >&2
  mkdir -p build/torch2-src
  rm -rf build/torch2-src/include build/torch2-src/python build/torch2-src/scripts
  mkdir -p build/torch2-src/scripts
  cp -a setup.py pyproject.toml README.md LICENSE include python build/torch2-src/
  cp -a scripts/binding_units.py build/torch2-src/scripts/  # setup.py writes the units with it
  echo "torch2_env: building gradcomp against torch $version (CPU)" >&2
  (cd build/torch2-src && GRADCOMP_CUDA=0 "$python" -m pip install --quiet --disable-pip-version-check \
    --no-build-isolation --no-deps . >&2)
fi
echo "$venv/bin/python"
