#!/usr/bin/env bash
# Build kvnumba's sdist and wheel, check their metadata, then install the wheel (built from the
# sdist, so the sdist is proven complete) into a new venv outside the checkout and run the
# README's quick start and `kvnumba simulate --limit 200` from it, as a user of the package would.
#
#   bash scripts/check_package.sh [OUT_DIR]      # OUT_DIR defaults to dist/
#
# Needs `build` and `twine` in the running Python (pip install -e '.[package]').
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:-$root/dist}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$out"
python -m build --outdir "$out" . >"$work/build.log" 2>&1 || {
    cat "$work/build.log"
    exit 1
}
ls -l "$out"
python -m twine check --strict "$out"/*

python3 -m venv "$work/venv"
wheel=$(ls "$out"/kvnumba-*.whl)
"$work/venv/bin/python" -m pip install -q "kvnumba[sim] @ file://$wheel"

cd "$work"
"$work/venv/bin/python" - "$root" <<'EOF'
import sys

import kvnumba

print("kvnumba", kvnumba.__version__, "from", kvnumba.__file__)
if kvnumba.__file__.startswith(sys.argv[1]):
    sys.exit("kvnumba was imported from the checkout, not from the wheel")
EOF
python3 "$root/scripts/readme_quickstart.py" "$work/venv/bin/python"
"$work/venv/bin/kvnumba" simulate --limit 200
echo "package check passed: $(cd "$out" && ls | tr '\n' ' ')"
