"""Loop metrics: loop.stats(), zuvrs.stats, get_extra_info('zuvrs_stats'),
python -m zuvrs --stats (docs/metrics.md).

The figures are zuvrs's own: each test runs a workload whose counts are
known and checks them. What has a stdlib counterpart keeps the stdlib's
behaviour with the metrics on; the last tests run parity test files of the
suite with timing on in every loop (ZUVRS_STATS=1).
"""

import asyncio
import logging
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

zuvrs = pytest.importorskip("zuvrs")
from _support import TIMEOUT, run  # noqa: E402
from zuvrs import stats as zstats  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SLEEP = 0.05  # the blocking callback of the lag tests


@pytest.fixture(params=[True, False], ids=["timed", "untimed"])
def any_loop(request):
    lp = zuvrs.new_event_loop(stats=request.param)
    try:
        yield lp
    finally:
        lp.close()


@pytest.fixture
def timed_loop():
    lp = zuvrs.new_event_loop(stats=True)
    try:
        yield lp
    finally:
        lp.close()


@pytest.fixture
def default_restored():
    before = zstats.enabled()
    try:
        yield
    finally:
        zstats.enable(before)


def run_forever_once(loop):
    """Run the loop until the callbacks scheduled so far and those they
    schedule in the same way have run, then stop."""
    loop.call_soon(loop.stop)
    loop.run_forever()


def block():
    time.sleep(SLEEP)


def probe():
    pass


# -- counters -------------------------------------------------------------------


def test_n_call_soon_are_n_callbacks(any_loop):
    any_loop.stats(reset=True)
    n = 1000
    for _ in range(n):
        any_loop.call_soon(probe)
    cancelled = any_loop.call_soon(probe)
    cancelled.cancel()
    run_forever_once(any_loop)
    s = any_loop.stats()
    assert s.callbacks == n + 1, "the n callbacks and stop(); not the cancelled one"
    assert s.turns >= 1
    assert s.enabled is any_loop._stats_on


def test_timers_fired_and_cancelled(any_loop):
    fired = []
    handles = [any_loop.call_later(0, fired.append, i) for i in range(10)]
    for h in handles[::2]:
        h.cancel()
    handles[0].cancel()  # twice: counted once
    later = any_loop.call_later(3600, probe)
    later.cancel()
    run(any_loop, asyncio.sleep(0.01))
    s = any_loop.stats()
    assert fired == [1, 3, 5, 7, 9]
    # run() adds its guard timer (cancelled) and sleep()'s timer (fired).
    assert s.timers_fired == 5 + 1
    assert s.timers_cancelled == 5 + 1 + 1
    assert s.timers == 0


def test_timers_dropped_at_close_are_not_cancelled_ones():
    lp = zuvrs.new_event_loop()
    for _ in range(3):
        lp.call_later(3600, probe)
    lp.close()
    assert lp.stats().timers_cancelled == 0


def test_threadsafe_calls_and_wakeups(any_loop):
    k = 200
    done = []

    def producer():
        for i in range(k):
            any_loop.call_soon_threadsafe(done.append, i)
        any_loop.call_soon_threadsafe(any_loop.stop)

    t = threading.Thread(target=producer)
    any_loop.call_soon(t.start)
    guard = any_loop.call_later(TIMEOUT, any_loop.stop)
    any_loop.run_forever()
    guard.cancel()
    t.join()
    s = any_loop.stats()
    assert done == list(range(k))
    assert s.threadsafe_calls == k + 1
    assert 1 <= s.wakeups <= k + 1


def test_fd_watchers_count_io_events(any_loop):
    a, b = socket.socketpair()
    try:
        seen = []

        def on_readable():
            seen.append(a.recv(100))
            any_loop.remove_reader(a)
            any_loop.stop()

        any_loop.add_reader(a, on_readable)
        before = any_loop.stats().io_events
        b.send(b"ping")
        guard = any_loop.call_later(TIMEOUT, any_loop.stop)
        any_loop.run_forever()
        guard.cancel()
        assert seen == [b"ping"]
        assert any_loop.stats().io_events - before >= 1
    finally:
        a.close()
        b.close()


