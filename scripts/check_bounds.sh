#!/usr/bin/env bash
# Prove one corner of the versions pyproject.toml allows: a new venv (outside the checkout) with
# the given Python, numba and numpy, kvnumba installed from this checkout, then the README's quick
# start and the plain test suite (the kernels' semantics against the spec's examples, input
# validation with nothing changed, the one-request calls against the batched ones, and which
# features a priority function reads, from its bytecode) run there.
# The eviction policies' kernels, which compile slowest on old numba releases, are left to the
# main suite.
#
#   bash scripts/check_bounds.sh PYTHON_VERSION NUMBA_VERSION NUMPY_VERSION
#   bash scripts/check_bounds.sh 3.10 0.60.0 1.24.4     # the oldest CI proves
#
# PYTHON_VERSION picks a pyenv interpreter (under PYENV_ROOT or `pyenv root`) or a python3.X on
# PATH.
# Each corner keeps its own numba cache in the checkout (.numba_cache_bounds_*).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
pyver=$1 numba=$2 numpy=$3

roots=()
if [[ -n ${PYENV_ROOT:-} ]]; then
    roots+=("$PYENV_ROOT")
fi
if command -v pyenv >/dev/null; then
    roots+=("$(pyenv root)")
fi
candidates=()
for r in "${roots[@]}"; do
    candidates+=("$r"/versions/"$pyver".*/bin/python)
done
candidates+=("$(command -v "python$pyver" || true)")
python=""
for candidate in "${candidates[@]}"; do
    if [[ -x $candidate ]]; then
        python=$candidate
        break
    fi
done
if [[ -z $python ]]; then
    echo "check_bounds: no Python $pyver found (pyenv or python$pyver on PATH)" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/venv"
venv_python=$work/venv/bin/python
"$venv_python" -m pip install -q "numba==$numba" "numpy==$numpy" "pytest>=8" "hypothesis>=6.100"
"$venv_python" -m pip install -q --no-deps -e "$root"
"$venv_python" -c 'import sys, numba, numpy; print(f"Python {sys.version.split()[0]}, numba {numba.__version__}, numpy {numpy.__version__}")'

export NUMBA_CACHE_DIR="$root/.numba_cache_bounds_py${pyver}_numba${numba}_numpy${numpy}"
python3 scripts/readme_quickstart.py "$venv_python"
"$venv_python" -m pytest -q -p no:cacheprovider tests/test_semantics.py tests/test_validation.py \
    tests/test_one_request.py
# What a priority policy's function reads, found in its bytecode, which changes with Python.
"$venv_python" -m pytest -q -p no:cacheprovider tests/test_priority_policies.py \
    -k "features_read or reads_is_one_it_stores"
