#!/usr/bin/env bash
# Sets up, runs the style and static checks (tools/lint.sh), builds and runs
# the whole test suite (tests/ and the benchmark bodies in benchmarks/ as
# plain tests) on a release build, with the CI selection of the upstream
# suites (CPython's, uvloop's, AnyIO's, aiohttp's, asyncssh's, uvicorn's,
# redis-py's, aioftp's, Tornado's, pyzmq's and aioquic's own tests on zuvrs, checked against
# tests/upstream/ratchet.json; aioftp's once more with native streams), then the whole suite again
# on a debug build (Rust debug assertions on, and NativeCell's checks of
# every native state access), zuvrs's half of the parity tests only.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/lint.sh
# The tests run in one pytest-xdist worker per core, up to 4 (the two
# halves of the 4 GiB write test, which hold several GiB each, take turns:
# one_at_a_time in tests/_support.py).
workers=$(nproc 2>/dev/null || echo 2)
[ "$workers" -le 4 ] || workers=4
for profile in release debug; do
    tools/build.sh "$profile"
    echo "== tests ($profile build, $workers workers)"
    # The debug run leaves out the stdlib loop's half of the parity tests:
    # the release run ran it, and it tests nothing of zuvrs's build.
    only=()
    [ "$profile" = release ] || only=(--zuvrs-only)
    .venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" "${only[@]}" tests benchmarks
    if [ "$profile" = release ]; then
        # Two suites at a time: they wait on timers and sockets far more
        # than they compute (about 11 minutes one at a time, 6.5 two at a time).
        echo "== upstream suites, CI selection (release build, two at a time)"
        tools/upstream.sh --ci --jobs 2
        # aioftp's suite, whose client and server read and write through
        # asyncio's streams, again with zuvrs.streams.install(): the same
        # ratchet (about 15 s; redis-py's and the rest of the selection
        # with --native-streams take another 5 minutes, run by hand).
        echo "== aioftp's suite with native streams (release build)"
        tools/upstream.sh --ci --no-install --native-streams --suite aioftp
    fi
done