def test_reset_starts_from_zero(any_loop):
    for _ in range(10):
        any_loop.call_soon(block if any_loop._stats_on else probe)
    run_forever_once(any_loop)
    first = any_loop.stats(reset=True)
    assert first.callbacks == 11
    after = any_loop.stats()
    assert (after.callbacks, after.turns, after.timers_fired, after.io_events) == (0, 0, 0, 0)
    assert after.lag.count == 0 and after.turn_time.count == 0
    assert after.slowest_callbacks == () and after.longest_turns == ()
    assert after.run_seconds == 0.0 and after.poll_seconds == 0.0
    any_loop.call_soon(probe)
    run_forever_once(any_loop)
    assert any_loop.stats().callbacks == 2


# -- timing -----------------------------------------------------------------------


def test_a_blocking_callback_shows_as_lag_and_among_the_slowest(timed_loop):
    timed_loop.call_soon(block)
    timed_loop.call_soon(probe)  # waits behind block: at least SLEEP late
    run_forever_once(timed_loop)
    s = timed_loop.stats()
    assert s.lag.max >= SLEEP
    assert s.lag.count >= 1
    assert s.lag.p99 <= s.lag.max
    assert s.slowest_callbacks, s
    slowest = s.slowest_callbacks[0]
    assert slowest.duration >= SLEEP
    assert "block()" in slowest.name and slowest.name.startswith("<Handle block()"), slowest.name
    assert "test_stats.py" in slowest.name
    assert slowest.coroutine is None
    assert s.longest_turns[0].duration >= SLEEP
    assert s.longest_turns[0].callbacks == 3
    assert s.turn_time.max >= SLEEP
    assert s.busy_seconds >= SLEEP
    # Only callbacks of 1 ms or more are listed.
    assert all(c.duration >= 1e-3 for c in s.slowest_callbacks)


def test_a_timer_due_during_a_blocking_callback_is_late(timed_loop):
    timed_loop.call_soon(block)
    timed_loop.call_later(0.001, timed_loop.stop)
    timed_loop.run_forever()
    s = timed_loop.stats()
    # Due 1 ms after block began; ran after it (timer lag is exact).
    assert s.lag.max >= SLEEP - 0.002


def test_timers_at_infinite_or_nan_deadlines_are_not_late(timed_loop):
    # asyncio accepts call_at(-inf) and call_at(nan); their lag counts from
    # the turn they run in, not from a deadline infinitely long ago.
    fired = []
    for when in (float("-inf"), float("nan")):
        timed_loop.call_at(when, fired.append, when)
    timed_loop.call_later(0.001, timed_loop.stop)
    timed_loop.run_forever()
    s = timed_loop.stats()
    assert len(fired) == 2
    assert s.timers_fired == 3
    assert s.lag.max < 1.0


def test_a_task_step_is_named_by_its_task(timed_loop):
    async def slow_worker():
        time.sleep(SLEEP)
        await asyncio.sleep(0)  # suspended here after the slow step
        return 1

    async def main():
        return await asyncio.create_task(slow_worker(), name="the-worker")

    assert run(timed_loop, main()) == 1
    entries = [c for c in timed_loop.stats().slowest_callbacks if c.coroutine]
    assert entries, timed_loop.stats().slowest_callbacks
    entry = entries[0]
    assert entry.duration >= SLEEP
    assert entry.name.startswith("<Task pending name='the-worker' coro=<"), entry.name
    assert entry.coroutine.endswith("slow_worker")
    path, line = entry.location.rsplit(":", 1)
    assert path == __file__
    with open(__file__) as f:
        assert "suspended here" in f.readlines()[int(line) - 1]


def test_what_debug_mode_prints_is_the_name(timed_loop, caplog):
    # asyncio's debug mode names the same callback the same way.
    timed_loop.set_debug(True)
    timed_loop.slow_callback_duration = SLEEP / 2
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        timed_loop.call_soon(block)
        run_forever_once(timed_loop)
    warned = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert warned
    name = timed_loop.stats().slowest_callbacks[0].name
    assert warned[0].startswith(f"Executing {name} took ")


def test_a_failing_repr_does_not_break_the_turn(timed_loop):
    class BadRepr:
        def __repr__(self):
            raise RuntimeError("no repr")

    ran = []

    def slow(arg):
        time.sleep(0.005)
        ran.append(arg)

    timed_loop.call_soon(slow, BadRepr())
    timed_loop.call_soon(ran.append, "after")
    run_forever_once(timed_loop)
    assert len(ran) == 2 and ran[1] == "after"
    names = [c.name for c in timed_loop.stats().slowest_callbacks]
    assert names and "slow" in names[0]


