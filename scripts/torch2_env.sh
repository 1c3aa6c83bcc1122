#!/usr/bin/env bash
# Creates build/venv-torch2: torch 2.x from PyPI (about 5 GB with its CUDA libraries; it
# runs on the CPU here) beside Debian's torch 1.13, for what 1.13 lacks: torch 2.x's
# PowerSGD hook in the cluster measurement (scripts/cluster_results.sh). Idempotent: does
# nothing when the environment already has this torch. Prints the environment's python.
set -euo pipefail
cd "$(dirname "$0")/.."
version=2.15.0
venv=build/venv-torch2
if ! "$venv/bin/python" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
  echo "torch2_env: installing torch $version from PyPI into $venv" >&2
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$version" numpy >&2
fi
echo "$venv/bin/python"
