#!/usr/bin/env bash
# Runs test suites the project did not write (CPython's test_asyncio,
# uvloop's, AnyIO's, aiohttp's, asyncssh's, uvicorn's, redis-py's, aioftp's,
# Tornado's, pyzmq's, aioquic's and websockets' own tests) on zuvrs, the
# stdlib loop and uvloop, and compares zuvrs's passed counts with
# tests/upstream/ratchet.json. Needs tools/setup.sh and tools/build.sh first.
# All arguments go to tests/upstream/run.py (see its --help), e.g.
#   tools/upstream.sh                    # everything, three loops
#   tools/upstream.sh --ci               # zuvrs only, the CI selection, --check
#   tools/upstream.sh --update-ratchet   # record zuvrs's counts and RESULTS.md
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    echo "no .venv: run tools/setup.sh and tools/build.sh first" >&2
    exit 2
fi
exec .venv/bin/python tests/upstream/run.py "$@"
