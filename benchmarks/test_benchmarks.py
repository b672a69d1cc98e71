"""pytest-codspeed suite: every scheduling, network, datagram, pipe and
process workload on every loop.

    python3 -m pytest benchmarks -q                # plain tests: bodies + parity
    python3 -m pytest benchmarks --codspeed        # timings (pytest-codspeed)

Each benchmark is parametrised by loop (workloads.LOOP_NAMES: asyncio,
uvloop, rloop, rsloop, zuvrs and zuvrs-streams, whose factory installs
zuvrs.streams for the test and the fixture uninstalls it after); a loop
whose package is not importable is skipped, and so is a loop that does not
support a workload (workloads.Unsupported: rloop has no Unix sockets). The
redis workloads are skipped where redis-py, hiredis or redis-server is
missing; readline_echo_load builds its C load generator with the system's
compiler (or falls back to the Python one).
A network workload runs its server and client on the loop under test (the
pipe and UDP workloads both ends too). Sizes are small so that
the plain run takes a few seconds; ZUVRS_BENCH_SCALE=<float> multiplies
them, ZUVRS_BENCH_LOOPS=asyncio,zuvrs restricts the loops. The workload bodies are shared with
compare.py (workloads.py); the
cross-loop comparison in fresh processes is compare.py's job.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402

#: small sizes for CI (the full sizes are workloads.WORKLOADS[...][1])
SIZES = {
    "call_soon": 20_000,
    "call_soon_args": 20_000,
    "timers_cancel": 5_000,
    "timers_fire": 2_000,  # ~0.1 s of waiting regardless of size
    "sleep0_tasks": 10_000,  # two batches of 5,000
    "sleep0_one_task": 5_000,
    "threadsafe": 5_000,
    "task_fanout": 5_000,
    "tcp_echo_streams": 500,
    "tcp_echo_protocol": 500,
    "tcp_bulk": 4,  # MiB
    "unix_echo_streams": 500,
    "short_connections": 64,  # four rounds of 16 concurrent
    "getaddrinfo_numeric": 500,
    "split_writes_one": 500,
    "split_writes_two": 500,
    "tcp_bulk_flow": 4,  # MiB
    "http_keepalive": 160,  # 10 per connection
    "websocket": 96,  # 6 per connection, each size twice
    "tls_echo_streams": 200,
    "tls_bulk": 4,  # MiB
    "tls_handshakes": 32,  # two rounds of 16 concurrent
    "tls_http_keepalive": 160,
    "tls_websocket": 96,
    "udp_echo": 500,
    "unix_dgram_echo": 500,
    "subprocess_spawn": 10,
    "subprocess_pipe_output": 4,  # MiB
    "pipe_roundtrip": 500,
    "readline_echo_load": 1_000,  # 100 connections x 10 lines
    "redis_get_set": 200,
    "redis_pipeline": 1_000,  # 10 pipelines of 100
    "idle_connections": 200,
}
assert set(SIZES) == set(workloads.WORKLOADS), "a workload has no test size"

_SCALE = float(os.environ.get("ZUVRS_BENCH_SCALE", "1") or 1)


def _size(name: str) -> int:
    return max(1, int(SIZES[name] * _SCALE))


#: the module a loop's class must come from (checks the factory is right)
_LOOP_MODULE_PREFIX = {
    "asyncio": "asyncio.",
    "uvloop": "uvloop",
    "rloop": "rloop",
    "rsloop": "rsloop",
    "zuvrs": "zuvrs",
    "zuvrs-streams": "zuvrs",
}


#: ZUVRS_BENCH_LOOPS=asyncio,zuvrs restricts the loops (default: all)
_LOOPS = tuple(
    x.strip() for x in os.environ.get("ZUVRS_BENCH_LOOPS", "").split(",") if x.strip()
) or workloads.LOOP_NAMES


@pytest.fixture(params=_LOOPS)
def loop_name(request: pytest.FixtureRequest) -> Iterator[str]:
    try:
        workloads.get_loop_factory(request.param)
    except workloads.LoopUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield request.param
    finally:
        # zuvrs-streams' factory installs zuvrs.streams: the zuvrs column's
        # tests in this process must get asyncio's streams again
        workloads.release_loop(request.param)


def _check(result: dict, loop_name: str) -> None:
    assert result["ok"], (
        f"{result['workload']} on {loop_name}: parity {result['parity']} != "
        f"expected {result['expected']}; loop errors: {result['loop_errors']}"
    )
    assert result["loop_type"].startswith(_LOOP_MODULE_PREFIX[loop_name]), (
        f"{loop_name} factory made a {result['loop_type']}"
    )
    if result["workload"] in workloads.VALUE_WORKLOADS:
        # in a process that has run other workloads the RSS may not grow
        assert isinstance(result["value"], float), result


#: (loop, workload) -> why it is expected to fail; such a failure is an
#: xfail (not strict: a fixed loop simply passes). rloop 0.5 never delivers
#: the peer's close: a server does not see its client's EOF, a client does
#: not see the server's close (short_connections also loses the reply). Its
#: close() leaves the socket open: the socket is closed when the transport
#: is freed, which its maps' deferred reclamation does only in batches (see
#: workloads._note_unclosed).
_RLOOP_NO_EOF = ("rloop does not deliver the peer's close (EOF): its close() "
                 "leaves the socket open (closed only when the transport is freed)")
KNOWN_FAILURES = {
    ("rloop", w): _RLOOP_NO_EOF
    for w in ("tcp_echo_streams", "tcp_echo_protocol", "tcp_bulk",
              "short_connections", "split_writes_one", "split_writes_two",
              "tcp_bulk_flow", "http_keepalive", "idle_connections")
}
#: rsloop 0.1.66 as it ships
_RSLOOP_NO_SSL_OBJECT = ("rsloop's TLS transports give no ssl_object: the TLS "
                         "version and verified peer certificate cannot be checked")
KNOWN_FAILURES.update({
    ("rsloop", w): _RSLOOP_NO_SSL_OBJECT
    for w in ("tls_echo_streams", "tls_bulk", "tls_handshakes",
              "tls_http_keepalive", "tls_websocket")
})
KNOWN_FAILURES[("rsloop", "pipe_roundtrip")] = (
    "rsloop: closing a write pipe transport does not deliver EOF to its "
    "read end")


@pytest.fixture(autouse=True)
def _fast_network_guards(monkeypatch) -> None:
    """Shorter stall / close waits than compare.py's, so that a known
    failure costs well under a second or two here; no untimed prelude
    connection (the benchmark fixture repeats a body in one process, which
    gets past the transients the prelude is for)."""
    monkeypatch.setattr(workloads, "STALL_S", 1.0)
    monkeypatch.setattr(workloads, "CLOSE_WAIT_S", 0.25)
    monkeypatch.setattr(workloads, "NETWORK_PRELUDE", False)


def _bench(benchmark, name: str, loop_name: str) -> None:
    factory = workloads.get_loop_factory(loop_name)
    fn = workloads.WORKLOADS[name][0]
    known = KNOWN_FAILURES.get((loop_name, name))
    if known:
        # run it once unmeasured: a known failure must not be recorded as
        # a benchmark timing; a fixed loop goes on to be measured
        result = fn(factory, _size(name))
        if not result["ok"]:
            info = {k: v for k, v in result.get("info", {}).items()
                    if "socket" not in k}
            pytest.xfail(f"{known}: parity {result['parity']}, info {info}")
    try:
        result = benchmark(fn, factory, _size(name))
    except workloads.Unsupported as exc:
        pytest.skip(str(exc))
    _check(result, loop_name)


@pytest.mark.benchmark
def test_call_soon(benchmark, loop_name: str) -> None:
    _bench(benchmark, "call_soon", loop_name)


@pytest.mark.benchmark
def test_call_soon_args(benchmark, loop_name: str) -> None:
    _bench(benchmark, "call_soon_args", loop_name)


@pytest.mark.benchmark
def test_timers_cancel(benchmark, loop_name: str) -> None:
    _bench(benchmark, "timers_cancel", loop_name)


@pytest.mark.benchmark
def test_timers_fire(benchmark, loop_name: str) -> None:
    _bench(benchmark, "timers_fire", loop_name)


@pytest.mark.benchmark
def test_sleep0_tasks(benchmark, loop_name: str) -> None:
    _bench(benchmark, "sleep0_tasks", loop_name)


@pytest.mark.benchmark
def test_sleep0_one_task(benchmark, loop_name: str) -> None:
    _bench(benchmark, "sleep0_one_task", loop_name)


@pytest.mark.benchmark
def test_threadsafe(benchmark, loop_name: str) -> None:
    _bench(benchmark, "threadsafe", loop_name)


@pytest.mark.benchmark
def test_task_fanout(benchmark, loop_name: str) -> None:
    _bench(benchmark, "task_fanout", loop_name)


@pytest.mark.benchmark
def test_tcp_echo_streams(benchmark, loop_name: str) -> None:
    _bench(benchmark, "tcp_echo_streams", loop_name)


@pytest.mark.benchmark
def test_tcp_echo_protocol(benchmark, loop_name: str) -> None:
    _bench(benchmark, "tcp_echo_protocol", loop_name)


@pytest.mark.benchmark
def test_tcp_bulk(benchmark, loop_name: str) -> None:
    _bench(benchmark, "tcp_bulk", loop_name)


@pytest.mark.benchmark
def test_unix_echo_streams(benchmark, loop_name: str) -> None:
    _bench(benchmark, "unix_echo_streams", loop_name)


@pytest.mark.benchmark
def test_short_connections(benchmark, loop_name: str) -> None:
    _bench(benchmark, "short_connections", loop_name)


@pytest.mark.benchmark
def test_getaddrinfo_numeric(benchmark, loop_name: str) -> None:
    _bench(benchmark, "getaddrinfo_numeric", loop_name)


@pytest.mark.benchmark
def test_split_writes_one(benchmark, loop_name: str) -> None:
    _bench(benchmark, "split_writes_one", loop_name)


@pytest.mark.benchmark
def test_split_writes_two(benchmark, loop_name: str) -> None:
    _bench(benchmark, "split_writes_two", loop_name)


@pytest.mark.benchmark
def test_tcp_bulk_flow(benchmark, loop_name: str) -> None:
    _bench(benchmark, "tcp_bulk_flow", loop_name)


@pytest.mark.benchmark
def test_http_keepalive(benchmark, loop_name: str) -> None:
    _bench(benchmark, "http_keepalive", loop_name)


@pytest.mark.benchmark
def test_websocket(benchmark, loop_name: str) -> None:
    pytest.importorskip("websockets.asyncio.client")
    _bench(benchmark, "websocket", loop_name)


# TLS 1.3 (rloop has no TLS: unsupported, skipped)


@pytest.mark.benchmark
def test_tls_echo_streams(benchmark, loop_name: str) -> None:
    _bench(benchmark, "tls_echo_streams", loop_name)


@pytest.mark.benchmark
def test_tls_bulk(benchmark, loop_name: str) -> None:
    _bench(benchmark, "tls_bulk", loop_name)


@pytest.mark.benchmark
def test_tls_handshakes(benchmark, loop_name: str) -> None:
    _bench(benchmark, "tls_handshakes", loop_name)


@pytest.mark.benchmark
def test_tls_http_keepalive(benchmark, loop_name: str) -> None:
    _bench(benchmark, "tls_http_keepalive", loop_name)


@pytest.mark.benchmark
def test_tls_websocket(benchmark, loop_name: str) -> None:
    pytest.importorskip("websockets.asyncio.client")
    _bench(benchmark, "tls_websocket", loop_name)


@pytest.mark.benchmark
def test_udp_echo(benchmark, loop_name: str) -> None:
    _bench(benchmark, "udp_echo", loop_name)


@pytest.mark.benchmark
def test_unix_dgram_echo(benchmark, loop_name: str) -> None:
    _bench(benchmark, "unix_dgram_echo", loop_name)


@pytest.mark.benchmark
def test_subprocess_spawn(benchmark, loop_name: str) -> None:
    _bench(benchmark, "subprocess_spawn", loop_name)


@pytest.mark.benchmark
def test_subprocess_pipe_output(benchmark, loop_name: str) -> None:
    _bench(benchmark, "subprocess_pipe_output", loop_name)


@pytest.mark.benchmark
def test_pipe_roundtrip(benchmark, loop_name: str) -> None:
    _bench(benchmark, "pipe_roundtrip", loop_name)


@pytest.mark.benchmark
def test_readline_echo_load(benchmark, loop_name: str) -> None:
    _bench(benchmark, "readline_echo_load", loop_name)


def _need_redis() -> None:
    pytest.importorskip("redis")
    pytest.importorskip("hiredis")
    if workloads.redis_server_path() is None:
        pytest.skip("redis-server not installed (tools/setup.sh installs Debian's)")


@pytest.mark.benchmark
def test_redis_get_set(benchmark, loop_name: str) -> None:
    _need_redis()
    _bench(benchmark, "redis_get_set", loop_name)


@pytest.mark.benchmark
def test_redis_pipeline(benchmark, loop_name: str) -> None:
    _need_redis()
    _bench(benchmark, "redis_pipeline", loop_name)


@pytest.mark.benchmark
def test_idle_connections(benchmark, loop_name: str) -> None:
    _bench(benchmark, "idle_connections", loop_name)


def test_every_workload_has_a_benchmark() -> None:
    names = {n[len("test_"):] for n in globals() if n.startswith("test_")}
    missing = set(workloads.WORKLOADS) - names
    assert not missing, f"workloads without a codspeed benchmark: {missing}"


@pytest.mark.parametrize(
    "name", ["call_soon", "call_soon_args", "timers_fire", "threadsafe"])
def test_parity_catches_lost_callbacks(name: str, monkeypatch) -> None:
    """The parity check must fail when work is lost: a stdlib loop whose
    call_soon / call_later / call_soon_threadsafe silently replace every
    other benchmark callback by a no-op. (In the task workloads, lost work
    means a task that never finishes: a hang, which compare.py reports as a
    timeout; timers_cancel counts fired timers, and cancelled() flags.)"""
    import asyncio

    monkeypatch.setattr(workloads, "GUARD_BASE_S", 0.5)

    def noop(*args: object) -> None:
        pass

    class Lossy(asyncio.SelectorEventLoop):  # type: ignore[misc, valid-type]
        _n = 0

        def _maybe_drop(self, cb):  # type: ignore[no-untyped-def]
            # the benchmark callbacks are all named "cb"
            if getattr(cb, "__name__", "") == "cb":
                self._n += 1
                if self._n % 2 == 0:
                    return noop
            return cb

        def call_soon(self, cb, *args, context=None):  # type: ignore[override]
            return super().call_soon(self._maybe_drop(cb), *args, context=context)

        def call_later(self, delay, cb, *args, context=None):  # type: ignore[override]
            return super().call_later(delay, self._maybe_drop(cb), *args,
                                      context=context)

        def call_soon_threadsafe(self, cb, *args, context=None):  # type: ignore[override]
            return super().call_soon_threadsafe(self._maybe_drop(cb), *args,
                                                context=context)

    result = workloads.WORKLOADS[name][0](Lossy, 200)
    assert not result["ok"], f"{name}: parity did not catch lost callbacks"


def test_order_check_catches_misordered_timers() -> None:
    """timers_fire's order check must fail on a loop that fires timers in
    the wrong order (here: delays reversed), although every timer fires."""
    import asyncio

    class Reversed(asyncio.SelectorEventLoop):  # type: ignore[misc, valid-type]
        def call_later(self, delay, cb, *args, context=None):  # type: ignore[override]
            if getattr(cb, "__name__", "") == "cb":
                delay = 0.102 - delay
            return super().call_later(delay, cb, *args, context=context)

    result = workloads.timers_fire(Reversed, 300)
    assert result["parity"]["fired"] == 300
    assert result["parity"]["order_ok"] is False
    assert not result["ok"]


# ---- the network parity checks must catch wrong data --------------------


class _FakeTransport:
    def __init__(self) -> None:
        self.written: list = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


class _Done:
    def __init__(self) -> None:
        self.result = False

    def done(self) -> bool:
        return self.result

    def set_result(self, _: object) -> None:
        self.result = True


def test_bulk_receiver_catches_lost_and_repeated_bytes() -> None:
    """BulkReceiverProtocol's sampled pattern check flags a piece that
    arrives after a lost piece or twice, and passes the intact stream."""
    chunk = bytes(range(workloads.BULK_PERIOD)) * 1024
    pieces = [chunk[i:i + 10_000] for i in range(0, 100_000, 10_000)]

    def feed(seq: list) -> "workloads.BulkReceiverProtocol":
        r = workloads.BulkReceiverProtocol(_Done(), {})
        for p in seq:
            r.data_received(p)
        return r

    ok = feed(pieces)
    assert ok.mismatches == 0 and ok.pos == 100_000
    assert feed(pieces[:3] + pieces[4:]).mismatches > 0  # one lost
    assert feed(pieces[:4] + pieces[3:]).mismatches > 0  # one repeated


def test_echo_client_catches_corrupted_echo() -> None:
    """EchoClientProtocol counts an echo that differs from what it sent
    (one flipped byte) as a non-match and the checksum changes."""
    payloads = workloads._echo_payloads()
    info: dict = {}

    def run(corrupt_at: int) -> "workloads.EchoClientProtocol":
        c = workloads.EchoClientProtocol(4, payloads, _Done(), info)
        tr = _FakeTransport()
        c.connection_made(tr)
        for t in range(4):
            data = bytearray(tr.written[t])
            if t == corrupt_at:
                data[100] ^= 1
            c.data_received(bytes(data[:300]))  # in two pieces
            c.data_received(bytes(data[300:]))
        return c

    good, bad = run(-1), run(2)
    assert good.t == bad.t == 4
    assert good.matches == 4 and bad.matches == 3
    assert good.crc != bad.crc


def test_split_client_catches_wrong_sequence_number() -> None:
    """SplitClientProtocol rejects a response whose X-Seq is not the
    request's, or whose body differs."""
    c = workloads.SplitClientProtocol(3, _Done())
    c.connection_made(_FakeTransport())
    head = workloads._SPLIT_HEAD_PREFIX
    suffix = workloads._SPLIT_HEAD_SUFFIX
    body = workloads.SPLIT_BODY
    c.data_received(head + b"%010d" % 0 + suffix + body)  # right
    c.data_received(head + b"%010d" % 7 + suffix + body)  # wrong seq
    c.data_received(head + b"%010d" % 2 + suffix + body[:-1] + b"?")  # body
    assert c.t == 3 and c.ok == 1


