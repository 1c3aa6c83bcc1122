#!/usr/bin/env bash
# Formats the C++ sources (clang-format-16, .clang-format) and lints the Python ones (ruff,
# pyproject.toml). With --check it changes nothing and fails, naming the files, where the
# tree is not as they would leave it (the README's test command runs it so).
#   bash scripts/format.sh [--check]
# Needs clang-format-16 (scripts/setup.sh test) and ruff (RUFF, default build/venv/bin/ruff,
# which scripts/test.sh installs from PyPI: Debian 12 has none).
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
[[ ${1:-} == --check ]] && check=1
clang_format=${CLANG_FORMAT:-clang-format-16}
ruff=${RUFF:-build/venv/bin/ruff}

mapfile -t cxx < <(git ls-files -- include tests tools bench fuzz examples experiments python/csrc |
                   grep -E '\.(hpp|cpp|cuh|cu)$')
python_paths=(python examples experiments bench scripts)
if ((check)); then
  "$clang_format" --style=file --dry-run --Werror "${cxx[@]}"
  "$ruff" check --quiet "${python_paths[@]}"
  echo "format: ${#cxx[@]} C++ files formatted, the Python lint-clean"
else
  "$clang_format" --style=file -i "${cxx[@]}"
  "$ruff" check --quiet --fix "${python_paths[@]}"
fi
