#!/usr/bin/env bash
# Installs what building and testing zuvrs needs on a fresh Debian machine
# with Python 3 and Rust: libclang (bindgen in libuv-sys2), openssl (TLS test
# certificates fall back to its CLI; s_server and s_client are TLS peers in
# tests/test_tls_peers.py), nginx-light (the real TLS server and client of
# the same tests), wrk (the HTTP benchmarks' load generator, http and
# https), redis-server (the redis benchmarks start their own), and a
# virtualenv in .venv with maturin,
# pytest, pytest-xdist (tools/test.sh runs a worker per core), pytest-codspeed, the loops we compare with, the applications the
# tests serve (uvicorn, aiohttp) with their clients, the servers and test
# plugins the integrations are tested with (gunicorn and its uvicorn worker,
# hypercorn, pytest-asyncio, pytest-aiohttp, anyio's plugin), redis-py and
# hiredis (the redis benchmarks' client and its parser), prometheus_client
# (whose text parser checks zuvrs.stats.prometheus), hypothesis (the
# differential transport fuzzer, tests/test_fuzz_transports.py), and ruff and
# mypy for tools/lint.sh.
#
# ZUVRS_SETUP_RSLOOP=1 also installs rsloop 0.1.66, one of the loops the
# benchmarks compare with: it has no wheel for this Python, and its sdist
# builds only with the nightly toolchain (about 5 minutes; pip caches the
# wheel it builds). Without it the benchmarks report rsloop as not installed.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! dpkg -s libclang-dev >/dev/null 2>&1 || ! command -v wrk >/dev/null 2>&1 \
    || ! command -v openssl >/dev/null 2>&1 || ! command -v nginx >/dev/null 2>&1 \
    || ! command -v redis-server >/dev/null 2>&1; then
    echo "== installing libclang-dev wrk openssl nginx-light redis-server"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libclang-dev wrk openssl nginx-light \
        redis-server >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    echo "== creating .venv"
    python3 -m venv .venv
fi
echo "== installing Python packages"
.venv/bin/python -m pip install -q --disable-pip-version-check \
    "maturin>=1.5,<2" "pytest>=7" "pytest-xdist>=3" "pytest-codspeed>=3" uvloop rloop \
    uvicorn httptools httpx aiohttp websockets cryptography \
    gunicorn uvicorn-worker hypercorn pytest-asyncio pytest-aiohttp anyio \
    redis hiredis ruff mypy typing-extensions prometheus_client hypothesis

if [ "${ZUVRS_SETUP_RSLOOP:-0}" = 1 ] && ! .venv/bin/python -c "import rsloop" 2>/dev/null; then
    echo "== building rsloop 0.1.66 (nightly toolchain, about 5 minutes)"
    RUSTUP_TOOLCHAIN=nightly RUSTFLAGS='-Zcrate-attr=feature(allocator_api)' \
        .venv/bin/python -m pip install -q --disable-pip-version-check \
        --no-binary rsloop rsloop==0.1.66
fi