def test_stalled_exchange_is_reported_not_hung(monkeypatch) -> None:
    """A loop that never delivers the server's data (here: a transport
    whose writes are dropped) makes tcp_echo_protocol report a parity
    mismatch via the watchdog instead of hanging."""
    import asyncio

    monkeypatch.setattr(workloads, "STALL_S", 0.5)

    class Deaf(asyncio.SelectorEventLoop):  # type: ignore[misc, valid-type]
        def _make_socket_transport(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            tr = super()._make_socket_transport(*args, **kwargs)
            if kwargs.get("server") is not None:  # the server side
                tr.write = lambda data: None
            return tr

    result = workloads.tcp_echo_protocol(Deaf, 50)
    assert not result["ok"]
    assert result["parity"]["round_trips"] == 0
    assert "guard" in result["info"]


def test_flow_receiver_catches_lost_and_repeated_bytes() -> None:
    """tcp_bulk_flow's receiver (the pattern restarting every 256 KiB)
    flags a piece after a lost piece or a repeated one, and passes the
    intact stream, across chunk boundaries."""
    chunk = bytes(i % workloads.BULK_PERIOD for i in range(workloads.FLOW_CHUNK))
    stream = chunk * 3
    pieces = [stream[i:i + 70_000] for i in range(0, len(stream), 70_000)]

    def feed(seq: list) -> "workloads.BulkReceiverProtocol":
        r = workloads.FlowBulkReceiverProtocol(_Done(), {})
        for p in seq:
            r.data_received(p)
        return r

    ok = feed(pieces)
    assert ok.mismatches == 0 and ok.pos == len(stream)
    assert feed(pieces[:3] + pieces[4:]).mismatches > 0  # one lost
    assert feed(pieces[:4] + pieces[3:]).mismatches > 0  # one repeated


def test_http_client_catches_skipped_work(monkeypatch) -> None:
    """http_keepalive's client checks X-Digest: a server that skips its
    SHA-256 work for one response (a wrong digest) fails the parity."""
    import asyncio

    real = workloads._digest8
    calls = [0]

    def digest8(body: bytes) -> bytes:
        calls[0] += 1
        # the client's 64 digests come first; then the server's, one per request
        return b"0" * 64 if calls[0] == 64 + 5 else real(body)

    monkeypatch.setattr(workloads, "_digest8", digest8)
    result = workloads.http_keepalive(asyncio.new_event_loop, 32)
    assert result["parity"]["responses"] == 32
    assert result["parity"]["verified"] == 31
    assert not result["ok"]


def test_tls_client_verifies_host_name() -> None:
    """The TLS workloads' client context verifies the server's chain and
    host name: asking the benchmark server for another name fails the
    handshake; asking for "localhost" succeeds with TLS 1.3."""
    import asyncio
    import ssl

    async def main(name: str) -> str:
        skw, ckw = workloads._tls_kwargs()
        server = await asyncio.start_server(lambda r, w: w.close(),
                                            workloads.HOST, 0, **skw)
        port = server.sockets[0].getsockname()[1]
        try:
            _, w = await asyncio.open_connection(
                workloads.HOST, port, ssl=ckw["ssl"], server_hostname=name)
            version = w.get_extra_info("ssl_object").version()
            w.close()
            return version
        finally:
            server.close()

    assert asyncio.run(main("localhost")) == "TLSv1.3"
    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(main("other.example"))


@pytest.mark.parametrize("variant", ["memory_bios", "tcp"])
def test_tls_bulk_floor_moves_every_byte(variant: str) -> None:
    """floors.py's TLS bulk floor encrypts, carries and decrypts the whole
    size (it raises on a short read) and reports a positive time."""
    import floors

    assert floors.floor_tls_bulk(variant, 2) > 0


def test_tls_echo_floor_round_trips() -> None:
    import floors

    assert floors.floor_tls_echo("memory_bios", 50) > 0


def test_tls_ceiling_counts_openssl_beyond_the_baseline(monkeypatch) -> None:
    """tls_ceiling.py's CPU seconds are the full run's samples minus the
    baseline run's, in all and in libssl + libcrypto only (not _ssl or
    _hashlib, whose own code is the interpreter's side)."""
    import own_share
    import tls_ceiling

    runs = {100: {"libcrypto.so.3": 4000, "libssl.so.3": 400, "_ssl.cpython-311.so": 40, "[kernel.kallsyms]": 1600},
            2: {"libcrypto.so.3": 400, "libssl.so.3": 0, "_ssl.cpython-311.so": 0, "[kernel.kallsyms]": 400}}
    monkeypatch.setattr(own_share, "dso_samples", lambda python, loop, workload, size, freq: runs[size])
    got = tls_ceiling.extra_cpu("python", "zuvrs", "tls_bulk", 100, 1000)
    assert got == {"total": (6040 - 800) / 1000, "openssl": (4400 - 400) / 1000}


# ---- datagram, pipe and process parity checks ---------------------------


def test_lost_datagram_is_reported_not_hung(monkeypatch) -> None:
    """udp_echo on a loop whose server endpoint silently drops its 5th
    reply: the watchdog ends the exchange after STALL_S and the parity
    says how far it got (4 round trips), instead of hanging."""
    import asyncio

    monkeypatch.setattr(workloads, "STALL_S", 0.5)

    class Lossy(asyncio.SelectorEventLoop):  # type: ignore[misc, valid-type]
        def _make_datagram_transport(self, sock, protocol, address=None,  # type: ignore[no-untyped-def, override]
                                     waiter=None, extra=None):
            tr = super()._make_datagram_transport(sock, protocol, address,
                                                  waiter, extra)
            if address is None:  # the server (the client is connected)
                sendto = tr.sendto
                sent = [0]

                def lossy_sendto(data, addr=None):  # type: ignore[no-untyped-def]
                    sent[0] += 1
                    if sent[0] != 5:
                        sendto(data, addr)

                tr.sendto = lossy_sendto
            return tr

    result = workloads.udp_echo(Lossy, 50)
    assert not result["ok"]
    assert result["parity"]["round_trips"] == 4
    assert result["parity"]["server_datagrams"] == 5
    assert "guard" in result["info"]


def test_udp_client_catches_corrupted_echo() -> None:
    """UdpEchoClientProtocol counts an echo that differs from what was sent
    (one flipped byte) as a non-match, and the checksum changes."""
    payloads = workloads._echo_payloads(workloads.DGRAM_SIZE)

    class Tr(_FakeTransport):
        def sendto(self, data: bytes, addr: object = None) -> None:
            self.written.append(bytes(data))

    def run(corrupt_at: int) -> "workloads.UdpEchoClientProtocol":
        st = {"errors": 0}
        c = workloads.UdpEchoClientProtocol(4, payloads, _Done(), _Done(), st, {})
        tr = Tr()
        c.connection_made(tr)
        for t in range(4):
            data = bytearray(tr.written[t])
            if t == corrupt_at:
                data[100] ^= 1
            c.datagram_received(bytes(data), ("127.0.0.1", 1))
        c.datagram_received(tr.written[-1], ("127.0.0.1", 1))  # a duplicate
        return c

    good, bad = run(-1), run(2)
    assert good.t == bad.t == 4
    assert good.matches == 4 and bad.matches == 3
    assert good.crc != bad.crc
    assert good.unexpected == 1


def test_pipe_client_catches_corrupted_echo() -> None:
    """PipeClientProtocol reassembles a message read in two pieces, counts
    a corrupted echo as a non-match, and closes its write end at the end."""
    payloads = workloads._echo_payloads(workloads.DGRAM_SIZE)

    def run(corrupt_at: int) -> "tuple[workloads.PipeClientProtocol, _FakeTransport]":
        c = workloads.PipeClientProtocol(4, payloads, _Done(), _Done(), {})
        out = _FakeTransport()
        c.out = out
        c.connection_made(_FakeTransport())
        for t in range(4):
            data = bytearray(out.written[t])
            if t == corrupt_at:
                data[7] ^= 1
            c.data_received(bytes(data[:100]))
            c.data_received(bytes(data[100:]))
        return c, out

    (good, gout), (bad, _) = run(-1), run(1)
    assert good.t == bad.t == 4
    assert good.matches == 4 and bad.matches == 3
    assert good.crc != bad.crc
    assert gout.closed and len(gout.written) == 4


def test_failed_child_is_a_parity_failure(monkeypatch) -> None:
    """subprocess_spawn checks return codes: /bin/false fails the parity."""
    import asyncio

    false = "/bin/false" if os.path.exists("/bin/false") else "false"
    monkeypatch.setattr(workloads, "TRUE_PATH", false)
    result = workloads.subprocess_spawn(asyncio.new_event_loop, 3)
    assert not result["ok"]
    assert result["parity"]["exited"] == 3
    assert result["parity"]["returncode_0"] == 0


def test_unreaped_child_is_counted() -> None:
    """subprocess_spawn's after-check finds an exited child nobody reaped."""
    import subprocess
    import time

    assert workloads._reap_leftovers() == 0
    p = subprocess.Popen([workloads.TRUE_PATH])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until it has exited (not reaped)
        r = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if r is not None:
            break
        time.sleep(0.01)
    assert workloads._reap_leftovers() == 1
    p.returncode = 0  # reaped above; keep Popen from waiting for it


def test_pipe_output_catches_shifted_bytes(monkeypatch) -> None:
    """subprocess_pipe_output samples the pattern: a child that writes the
    right number of bytes, but one chunk rotated by one byte, fails."""
    import asyncio

    monkeypatch.setattr(workloads, "NETWORK_PRELUDE", False)
    monkeypatch.setattr(
        workloads, "PIPE_OUTPUT_CHILD",
        workloads.PIPE_OUTPUT_CHILD.replace(
            "for _ in range(full):\n    out(c)\n",
            "for i in range(full):\n    out(c if i != 2 else c[1:] + c[:1])\n"))
    result = workloads.subprocess_pipe_output(asyncio.new_event_loop, 2)
    assert result["parity"]["received"] == 2 * workloads.MIB
    assert result["parity"]["sampled_mismatches"] > 0
    assert not result["ok"]


def test_prelude(loop_name: str, monkeypatch) -> None:
    """The untimed prelude connection of the network workloads works (on a
    loop where it fails, compare.py's sample goes on and says so)."""
    monkeypatch.setattr(workloads, "NETWORK_PRELUDE", True)
    res = workloads._prelude(workloads.get_loop_factory(loop_name))
    if loop_name == "rloop" and res != "ok":
        pytest.xfail(f"{_RLOOP_NO_EOF}: prelude {res}")
    assert res == "ok"


def test_own_share_reads_ratios_and_groups_objects(tmp_path) -> None:
    """own_share.py's ceilings come from a compare.py report's <loop>/uvloop
    columns; a misread column would print a wrong ceiling."""
    import own_share

    report = tmp_path / "compare.md"
    report.write_text(
        "# report\n\n## Summary: median throughput\n\n"
        "| workload | size | asyncio | uvloop | zuvrs | zuvrs/uvloop | zuvrs/asyncio"
        " | zuvrs-streams/uvloop |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|\n"
        "| udp_echo | 20,000 | 54.7k | 66.1k | 87.6k | 1.33x | 1.60x | 1.35x |\n"
        "| tcp_bulk | 1,024 MiB | 2.2k | 3.1k | 5.7k | 1.82x ~ | 2.56x | 1.70x ~ |\n"
        "| unix_dgram_echo | 20,000 | 59.5k | **unsupported x5** | 106.1k | n/a | 1.78x | n/a |\n"
        "\n## Ratio over uvloop\n\n| workload | asyncio | zuvrs |\n|---|---:|---:|\n"
        "| udp_echo | 0.83x | 9.99x |\n")
    assert own_share.read_ratios(str(report)) == {
        "zuvrs": {"udp_echo": 1.33, "tcp_bulk": 1.82},
        "zuvrs-streams": {"udp_echo": 1.35, "tcp_bulk": 1.70},
    }
    assert own_share._group("_zuvrs.cpython-311-x86_64-linux-gnu.so", "zuvrs") == "own"
    assert own_share._group("loop.cpython-311-x86_64-linux-gnu.so", "uvloop") == "own"
    assert own_share._group("loop.cpython-311-x86_64-linux-gnu.so", "zuvrs") == "other"
    assert own_share._group("[kernel.kallsyms]", "zuvrs") == "kernel"
    assert own_share._group("libpython3.11.so.1.0", "uvloop") == "python"


def test_sample_times_gc_pauses(loop_name, capsys) -> None:
    """_sample.py --gc-time (compare.py --gc-time) reports the GC's pauses
    and the collections of each generation made during the workload; a
    forced collection inside it must show up in both."""
    import gc

    import _sample

    callbacks = list(gc.callbacks)
    original = workloads.run_workload

    def run_with_a_collection(*args, **kwargs):
        gc.collect()
        return original(*args, **kwargs)

    workloads.run_workload = run_with_a_collection
    try:
        rc = _sample.main(["--loop", loop_name, "--workload", "call_soon", "--size", "1000", "--gc-time"])
    finally:
        workloads.run_workload = original
    assert rc == 0
    line = [l for l in capsys.readouterr().out.splitlines() if l.startswith(_sample.MARKER)][-1]
    out = json.loads(line[len(_sample.MARKER):])
    assert len(out["gc_seconds"]) == 3 and out["gc_seconds"][2] > 0
    assert out["gc_collections_during"][2] >= 1
    assert gc.callbacks == callbacks


# ---- streams as claimed, the load generator, the memory row, compare.py ----


def test_stream_classes_are_checked(monkeypatch) -> None:
    """A factory that claims zuvrs's native streams but makes a zuvrs loop
    without zuvrs.streams.install() fails its sample (parity
    streams_as_claimed), and says which classes it got; the zuvrs-streams
    factory gets the native ones on both ends; release_loop() gives
    asyncio's functions back."""
    import asyncio

    try:
        zuvrs_factory = workloads.get_loop_factory("zuvrs")
        native = workloads.get_loop_factory("zuvrs-streams")
    except workloads.LoopUnavailable as exc:
        pytest.skip(str(exc))
    original = asyncio.open_connection
    monkeypatch.setattr(zuvrs_factory, "stream_readers",
                        workloads.STREAM_READERS["zuvrs-streams"])
    wrong = workloads.tcp_echo_streams(zuvrs_factory, 20)
    assert wrong["parity"]["streams_as_claimed"] is False and not wrong["ok"]
    assert "asyncio.streams.StreamReader" in wrong["info"]["streams_not_as_claimed"]
    try:
        right = workloads.unix_echo_streams(native, 20)
    finally:
        workloads.release_loop("zuvrs-streams")
    assert right["ok"] and right["parity"]["streams_as_claimed"] is True
    assert right["info"]["stream_readers"] == (
        "client zuvrs.streams.StreamReader; server zuvrs.streams.StreamReader")
    assert asyncio.open_connection is original


def test_unclosed_socket_is_named(monkeypatch) -> None:
    """A loop whose transport close() leaves the socket open (rloop 0.5)
    fails tcp_bulk with the reason in info: the sender's socket is still
    open in the process."""
    import asyncio
    import socket

    monkeypatch.setattr(workloads, "STALL_S", 0.5)
    kept: list = []

    class Unclosable(socket.socket):
        def close(self) -> None:
            kept.append(self)

    class KeepsSocket(asyncio.SelectorEventLoop):  # type: ignore[misc, valid-type]
        def _make_socket_transport(self, sock, *args, **kwargs):  # type: ignore[no-untyped-def]
            if kwargs.get("server") is None:  # the client side
                sock = Unclosable(sock.family, sock.type, sock.proto, sock.detach())
            return super()._make_socket_transport(sock, *args, **kwargs)

    try:
        result = workloads.tcp_bulk(KeepsSocket, 1)
    finally:
        for s in kept:
            socket.socket.close(s)
    assert not result["ok"]
    assert result["parity"]["receiver_saw_eof"] is False
    assert "still open" in result["info"]["close_not_done"]


def test_loadgen_checks_every_echo() -> None:
    """The load generator (C where a compiler exists, and the Python one)
    verifies and checksums every echo: against an echo server that flips
    one byte of one line, one line fails to match and the checksum moves;
    against a correct one, all match and the checksum is _loadgen's
    expected one (the C CRC-32 is zlib's)."""
    import asyncio
    import threading

    import _loadgen

    def serve(corrupt: bool) -> "tuple[int, threading.Thread, list]":
        started = threading.Event()
        port: list = []

        def run() -> None:
            async def main() -> None:
                n = [0]

                async def handle(reader, writer):  # type: ignore[no-untyped-def]
                    while line := await reader.readline():
                        n[0] += 1
                        if corrupt and n[0] == 7:
                            line = b"?" + line[1:]
                        writer.write(line)
                    writer.close()

                server = await asyncio.start_server(handle, workloads.HOST, 0)
                port.append(server.sockets[0].getsockname()[1])
                started.set()
                await asyncio.sleep(10)
                server.close()

            try:
                asyncio.run(main())
            except BaseException:
                pass

        t = threading.Thread(target=run, daemon=True)
        t.start()
        started.wait(10)
        return port[0], t, port

    exp = _loadgen.expected(4, 5)
    binary = _loadgen.build()
    clients = [("python", lambda p: _loadgen.run_client(p, 4, 5, 10))]
    if binary is not None:
        clients.append(("c", lambda p: _loadgen.run_c_client(binary, p, 4, 5, 10)))
    for name, run_client in clients:
        port, _, _ = serve(corrupt=False)
        good = run_client(port)
        assert (good["lines"], good["matches"], good["checksum"]) == (20, 20, exp["checksum"]), name
        port, _, _ = serve(corrupt=True)
        bad = run_client(port)
        assert bad["lines"] == 20 and bad["matches"] == 19, (name, bad)
        assert bad["checksum"] != exp["checksum"], name


def test_loadgen_capacity_runs() -> None:
    """_loadgen.py --capacity (the C client against the C echo server)
    echoes and verifies every line."""
    import _loadgen

    if _loadgen.build() is None:
        pytest.skip("no C compiler")
    res = _loadgen.capacity(8, 20, None, None, python_client=False)
    assert res["lines"] == res["matches"] == 160
    assert res["checksum"] == res["expected"]["checksum"]
    assert res["lines_per_s"] > 0


def test_idle_connections_restores_nofile() -> None:
    """idle_connections raises RLIMIT_NOFILE when it needs more and puts the
    limit back; its value is the RSS growth per pair."""
    import asyncio
    import resource

    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(before[0], 256) if before[0] != resource.RLIM_INFINITY else 256
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, before[1]))
    try:
        res = workloads.idle_connections(asyncio.new_event_loop, 200)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (low, before[1])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)
    assert res["ok"], res["parity"]
    assert "raised from" in res["info"]["rlimit_nofile"]
    assert isinstance(res["value"], float)


