"""The suite's own options (tests/conftest.py)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _collected(*args):
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", *args],
        capture_output=True, text=True, timeout=120, cwd=os.path.dirname(HERE),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_zuvrs_only_leaves_out_the_stdlib_half_only():
    """--zuvrs-only (tools/test.sh's debug run) drops the tests run on
    asyncio's loop with asyncio's streams, and keeps zuvrs's half, the
    native streams on asyncio's loop, and the tests with no loop."""
    files = [os.path.join("tests", name) for name in ("test_streams_native.py", "test_timers.py")]
    every, only = _collected(*files), _collected("--zuvrs-only", *files)
    dropped = every - only
    assert dropped and only < every
    # The loop is the first parameter of these ids, the streams the second.
    for test in dropped:
        params = test.partition("[")[2]
        assert params.startswith("asyncio") and not params.endswith("-native]"), test
        # Its zuvrs half stays.
        assert test.replace("[asyncio", "[zuvrs", 1) in only, test
    assert any(test.endswith("[asyncio-native]") for test in only)
    assert any("[" not in test for test in only)
