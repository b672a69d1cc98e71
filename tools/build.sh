#!/usr/bin/env bash
# Builds zuvrs and installs it into .venv. Usage: tools/build.sh [release|debug]
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-release}"
flag="--release"
[ "$profile" = "debug" ] && flag=""
echo "== building zuvrs ($profile)"
rm -rf target/wheels-"$profile"
.venv/bin/maturin build $flag --quiet -i .venv/bin/python -o target/wheels-"$profile"
.venv/bin/python -m pip install -q --disable-pip-version-check --force-reinstall --no-deps target/wheels-"$profile"/*.whl