def test_compare_reports_new_loops_and_values(tmp_path) -> None:
    """compare.py end to end on one small sample each: zuvrs-streams gets
    its ratio columns, the memory row is shown as KiB per pair (lower is
    better), ratios over uvloop carry their spread, and the provenance says
    what the zuvrs-streams column is."""
    import subprocess

    loops = ["asyncio", "zuvrs", "zuvrs-streams"]
    for l in loops:
        try:
            workloads.get_loop_factory(l)
        except workloads.LoopUnavailable as exc:
            pytest.skip(str(exc))
        finally:
            workloads.release_loop(l)
    try:
        workloads.get_loop_factory("uvloop")
        loops.insert(1, "uvloop")
    except workloads.LoopUnavailable:
        pass
    out = tmp_path / "run.md"
    r = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(__file__), "compare.py"),
         "--loops", ",".join(loops), "--workloads", "tcp_echo_streams,idle_connections",
         "--samples", "1", "--warmups", "0", "--size", "tcp_echo_streams=200",
         "--size", "idle_connections=100", "--markdown", str(out)],
        capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    md = out.read_text()
    assert "| zuvrs-streams/zuvrs |" in md
    assert "zuvrs-streams/uvloop" in md or "uvloop" not in loops
    assert "KiB/pair, *lower is better*" in md
    assert "median KiB/pair" in md
    assert "zuvrs.streams.install()" in md
    assert "client zuvrs.streams.StreamReader; server zuvrs.streams.StreamReader" in md
    if "uvloop" in loops:
        assert "idle_connections (lower is better)" in md
        assert " [" in md.split("## Ratio over uvloop")[1].split("##")[0]