def test_waiting_in_the_poll_is_not_busy(timed_loop):
    timed_loop.stats(reset=True)
    run(timed_loop, asyncio.sleep(0.2))
    s = timed_loop.stats()
    assert s.run_seconds >= 0.19
    assert s.poll_seconds >= 0.15
    assert s.busy < 0.5  # (the turns around the wait are short; the machine may be busy)
    assert s.poll_seconds <= s.run_seconds


def test_untimed_loops_keep_counting_but_time_nothing():
    lp = zuvrs.new_event_loop(stats=False)
    try:
        lp.call_soon(block)
        run_forever_once(lp)
        s = lp.stats()
        assert not s.enabled
        assert s.callbacks == 2
        assert s.lag.count == 0 and s.slowest_callbacks == () and s.run_seconds == 0.0
    finally:
        lp.close()


def test_timing_can_be_switched_on_while_running():
    lp = zuvrs.new_event_loop(stats=False)
    try:
        async def main():
            lp._stats_on = True
            await asyncio.sleep(0)
            block()
            await asyncio.sleep(0)

        run(lp, main())
        s = lp.stats()
        assert s.enabled
        assert s.slowest_callbacks and s.slowest_callbacks[0].duration >= SLEEP
        assert s.run_seconds >= SLEEP
    finally:
        lp.close()


def test_stats_from_another_thread_while_running(timed_loop):
    seen = []

    def look():
        seen.append(timed_loop.stats())

    async def main():
        t = threading.Thread(target=look)
        t.start()
        while t.is_alive():
            await asyncio.sleep(0.001)

    run(timed_loop, main())
    assert seen and seen[0].turns >= 1


def test_histogram_quantiles():
    h = zstats.Histogram(zstats.BUCKET_BOUNDS, (0,) * 10 + (100,) + (0,) * 17, 0.1, 0.001)
    # 100 values in (512 us, 1.024 ms]
    assert 512e-6 <= h.p50 <= 1e-3
    assert h.p99 <= h.max == 0.001
    assert h.count == 100 and h.mean == pytest.approx(0.001)
    with pytest.raises(ValueError):
        h.quantile(1.5)
    empty = zstats.Histogram(zstats.BUCKET_BOUNDS, (0,) * 28, 0.0, 0.0)
    assert empty.p50 == 0.0 and empty.count == 0


# -- transports ----------------------------------------------------------------


async def _echo_once(k, connect, serve):
    """A server echoing everything it reads, a client sending k bytes and
    reading them back; returns both transports' figures and the loop's."""
    loop = asyncio.get_running_loop()
    server_transports = []

    async def echo(reader, writer):
        server_transports.append(writer.transport)
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server, address = await serve(echo)
    reader, writer = await connect(address)
    writer.write(b"z" * k)
    await writer.drain()
    got = 0
    while got < k:
        got += len(await reader.read(65536))
    writer.write_eof()
    assert await reader.read() == b""
    client = writer.transport.get_extra_info("zuvrs_stats")
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()
    for _ in range(3):
        await asyncio.sleep(0)
    return client, server_transports[0].get_extra_info("zuvrs_stats"), loop.stats()


@pytest.mark.parametrize("family", ["tcp", "unix"])
def test_an_echo_of_k_bytes_counts_k_bytes_each_way(any_loop, family, tmp_path):
    k = 300_000

    if family == "tcp":
        async def serve(cb):
            srv = await asyncio.start_server(cb, "127.0.0.1", 0)
            return srv, srv.sockets[0].getsockname()[:2]

        async def connect(address):
            return await asyncio.open_connection(*address)
    else:
        path = str(tmp_path / "s")

        async def serve(cb):
            return await asyncio.start_unix_server(cb, path), path

        async def connect(address):
            return await asyncio.open_unix_connection(address)

    before = any_loop.stats().transports
    client, server, s = run(any_loop, _echo_once(k, connect, serve))
    for t in (client, server):
        assert isinstance(t, zstats.TransportStats)
        assert t.bytes_read == k and t.bytes_written == k
        assert t.reads >= 2, "data and EOF"
        assert t.writes >= 1
        assert t.write_buffer_high >= 1
    assert client.write_buffer_high >= k, "the client's k bytes were queued at once"
    assert s.transports.bytes_read - before.bytes_read == 2 * k
    assert s.transports.bytes_written - before.bytes_written == 2 * k
    assert s.transports.reads - before.reads == client.reads + server.reads
    assert s.io_events >= client.reads + server.reads


