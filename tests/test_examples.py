"""Every program in examples/ runs to completion by itself, exits 0, prints
what it says it does, and writes nothing to stderr.

Each one runs in a fresh interpreter (this one's, so the zuvrs under test),
from a scratch directory, with a timeout, and without the PYTHON* variables
of the environment the suite was started from (asyncio's debug mode or
warnings options would add output). The signals example also runs with
SIGINT ignored from the start, as a shell's background job starts it.
"""

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
TIMEOUT = 60

# name -> (arguments, modules it needs besides zuvrs, lines expected in this order)
EXAMPLES = {
    "tcp_echo": (
        [],
        [],
        [
            r"listening on 127\.0\.0\.1:\d+; running on zuvrs: True",
            r"sent 'hello', got back 'hello'",
            r"sent 'from', got back 'from'",
            r"sent 'zuvrs', got back 'zuvrs'",
            r"server closed",
        ],
    ),
    "native_streams": (
        [],
        [],
        [
            r"limit 8: ValueError: Separator is found, but chunk is longer than limit; left b'short\\n'",
            r"zuvrs\.streams: zuvrs\.streams\.StreamReader, an asyncio\.StreamReader: True",
            r"zuvrs\.streams: echoed b'line 0\\nline 1\\nline 2\\n'",
            r"asyncio after install\(\): zuvrs\.streams\.StreamReader, an asyncio\.StreamReader: True",
            r"asyncio after install\(\): echoed b'line 0\\nline 1\\nline 2\\n'",
        ],
    ),
    "loop_metrics": (
        [],
        [],
        [
            r"client transport: TransportStats\(bytes_read=65536, bytes_written=65536, .*\)",
            r"turns \d+, callbacks \d+, at least 1,000: True",
            r"bytes through the loop's transports: read 131,072, written 131,072",
            r"lag: p50 [\d.]+ ms, max \d+ ms; at least 50 ms: True",
            r"slowest callback: <Handle handle_report\(\) at \S+loop_metrics\.py:\d+>"
            r" took \d+ ms; at least 50 ms: True",
            r"zuvrs loop: busy \d+% turns .* slowest [\d.]+ms <Handle handle_report\(\) .*",
            r'zuvrs_loop_callbacks_total\{loop="main"\} \d+',
        ],
    ),
    "uvicorn_app": (
        [],
        ["uvicorn"],
        [r"200 / served by zuvrs", r"200 /hello served by zuvrs", r"uvicorn stopped, zuvrs \S+"],
    ),
    "aiohttp_server": (
        [],
        ["aiohttp"],
        [r"200 hello from aiohttp on zuvrs", r"200 \{'reversed': 'srvuz'\}", r"server stopped"],
    ),
    "tls_echo": (
        [],
        ["cryptography"],
        [
            r"connected with TLSv1\.[23], cipher \S+",
            r"server certificate for localhost",
            r"sent and got back 70,000 bytes, equal: True",
            r"server closed",
        ],
    ),
    "subprocess_pipeline": (
        [],
        [],
        [
            r"\s+1 ASYNCIO",
            r"\s+1 LIBUV",
            r"\s+3 LOOP",
            r"\s+2 RUST",
            r"exit codes: \[0, 0, 0\]",
            r"the shell's pipeline gives the same: True exit code 0",
        ],
    ),
    "signals": ([], [], []),  # parametrised below, once per signal
}


def signals_lines(name):
    return [
        rf"serving; sending {name} to myself",
        rf"got {name}: shutting down",
        r"the client got \d+ answers, then the server closed the connection",
        r"stopped cleanly",
    ]


def run_example(name, args, tmp_path, preexec_fn=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run(
        [sys.executable, str(EXAMPLES_DIR / f"{name}.py"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        preexec_fn=preexec_fn,
    )


def check(result, expected):
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert len(lines) == len(expected), result.stdout
    for line, pattern in zip(lines, expected):
        assert re.fullmatch(pattern, line), (pattern, result.stdout)


def test_every_example_is_tested():
    assert sorted(p.stem for p in EXAMPLES_DIR.glob("*.py")) == sorted(EXAMPLES)


@pytest.mark.parametrize("name", [n for n in EXAMPLES if n != "signals"])
def test_example(name, tmp_path):
    args, needs, expected = EXAMPLES[name]
    for module in needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    check(run_example(name, args, tmp_path), expected)


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    "arg, sig_name, preexec_fn",
    [
        ([], "SIGTERM", None),
        (["INT"], "SIGINT", None),
        (["INT"], "SIGINT", _ignore_sigint),  # started as a background job is
    ],
    ids=["TERM", "INT", "INT-ignored-at-start"],
)
def test_signals_example(arg, sig_name, preexec_fn, tmp_path):
    check(run_example("signals", arg, tmp_path, preexec_fn), signals_lines(sig_name))