def test_paired_ratio_pairs_within_rounds() -> None:
    """pairing.py: the median of per-round ratios, over the rounds where
    both loops have a figure, with a seeded bootstrap interval around it;
    fewer than two pairs give nothing."""
    import pairing

    a = [110.0, 240.0, None, 99.0, 55.0]
    b = [100.0, 200.0, 300.0, 100.0, None]
    m, lo, hi = pairing.paired_ratio(a, b)
    assert m == pytest.approx(1.10)  # the median of 1.10, 1.20 and 0.99
    assert 0.99 <= lo <= m <= hi <= 1.20
    assert pairing.paired_ratio(a, b) == (m, lo, hi)
    assert pairing.paired_ratio([1.0, None], [1.0, 2.0]) is None
    assert pairing.fmt_paired((1.0, 0.95, 1.1), 2) == "1.00 [0.95-1.10]" and pairing.fmt_paired(None) == ""


def test_compare_paired_table_reads_rounds_in_order() -> None:
    """compare.py's paired table: each loop's i-th sample is round i's; a
    failed sample drops only its round; a loop with too few pairs says
    n/a."""
    import compare

    def ok(ops: float) -> dict:
        return {"ok": True, "ops": ops, "elapsed": 1.0}

    res = {"tcp_echo_streams": {"samples": {
        "uvloop": [ok(100), ok(200), ok(100)],
        "zuvrs": [ok(150), ok(300), {"ok": False}],
        "asyncio": [ok(50), {"ok": False}, {"ok": False}],
    }}}
    lines = compare.paired_table(res, ["asyncio", "zuvrs", "rsloop"], {"rsloop": "not installed"})
    row = next(line for line in lines if line.startswith("| tcp_echo_streams"))
    assert row == "| tcp_echo_streams | n/a | 1.50 [1.50-1.50] | n/a |"