def test_datagrams_count_bytes_and_calls(any_loop):
    async def main():
        loop = asyncio.get_running_loop()
        got = loop.create_future()

        class Echo(asyncio.DatagramProtocol):
            def connection_made(self, transport):
                self.transport = transport

            def datagram_received(self, data, addr):
                self.transport.sendto(data, addr)

        class Client(asyncio.DatagramProtocol):
            def datagram_received(self, data, addr):
                got.set_result(data)

        srv, _ = await loop.create_datagram_endpoint(Echo, local_addr=("127.0.0.1", 0))
        cli, _ = await loop.create_datagram_endpoint(Client, remote_addr=srv.get_extra_info("sockname"))
        cli.sendto(b"d" * 1000)
        assert await asyncio.wait_for(got, TIMEOUT) == b"d" * 1000
        figures = cli.get_extra_info("zuvrs_stats"), srv.get_extra_info("zuvrs_stats")
        cli.close()
        srv.close()
        return figures

    client, server = run(any_loop, main())
    for t in (client, server):
        assert (t.bytes_read, t.bytes_written, t.reads, t.writes) == (1000, 1000, 1, 1)


def test_pauses_are_timed(timed_loop):
    async def main():
        loop = asyncio.get_running_loop()
        paused = loop.create_future()

        class Slow(asyncio.Protocol):
            def connection_made(self, transport):
                self.transport = transport
                transport.pause_reading()
                loop.call_later(0.05, transport.resume_reading)

        class Writer(asyncio.Protocol):
            def connection_made(self, transport):
                transport.set_write_buffer_limits(high=1)
                transport.write(b"w" * 4_000_000)

            def pause_writing(self):
                paused.set_result(None)

        # Small kernel buffers on both ends, so the 4 MB cannot all be taken
        # at once whatever the machine's TCP memory settings (the accepted
        # socket inherits the listener's receive buffer).
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        listener.bind(("127.0.0.1", 0))
        srv = await loop.create_server(Slow, sock=listener)
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        client.setblocking(False)
        await loop.sock_connect(client, listener.getsockname())
        transport, _ = await loop.create_connection(Writer, sock=client)
        await asyncio.wait_for(paused, TIMEOUT)
        await asyncio.sleep(0.1)
        figures = transport.get_extra_info("zuvrs_stats")
        transport.abort()
        srv.close()
        await srv.wait_closed()
        return figures

    figures = run(timed_loop, main())
    assert figures.writing_paused_seconds > 0
    assert figures.write_buffer_high >= 1_000_000
    s = timed_loop.stats()
    assert s.transports.reading_paused_seconds >= 0.04


def test_zuvrs_stats_is_only_zuvrs_extra_info(loop_factory):
    # The stdlib's transports give the default for the name; zuvrs's a
    # TransportStats (nothing else changes for other names).
    lp = loop_factory()
    try:
        async def main():
            srv = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
            _, w = await asyncio.open_connection(*srv.sockets[0].getsockname()[:2])
            info = (
                w.transport.get_extra_info("zuvrs_stats", "dflt"),
                w.transport.get_extra_info("no such name", "dflt"),
                w.transport.get_extra_info("peername") == srv.sockets[0].getsockname()[:2],
            )
            w.close()
            srv.close()
            await srv.wait_closed()
            return info

        stats_info, missing, peer_ok = run(lp, main())
        assert missing == "dflt" and peer_ok
        if loop_factory.name == "asyncio":
            assert stats_info == "dflt"
        else:
            assert isinstance(stats_info, zstats.TransportStats)
    finally:
        lp.close()


# -- the switches -----------------------------------------------------------------


