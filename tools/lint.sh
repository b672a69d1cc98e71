#!/usr/bin/env bash
# The style and static checks tools/test.sh runs before the suite:
# rustfmt, clippy (warnings are errors; every unsafe block documented),
# clippy again for the other Python versions the code supports, the Rust unit
# tests, ruff, and mypy over the package and its stubs.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$PWD/.venv/bin/python
# The build scripts configure pyo3 for the venv's interpreter.
export PYO3_PYTHON=$py

have_component() { cargo "$1" --version >/dev/null 2>&1 || rustup component add "$2" >/dev/null 2>&1; }

echo "== cargo fmt --check"
if have_component fmt rustfmt; then cargo fmt --check; else echo "   (rustfmt is not installed for this toolchain: skipped)"; fi

echo "== cargo clippy -D warnings"
if have_component clippy clippy; then
    cargo clippy --quiet --release --all-targets -- -D warnings
else
    echo "   (clippy is not installed for this toolchain: skipped)"
fi

echo "== cargo clippy for the other supported Pythons (3.10, 3.12 to 3.14)"
# CI builds for the venv's Python (3.11) only: the code gated on other
# versions (#[cfg(Py_3_xx)]) is compiled here against pyo3's description of
# each version, with no interpreter needed (PYO3_CONFIG_FILE), in a target
# directory of its own (about a minute on a fresh checkout).
if have_component clippy clippy; then
    configs=target/pyo3-configs
    mkdir -p "$configs"
    for version in 3.10 3.12 3.13 3.14; do
        printf 'implementation=CPython\nversion=%s\nshared=true\nabi3=false\npointer_width=64\nsuppress_build_script_link_lines=false\n' \
            "$version" > "$configs/$version.txt"
        echo "   $version"
        PYO3_CONFIG_FILE=$PWD/$configs/$version.txt CARGO_TARGET_DIR=target/versions \
            cargo clippy --quiet --lib --features pyo3/extension-module -- -D warnings
    done
else
    echo "   (clippy is not installed for this toolchain: skipped)"
fi

echo "== cargo test (unit tests of the pure logic)"
# The test binary links the venv's libpython (the extension itself does not).
libdir=$($py -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" cargo test --quiet

echo "== ruff"
.venv/bin/ruff check python tests benchmarks examples

echo "== mypy"
.venv/bin/mypy