def test_cpu_cost_subtracts_the_base(capsys) -> None:
    """cpu_cost.py's cost per operation is the median CPU at the size minus
    the median at the base size, over the extra operations; a failed sample
    is counted and flagged; the script runs end to end."""
    import cpu_cost

    out = {"zuvrs": {"size": [(1.0, 2.0), (1.2, 2.2), (5.0, 9.0)],
                     "base": [(0.1, 0.2), (0.1, 0.2), (0.3, 0.4)],
                     "bad": 1, "rates": [10.0, 30.0]}}
    row = cpu_cost.summarise(out, 1001, 1)["zuvrs"]
    assert row["user"] == pytest.approx((1.2 - 0.1) / 1000)
    assert row["system"] == pytest.approx((2.2 - 0.2) / 1000)
    assert row["bad"] == 1 and row["n"] == 3 and row["rate"] == 20.0
    assert cpu_cost.main(["--loops", "asyncio", "--workload", "call_soon",
                          "--size", "20000", "--base", "1000", "--samples", "1"]) == 0
    assert "| asyncio |" in capsys.readouterr().out


def test_peer_cpu_modes(monkeypatch) -> None:
    """ZUVRS_BENCH_PEER_CPU places the peer process: on another CPU than the
    loop (default), on the same one, or nowhere in particular; anything
    else is refused."""
    avail = sorted(os.sched_getaffinity(0))
    monkeypatch.delenv("ZUVRS_BENCH_PEER_CPU", raising=False)
    _, own, peer = workloads._cpu_pair()
    if len(avail) >= 2:
        assert own == avail[0] and peer == avail[1]
    monkeypatch.setenv("ZUVRS_BENCH_PEER_CPU", "same")
    _, own, peer = workloads._cpu_pair()
    assert own == peer == avail[0]
    monkeypatch.setenv("ZUVRS_BENCH_PEER_CPU", "none")
    assert workloads._cpu_pair()[1:] == (None, None)
    monkeypatch.setenv("ZUVRS_BENCH_PEER_CPU", "elsewhere")
    with pytest.raises(ValueError):
        workloads._cpu_pair()


