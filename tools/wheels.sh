#!/usr/bin/env bash
# Builds a release wheel of zuvrs for every CPython 3.10+ on this machine
# (pyenv's, else python3.x on PATH), checks that each carries the type stubs,
# installs each into a fresh virtualenv and runs tools/wheel_smoke.py there;
# then builds the sdist (maturin sdist) and pip-installs it into a fresh
# virtualenv (a build from source: needs only Rust and libclang) and smoke
# tests that too.
#
# Usage: tools/wheels.sh [--no-sdist | --sdist-only] [PYTHON ...]
#   PYTHON: interpreters to build for (default: every CPython 3.10+ found)
# Wheels go to target/wheels-all/, the sdist to target/sdist/, the
# virtualenvs to target/wheel-venvs/. Needs tools/setup.sh first (maturin).
set -uo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

sdist=1
wheels=1
pythons=()
for arg in "$@"; do
    case "$arg" in
        --no-sdist) sdist=0 ;;
        --sdist-only) wheels=0 ;;
        *) pythons+=("$arg") ;;
    esac
done

if [ ${#pythons[@]} -eq 0 ]; then
    # Every pyenv CPython 3.10+ (one per minor version: the newest), then any
    # python3.x on PATH for minor versions pyenv does not have.
    declare -A seen=()
    if [ -d "$HOME/.pyenv/versions" ]; then
        for dir in $(ls -d "$HOME"/.pyenv/versions/3.* 2>/dev/null | sort -V -r); do
            v="$(basename "$dir")"
            [[ "$v" =~ ^3\.([0-9]+)\.[0-9]+t?$ ]] || continue
            minor="${BASH_REMATCH[1]}"
            [ "$minor" -ge 10 ] || continue
            key="3.$minor${v##*[0-9]}"
            [ -n "${seen[$key]:-}" ] && continue
            [ -x "$dir/bin/python" ] || continue
            seen[$key]=1
            pythons+=("$dir/bin/python")
        done
    fi
    for minor in 10 11 12 13 14; do
        [ -n "${seen[3.$minor]:-}" ] && continue
        if command -v "python3.$minor" >/dev/null 2>&1; then
            seen[3.$minor]=1
            pythons+=("$(command -v "python3.$minor")")
        fi
    done
    IFS=$'\n' pythons=($(for p in "${pythons[@]}"; do echo "$($p -c 'import sys; print("%d.%02d" % sys.version_info[:2])') $p"; done | sort | cut -d' ' -f2-))
    unset IFS
fi
[ ${#pythons[@]} -gt 0 ] || { echo "no CPython 3.10+ found"; exit 1; }

maturin="$root/.venv/bin/maturin"
[ -x "$maturin" ] || { echo "run tools/setup.sh first (no .venv/bin/maturin)"; exit 1; }

# A target directory of its own: a build for another interpreter does not
# disturb the one tools/build.sh installed into .venv.
export CARGO_TARGET_DIR="$root/target/wheels-build"
out="$root/target/wheels-all"
venvs="$root/target/wheel-venvs"
if [ "$wheels" -eq 1 ]; then
    rm -rf "$out" "$venvs"
fi
rm -rf "$venvs/sdist"
mkdir -p "$out" "$venvs"
# Smoke tests run outside the checkout, so `import zuvrs` finds the install.
smoke_dir="$(mktemp -d)"
cp tools/wheel_smoke.py "$smoke_dir/"
trap 'rm -rf "$smoke_dir"' EXIT

declare -a summary=()
status=0

check_wheel_contents() {
    # The wheel must carry the type stubs and the extension.
    "$root/.venv/bin/python" - "$1" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["zuvrs/__init__.py", "zuvrs/__init__.pyi", "zuvrs/py.typed", "zuvrs/__main__.py",
        "zuvrs/pytest_plugin.py", "zuvrs/workers.py"]
missing = [n for n in need if n not in names]
ext = [n for n in names if n.startswith("zuvrs/_zuvrs") and n.endswith(".so")]
if missing or not ext:
    print("wheel lacks", missing or "the extension module")
    sys.exit(1)
print("wheel has", ", ".join(need[1:3]), "and", ext[0])
EOF
}

smoke() {  # smoke NAME PYTHON INSTALL-ARGS...
    local name="$1" py="$2"; shift 2
    local venv="$venvs/$name"
    "$py" -m venv "$venv" || return 1
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" || return 1
    (cd "$smoke_dir" && "$venv/bin/python" wheel_smoke.py)
}

for py in "${pythons[@]}"; do
    [ "$wheels" -eq 1 ] || break
    ver="$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3] + ("t" if getattr(sys, "_is_gil_enabled", lambda: True)() is False or "t" in sys.abiflags else ""))')"
    echo "== CPython $ver ($py): building"
    wheel_dir="$out/$ver"
    if ! "$maturin" build --release --quiet -i "$py" -o "$wheel_dir"; then
        summary+=("$ver: build FAILED"); status=1; continue
    fi
    wheel="$(ls "$wheel_dir"/*.whl)"
    echo "== CPython $ver: $(basename "$wheel")"
    if ! check_wheel_contents "$wheel"; then
        summary+=("$ver: $(basename "$wheel"): contents FAILED"); status=1; continue
    fi
    if smoke "py$ver" "$py" "$wheel"; then
        summary+=("$ver: $(basename "$wheel"): smoke tests passed")
    else
        summary+=("$ver: $(basename "$wheel"): smoke tests FAILED"); status=1
    fi
done

if [ "$sdist" -eq 1 ]; then
    echo "== sdist"
    rm -rf target/sdist
    if "$maturin" sdist -o target/sdist; then
        tarball="$(ls target/sdist/*.tar.gz)"
        py="${pythons[-1]}"
        echo "== pip install $(basename "$tarball") with $py (builds from source)"
        if smoke sdist "$py" "$root/$tarball"; then
            summary+=("sdist: $(basename "$tarball"): pip install + smoke tests passed ($("$py" -c 'import platform; print(platform.python_version())'))")
        else
            summary+=("sdist: $(basename "$tarball"): FAILED"); status=1
        fi
    else
        summary+=("sdist: maturin sdist FAILED"); status=1
    fi
fi

echo
echo "== summary"
for line in "${summary[@]}"; do echo "$line"; done
exit $status