def test_the_global_switch(default_restored):
    zstats.enable(True)
    a = zuvrs.new_event_loop()
    zstats.enable(False)
    b = zuvrs.new_event_loop()
    c = zuvrs.new_event_loop(stats=True)
    try:
        assert (a.stats().enabled, b.stats().enabled, c.stats().enabled) == (True, False, True)
        assert zstats.enabled() is False
        assert a in zstats.loops() and b in zstats.loops()
    finally:
        for lp in (a, b, c):
            lp.close()
    assert a not in zstats.loops()


@pytest.mark.parametrize("value, on", [("1", True), ("0", False), ("", False), ("yes", True)])
def test_the_environment_variable(value, on):
    env = dict(os.environ, ZUVRS_STATS=value)
    out = subprocess.run(
        [sys.executable, "-c", "import zuvrs; print(zuvrs.new_event_loop().stats().enabled)"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.stdout.strip() == str(on), out.stderr


def test_importing_zuvrs_does_not_import_the_stats_module():
    code = "import sys, zuvrs; zuvrs.new_event_loop().close(); print('zuvrs.stats' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


# -- Prometheus ----------------------------------------------------------------


def _families(text):
    parser = pytest.importorskip("prometheus_client.parser")
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def test_prometheus_text_parses_and_matches_the_stats(timed_loop):
    other = zuvrs.new_event_loop(stats=False)
    try:
        timed_loop.call_soon(block)
        timed_loop.call_soon(probe)
        run_forever_once(timed_loop)
        text = zstats.prometheus({"main": timed_loop, 'odd "name"\\': other})
        s = timed_loop.stats()
        fams = _families(text)
        turns = fams["zuvrs_loop_turns"]
        assert turns.type == "counter"
        by_loop = {smp.labels["loop"]: smp for smp in turns.samples}
        assert set(by_loop) == {"main", 'odd "name"\\'}
        assert by_loop["main"].name == "zuvrs_loop_turns_total"
        assert by_loop["main"].value == s.turns
        callbacks = {smp.labels["loop"]: smp.value for smp in fams["zuvrs_loop_callbacks"].samples}
        assert callbacks["main"] == s.callbacks == 3
        lag = fams["zuvrs_loop_lag_seconds"]
        assert lag.type == "histogram"
        samples = [smp for smp in lag.samples if smp.labels["loop"] == "main"]
        buckets = [smp for smp in samples if smp.name.endswith("_bucket")]
        values = [b.value for b in buckets]
        assert values == sorted(values), "buckets are cumulative"
        assert buckets[-1].labels["le"] == "+Inf"
        count = next(smp.value for smp in samples if smp.name.endswith("_count"))
        assert buckets[-1].value == count == s.lag.count
        total = next(smp.value for smp in samples if smp.name.endswith("_sum"))
        assert total == pytest.approx(s.lag.sum)
        bounds = [float(b.labels["le"]) for b in buckets[:-1]]
        assert bounds == list(zstats.BUCKET_BOUNDS)
        # At least one lag above 50 ms: the bucket below it lacks one.
        below = next(b.value for b in buckets if float(b.labels["le"]) >= 0.032768)
        assert count - below >= 1
        transport_bytes = fams["zuvrs_transport_bytes"]
        assert {smp.labels["direction"] for smp in transport_bytes.samples} == {"read", "write"}
        enabled = {smp.labels["loop"]: smp.value for smp in fams["zuvrs_loop_stats_enabled"].samples}
        assert enabled == {"main": 1.0, 'odd "name"\\': 0.0}
        slowest = {smp.labels["loop"]: smp.value for smp in fams["zuvrs_loop_slowest_callback_seconds"].samples}
        assert slowest["main"] >= SLEEP
        for fam in fams.values():
            for smp in fam.samples:
                assert smp.name.startswith("zuvrs_")
                if fam.type == "counter":
                    assert smp.name.endswith("_total")
    finally:
        other.close()


def test_prometheus_of_every_open_loop():
    a = zuvrs.new_event_loop()
    b = zuvrs.new_event_loop()
    try:
        labels = {smp.labels["loop"] for smp in _families(zstats.prometheus())["zuvrs_loop_turns"].samples}
        assert {zstats._number(a), zstats._number(b)} <= labels
        one = {smp.labels["loop"] for smp in _families(zstats.prometheus(a))["zuvrs_loop_turns"].samples}
        assert one == {zstats._number(a)}
    finally:
        a.close()
        b.close()


# -- python -m zuvrs --stats ------------------------------------------------------------


def test_the_cli_prints_a_summary_line_every_interval():
    sample = os.path.join(HERE, "stats_cli_sample.py")
    env = dict(os.environ)
    env.pop("ZUVRS_STATS", None)
    out = subprocess.run(
        [sys.executable, "-m", "zuvrs", "--stats", "0.25", sample, "1.6"],
        env=env, capture_output=True, text=True, timeout=120, cwd=HERE,
    )
    assert out.returncode == 3, out.stderr
    echoed, _, kind = out.stdout.split()[1:4]
    assert kind == "zuvrs" and int(echoed) > 0
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("zuvrs loop ")]
    assert len(lines) >= 3, out.stderr
    for ln in lines:
        assert " busy " in ln and "% " in ln
        assert " lag p50 " in ln and " p99 " in ln
        assert " callbacks " in ln and "/s" in ln
    # The 60 ms callback of the sample shows up by name.
    assert any("slowest" in ln and "hold_the_loop()" in ln for ln in lines), out.stderr
    # Bytes went both ways.
    assert any(" in 0B/s" not in ln for ln in lines)


@pytest.mark.parametrize("args, message", [
    (["--stats"], "argument expected"),
    (["--stats", "0", "x.py"], "above zero"),
    (["--stats", "soon", "x.py"], "above zero"),
    (["--stats", "1"], "a program to run"),
])
def test_the_cli_refuses_bad_intervals(args, message):
    out = subprocess.run([sys.executable, "-m", "zuvrs", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert message in out.stderr


# -- types ----------------------------------------------------------------------

TYPED_SAMPLE = textwrap.dedent(
    """\
    import asyncio

    import zuvrs
    import zuvrs.stats


    loop: zuvrs.Loop = zuvrs.new_event_loop(stats=True)
    snapshot: zuvrs.stats.LoopStats = loop.stats(reset=True)
    busy: float = snapshot.busy
    p99: float = snapshot.lag.p99
    names: list[str] = [c.name for c in snapshot.slowest_callbacks]
    turns: int = snapshot.turns + snapshot.transports.bytes_read
    text: str = zuvrs.stats.prometheus({"main": loop})
    zuvrs.stats.enable(False)
    on: bool = zuvrs.stats.enabled()
    line: str = zuvrs.stats.summary(snapshot, None, "1")
    loops: list[zuvrs.Loop] = zuvrs.stats.loops()


    async def main(transport: asyncio.Transport) -> int:
        figures = transport.get_extra_info("zuvrs_stats")
        assert isinstance(figures, zuvrs.stats.TransportStats)
        return figures.bytes_read
    loop.close()
    """
)


def test_the_stats_api_type_checks(tmp_path):
    pytest.importorskip("mypy")
    path = tmp_path / "sample.py"
    path.write_text(TYPED_SAMPLE)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    path.write_text(TYPED_SAMPLE + "wrong: str = loop.stats().turns\n")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert out.returncode == 1 and "Incompatible types" in out.stdout, out.stdout


# -- parity with timing on ----------------------------------------------------------

PARITY_FILES = (
    "test_callbacks.py", "test_timers.py", "test_tasks.py", "test_threadsafe.py",
    "test_tcp.py", "test_pipes.py", "test_udp.py",
)


def test_parity_tests_pass_with_timing_on():
    """Timing on in every zuvrs loop changes nothing the parity tests see."""
    check = textwrap.dedent(
        """\
        import zuvrs

        def test_timing_is_on():
            lp = zuvrs.new_event_loop()
            assert lp.stats().enabled
            lp.close()
        """
    )
    with tempfile.TemporaryDirectory() as d:
        probe_file = os.path.join(d, "test_timing_probe.py")
        with open(probe_file, "w") as f:
            f.write(check)
        env = dict(os.environ, ZUVRS_STATS="1")
        out = subprocess.run(
            # The stdlib loop's half of each parity test is the same with
            # ZUVRS_STATS set: only zuvrs's half runs.
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "--zuvrs-only",
             *(os.path.join(HERE, name) for name in PARITY_FILES), probe_file],
            env=env, capture_output=True, text=True, timeout=900, cwd=os.path.dirname(HERE),
        )
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and " failed" not in out.stdout