def test_zuvrs_base_needs_its_directory(monkeypatch, tmp_path) -> None:
    """zuvrs-base (another commit's build, for before/after runs) is
    unavailable, not silently the installed zuvrs, when ZUVRS_BASE names no
    directory with a zuvrs package; and it is no default loop."""
    for name in ("zuvrs-base", "zuvrs-base-streams"):
        assert name not in workloads.LOOP_NAMES
        monkeypatch.delenv(workloads.BASE_ENV, raising=False)
        with pytest.raises(workloads.LoopUnavailable):
            workloads.get_loop_factory(name)
        monkeypatch.setenv(workloads.BASE_ENV, str(tmp_path))
        with pytest.raises(workloads.LoopUnavailable):
            workloads.get_loop_factory(name)


def test_bulk_flow_floor_moves_the_bytes() -> None:
    """floors.py's tcp_bulk_flow floors move and check every byte (a small
    size), in both of their patterns."""
    import floors

    for variant in ("tcp_chunk", "tcp_fill"):
        assert floors.floor_bulk_flow(variant, 4) > 0


def test_bulk_modes_splits_fast_samples_from_slow_ones() -> None:
    """bulk_modes.py counts a sample at about twice the loop's lowest as a
    fast-mode one and takes the slow-mode median without it."""
    import bulk_modes

    m = bulk_modes.split_modes([2400.0, 2500.0, 5100.0, 2450.0, 4900.0])
    assert (m["fast"], m["samples"]) == (2, 5)
    assert m["slow_median"] == 2450.0
    assert m["median"] == 2500.0


@pytest.mark.parametrize("loop_name", ["asyncio", "zuvrs"])
def test_bulk_modes_cross_process_reader_gets_every_byte(loop_name: str) -> None:
    """A cross-process sample writes its whole GiB to the reader child (the
    sample raises when the reader got fewer bytes) and reports a rate."""
    import bulk_modes

    assert bulk_modes.cross_process_sample(loop_name, 256 * 1024, 0) > 0


@pytest.mark.parametrize("loop_name", ["floor", "asyncio", "zuvrs"])
def test_bulk_modes_pinned_sample_moves_every_byte(loop_name: str) -> None:
    """A pinned-buffer sample ends only when the receiver has counted all
    of its bytes (a loop that lost some would time out) and reports a
    rate, with what the kernel did meanwhile; ``floor`` is the same
    transfer with no loop (and no socket of the sample's to ask)."""
    import bulk_modes

    result = bulk_modes.pinned_sample(loop_name, 256 * 1024, total=8 * 1024 * 1024)
    assert result["mib_s"] > 0
    assert 0 < result["cpu_busy"] <= 1.5
    # 8 MiB over loopback raise NET_RX on the sending CPU at least once.
    assert result["net_rx"] > 0 and 0 <= result["elsewhere"] <= 1
    if loop_name == "floor":
        assert "busy_ms" not in result
    else:
        assert result["busy_ms"] >= result["rwnd_limited_ms"] >= 0


def test_bulk_modes_rounds_alternate_and_pair() -> None:
    """Interleaved rounds reverse their order every other round; rates are
    paired within a round (a failed sample drops only its own pairs)."""
    import bulk_modes

    orders = [order for _, order in bulk_modes.round_orders(["a", "b", "c"], 3)]
    assert orders == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]
    rounds = [{"a": 110.0, "b": 100.0}, {"a": 120.0, "b": 100.0}, {"a": 130.0}, {"a": 99.0, "b": 100.0}]
    assert bulk_modes.by_key(rounds, ["a", "b"]) == {"a": [110.0, 120.0, 130.0, 99.0], "b": [100.0] * 3}
    line = bulk_modes.paired_ratios(rounds, ["a", "b"])
    assert line.startswith("Paired") and "a/b 1.100 [" in line
    assert bulk_modes.paired_ratios([{"a": 1.0}], ["a", "b"]) == ""


@pytest.mark.parametrize("loop_name", ["floor", "asyncio", "zuvrs"])
def test_bulk_modes_pinned_sample_on_another_congestion_control(loop_name: str) -> None:
    """--congestion-control: the pinned sample's sockets (the floor's too)
    are made on it; reno is always there and allowed."""
    import bulk_modes

    assert bulk_modes.pinned_sample(loop_name, 256 * 1024, total=8 * 1024 * 1024, cc="reno")["mib_s"] > 0


def test_kernel_view_counts_what_the_kernel_did() -> None:
    """kernel_view.since() reports this process's CPU share, the softirqs
    raised and where, and TCP_INFO's chrono times of a socket that sent:
    a blocking loopback transfer keeps the process busy and raises NET_RX;
    its writer was busy sending for some of it."""
    import floors
    import kernel_view

    before = kernel_view.snapshot()
    a, b = floors._tcp_pair(nodelay=True)
    a.setblocking(True)
    b.setblocking(True)
    try:
        chunk = bytes(64 * 1024)
        got = 0
        for _ in range(256):
            a.sendall(chunk)
            while got < len(chunk) * (_ + 1):
                got += len(b.recv(1 << 20))
        view = kernel_view.since(before)
        chrono = kernel_view.tcp_chrono(a)
    finally:
        a.close()
        b.close()
    assert got == 256 * 64 * 1024
    assert view["cpu_busy"] > 0.2
    assert view["net_rx"] > 0 and view["hrtimer"] >= 0 and view["steal_ms"] >= 0
    assert 0 <= view["elsewhere"] <= 1 and view["migrations"] >= 0
    assert set(chrono) == {"busy_ms", "rwnd_limited_ms", "sndbuf_limited_ms"}
    assert chrono["busy_ms"] >= chrono["rwnd_limited_ms"] >= 0


def test_child_rates_takes_a_json_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sample that prints a JSON object gives its ``mib_s`` as the rate
    and the rest to the views; a bare number is the rate alone."""
    import subprocess as sp

    import bulk_modes

    outputs = {"x": '{"mib_s": 2.5, "cpu_busy": 0.9}\n', "y": "noise\n7.0\n"}

    def fake_run(cmd: list, **kw: object) -> sp.CompletedProcess:
        return sp.CompletedProcess(cmd, 0, outputs[cmd[-1]], "")

    monkeypatch.setattr(bulk_modes.subprocess, "run", fake_run)
    views: dict = {}
    rounds = bulk_modes.child_rates({"x": ["x"], "y": ["y"]}, 2, 5, views)
    assert rounds == [{"x": 2.5, "y": 7.0}, {"x": 2.5, "y": 7.0}]
    assert views == {"x": [{"cpu_busy": 0.9}, {"cpu_busy": 0.9}]}
    assert bulk_modes.view_cell([0.9, 0.5, 0.7], "cpu_busy") == "70%"
    assert bulk_modes.view_cell([1200.0], "net_rx") == "1,200" and bulk_modes.view_cell([], "x") == ""


def test_floor_tcp_pair_on_a_congestion_control() -> None:
    """floors.py's pair is on the congestion control asked for, both ends
    (the accepted one inherits the listener's), from the first segment."""
    import floors

    a, b = floors._tcp_pair(cc="reno")
    try:
        for s in (a, b):
            name = s.getsockopt(socket.IPPROTO_TCP, floors.TCP_CONGESTION, 16)
            assert name.rstrip(b"\0") == b"reno"
        assert floors.host_congestion_control() != ""
    finally:
        a.close()
        b.close()


def test_floor_tcp_pair_pins_the_receive_buffer() -> None:
    """floors.py's pair pins the second end's SO_RCVBUF when asked (Linux
    doubles the value set, and autotuning leaves a pinned buffer alone)."""
    import floors

    a, b = floors._tcp_pair(nodelay=True, rcvbuf=256 * 1024)
    try:
        assert b.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 512 * 1024
    finally:
        a.close()
        b.close()
