"""Native streams (zuvrs.streams) against asyncio's own stream classes.

The reference is asyncio's StreamReader / StreamReaderProtocol /
StreamWriter: the same feed scripts are driven through asyncio's reader and
the native one, on the stdlib loop and on zuvrs, and everything they do is
compared (results, errors with their partial / expected / consumed, what
is left in the buffer, EOF, the waiter). The end-to-end tests run the same
body with asyncio's stream functions and with zuvrs.streams', on both loops.
"""

import asyncio
import gc
import random
import subprocess
import sys
import textwrap
import warnings
import weakref

import pytest
from _support import PY311, PY313, TIMEOUT, connected_streams, run

zs = pytest.importorskip("zuvrs.streams")

IMPLEMENTATIONS = {"asyncio": asyncio, "native": zs}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def streams(request):
    """The stream module under test: asyncio's or zuvrs.streams."""
    return IMPLEMENTATIONS[request.param]


# -- feed scripts --------------------------------------------------------------


def _outcome(task, reader, peek=True):
    """What a finished read did, and what it left behind (the buffer's
    contents only if `peek`: looking at `_buffer` makes the native reader
    keep its bytes in that bytearray for the while)."""
    if task.cancelled():
        result = ("cancelled",)
    else:
        exc = task.exception()
        if exc is None:
            result = ("ok", task.result())
        else:
            result = (
                "raised",
                type(exc).__name__,
                exc.args,
                getattr(exc, "partial", None),
                getattr(exc, "expected", None),
                getattr(exc, "consumed", None),
                type(exc.__context__).__name__ if exc.__context__ is not None else None,
            )
    contents = bytes(reader._buffer) if peek else None
    return result + (contents, reader.at_eof(), reader._waiter is None)


async def _play(reader_cls, script, limit, peek=True):
    """Runs `script` against a reader of `reader_cls`; returns the record of
    everything observable after each step (the buffer only if `peek`)."""
    loop = asyncio.get_running_loop()
    reader = reader_cls(limit=limit, loop=loop)
    record = []
    pending = None

    async def settle():
        for _ in range(3):
            await asyncio.sleep(0)

    def note_pending():
        nonlocal pending
        if pending is not None and pending.done():
            record.append(("done",) + _outcome(pending, reader, peek))
            pending = None

    for step in script:
        op, *args = step
        if op == "feed":
            try:
                reader.feed_data(args[0])
                record.append(("fed", bytes(reader._buffer) if peek else None))
            except AssertionError as exc:
                record.append(("feed failed", str(exc)))
        elif op == "eof":
            reader.feed_eof()
        elif op == "exc":
            reader.set_exception(args[0]())
        elif op == "limit":
            reader._limit = args[0]
        elif op == "cancel":
            if pending is not None:
                pending.cancel()
        elif op == "state":
            contents = bytes(reader._buffer) if peek else None
            record.append(("state", contents, reader.at_eof(), type(reader.exception()).__name__))
        else:
            method = {"anext": reader.__anext__}.get(op) or getattr(reader, op)
            task = asyncio.ensure_future(method(*args))
            await settle()
            if task.done():
                record.append((op,) + _outcome(task, reader, peek))
            elif pending is None:
                pending = task
                record.append((op, "waiting"))
            else:
                # A second read while one waits: asyncio's RuntimeError.
                record.append((op, "concurrent", _outcome(task, reader, peek) if task.done() else "still waiting"))
                task.cancel()
                await settle()
        await settle()
        note_pending()
    if pending is not None:
        pending.cancel()
        await settle()
        note_pending()
    return record


def _compare(loop, script, limit=10):
    # Twice: looking at the buffer after every step, and never (the native
    # reader keeps its bytes natively until `_buffer` is asked for).
    for peek in (True, False):
        expected = run(loop, _play(asyncio.StreamReader, script, limit, peek))
        got = run(loop, _play(zs.StreamReader, script, limit, peek))
        assert got == expected, f"script {script!r}, peek={peek}"


SCRIPTS = [
    # read(n)
    [("feed", b"line1\nline2\n"), ("read", 3), ("read", 100), ("state",)],
    [("read", 5), ("feed", b"ab"), ("read", 5), ("eof",), ("read", 5), ("read", 0)],
    [("feed", b"abc"), ("eof",), ("read",), ("read",)],
    [("read",), ("feed", b"a" * 25), ("feed", b"b" * 3), ("eof",)],
    [("feed", b"abc"), ("read", 0), ("read", -1), ("eof",)],
    # readline
    [("feed", b"line1"), ("feed", b"\nline2\n"), ("readline",), ("readline",), ("readline",), ("eof",)],
    [("feed", b"partial"), ("eof",), ("readline",), ("readline",)],
    [("feed", b"x" * 15), ("readline",), ("state",)],
    [("feed", b"x" * 12 + b"\nabc"), ("readline",), ("state",)],
    [("feed", b"x" * 10 + b"\nrest\n"), ("readline",), ("readline",)],
    [("readline",), ("feed", b"x" * 6), ("feed", b"y" * 6), ("state",)],
    [("feed", b"ab"), ("exc", ValueError), ("readline",), ("state",)],
    [("readline",), ("exc", ValueError), ("state",), ("feed", b"z\n"), ("readline",)],
    # readuntil
    [("feed", b"some dataAA"), ("readuntil", b"AAA"), ("feed", b"A"), ("readuntil", b"AAA")],
    [("feed", b"aaaa"), ("readuntil", b""), ("state",)],
    [("feed", b"12345678901"), ("readuntil", b"!"), ("state",)],
    [("feed", b"0123456789abc!"), ("readuntil", b"!"), ("state",)],
    [("feed", b"QWEaa"), ("feed", b"XYaa"), ("feed", b"a"), ("readuntil", b"aaa"), ("readuntil", b"aaa")],
    [("feed", b"some data"), ("eof",), ("readuntil", b"AAA"), ("state",)],
    [("readuntil", b"--"), ("feed", b"a-"), ("feed", b"-b"), ("state",)],
    # readexactly
    [("feed", b"chunk"), ("readexactly", 3), ("readexactly", 0), ("readexactly", 10), ("feed", b"12345678"),
     ("state",)],
    [("feed", b"abc"), ("eof",), ("readexactly", 5), ("state",)],
    [("readexactly", -1)],
    [("readexactly", 30), ("feed", b"a" * 25), ("feed", b"b" * 10), ("state",)],
    [("feed", b"x"), ("exc", RuntimeError), ("readexactly", 1), ("read", 1), ("readuntil", b"x")],
    # __anext__
    [("feed", b"a\nb"), ("anext",), ("anext",), ("eof",), ("anext",), ("anext",)],
    # concurrent readers, cancellation
    [("readline",), ("read", 1), ("readexactly", 2), ("readuntil", b"!"), ("feed", b"x\n")],
    [("readline",), ("cancel",), ("state",), ("feed", b"ab\n"), ("readline",)],
    [("readexactly", 4), ("feed", b"ab"), ("cancel",), ("state",), ("readexactly", 2)],
    # feeding after EOF, limits changed on the way
    [("eof",), ("feed", b"late"), ("feed", b""), ("state",)],
    [("feed", b"abcdef"), ("limit", 3), ("readline",), ("limit", 20), ("feed", b"gh\n"), ("readline",)],
]


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(i) for i in range(len(SCRIPTS))])
def test_feed_scripts_match_asyncio(loop, script):
    _compare(loop, script)


@pytest.mark.skipif(not PY313, reason="readuntil() takes a tuple of separators from 3.13")
@pytest.mark.parametrize(
    "script",
    [
        [("feed", b"line1\r\nline2\n"), ("readuntil", (b"\n", b"\r\n")), ("readuntil", (b"\r\n", b"\n"))],
        [("feed", b"aXbYc"), ("readuntil", (b"Y", b"X")), ("readuntil", (b"Y", b"X"))],
        [("feed", b"abcdefg"), ("readuntil", (b"xyz", b"q")), ("feed", b"123456xyz"), ("state",)],
        [("readuntil", ())],
        [("readuntil", (b"a", b""))],
        [("feed", b"ab"), ("readuntil", (b"ab", b"b"))],
        [("feed", b"xxxxxxxxxxxAB"), ("readuntil", (b"AB", b"B")), ("state",)],
    ],
)
def test_readuntil_separator_tuples_match_asyncio(loop, script):
    _compare(loop, script)


def _random_script(rng):
    alphabet = [b"a", b"b", b"\n", b"AB", b"xyz", b"\n\n"]
    ops = []
    for _ in range(rng.randrange(3, 14)):
        kind = rng.random()
        if kind < 0.45:
            ops.append(("feed", b"".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 8)))))
        elif kind < 0.55:
            ops.append(("readline",))
        elif kind < 0.65:
            ops.append(("read", rng.choice([-1, 0, 1, 3, 7, 50])))
        elif kind < 0.75:
            ops.append(("readexactly", rng.choice([0, 1, 4, 9, 25])))
        elif kind < 0.85:
            ops.append(("readuntil", rng.choice([b"\n", b"AB", b"xyz", b"b"])))
        elif kind < 0.90:
            ops.append(("anext",))
        elif kind < 0.94:
            ops.append(("cancel",))
        elif kind < 0.97:
            ops.append(("exc", rng.choice([ValueError, ConnectionResetError])))
        else:
            ops.append(("eof",))
    if rng.random() < 0.7:
        ops.append(("eof",))
    ops.append(("state",))
    return ops


def test_random_feed_scripts_match_asyncio(loop):
    rng = random.Random(20261202)
    for _ in range(150):
        _compare(loop, _random_script(rng), limit=rng.choice([1, 4, 9, 64]))


# -- the reader's contract -------------------------------------------------------


def test_classes_are_asyncio_subclasses():
    assert issubclass(zs.StreamReader, asyncio.StreamReader)
    assert issubclass(zs.StreamReaderProtocol, asyncio.StreamReaderProtocol)
    assert issubclass(zs.StreamWriter, asyncio.StreamWriter)


def test_reads_are_coroutines_to_asyncio(loop, streams):
    async def main():
        reader = streams.StreamReader(loop=loop)
        reader.feed_data(b"a\nbcdefg")
        line = reader.readline()
        assert asyncio.iscoroutine(line)
        assert await asyncio.wait_for(line, TIMEOUT) == b"a\n"
        assert await asyncio.create_task(reader.readexactly(2)) == b"bc"
        assert await asyncio.gather(reader.read(1), return_exceptions=True) == [b"d"]
        fut = asyncio.ensure_future(reader.readuntil(b"g"))
        assert await fut == b"efg"
        # A read that waits, run as a task and awaited later.
        task = asyncio.create_task(reader.read(5))
        await asyncio.sleep(0)
        assert not task.done()
        reader.feed_data(b"hi")
        assert await task == b"hi"

    run(loop, main())


def test_a_read_is_awaited_once(loop, streams):
    async def main():
        reader = streams.StreamReader(loop=loop)
        reader.feed_data(b"abc")
        read = reader.read(1)
        assert await read == b"a"
        with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
            await read

    run(loop, main())


def test_a_read_not_awaited_does_nothing(loop, streams):
    async def main():
        reader = streams.StreamReader(loop=loop)
        reader.feed_data(b"abc")
        unused = reader.readline()
        reader.read(2).close()
        del unused
        gc.collect()
        assert bytes(reader._buffer) == b"abc"
        assert reader._waiter is None

    with warnings.catch_warnings():
        # (asyncio warns of a coroutine never awaited; the native reads do not.)
        warnings.simplefilter("ignore", RuntimeWarning)
        run(loop, main())


def test_cancelled_read_leaves_buffer_and_waiter(loop, streams):
    async def main():
        reader = streams.StreamReader(loop=loop)
        reader.feed_data(b"abc")
        task = asyncio.create_task(reader.readexactly(10))
        await asyncio.sleep(0)
        assert reader._waiter is not None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert reader._waiter is None
        assert bytes(reader._buffer) == b"abc"
        reader.feed_data(b"defghijkl")
        assert await reader.readexactly(10) == b"abcdefghij"

    run(loop, main())


def test_exception_set_while_waiting(loop, streams):
    async def main():
        reader = streams.StreamReader(loop=loop)
        task = asyncio.create_task(reader.readline())
        await asyncio.sleep(0)
        exc = ConnectionResetError("gone")
        reader.set_exception(exc)
        with pytest.raises(ConnectionResetError) as info:
            await task
        assert info.value is exc
        assert reader.exception() is exc
        with pytest.raises(ConnectionResetError):
            await reader.read(1)

    run(loop, main())


@pytest.mark.parametrize("how", ["feed_data", "feed_eof", "set_exception"])
def test_waiter_methods_set_on_the_future_are_called(loop, streams, how):
    # The reader wakes its waiter through the future's own methods unless
    # the future itself holds others (an instance attribute shadows them).
    async def main():
        reader = streams.StreamReader(loop=loop)
        task = asyncio.create_task(reader.read(5))
        await asyncio.sleep(0)
        waiter = reader._waiter
        calls = []
        for name in ("cancelled", "set_result", "set_exception"):
            method = getattr(waiter, name)
            setattr(waiter, name, lambda *a, _m=method, _n=name: (calls.append(_n), _m(*a))[1])
        exc = ConnectionResetError("gone")
        if how == "feed_data":
            reader.feed_data(b"abc")
        elif how == "feed_eof":
            reader.feed_eof()
        else:
            reader.set_exception(exc)
        try:
            result = await task
        except ConnectionResetError as err:
            result = err
        return calls, result, exc

    calls, result, exc = run(loop, main())
    if how == "set_exception":
        assert (calls, result) == (["cancelled", "set_exception"], exc)
    else:
        assert (calls, result) == (["cancelled", "set_result"], b"abc" if how == "feed_data" else b"")


def test_waiter_of_a_future_subclass_has_its_methods_called(loop, streams):
    calls = []

    class Future(asyncio.Future):
        def cancelled(self):
            calls.append("cancelled")
            return super().cancelled()

        def set_result(self, result):
            calls.append("set_result")
            super().set_result(result)

    async def main():
        reader = streams.StreamReader(loop=loop)
        loop.create_future = lambda: Future(loop=loop)
        try:
            task = asyncio.create_task(reader.read(5))
            await asyncio.sleep(0)
            assert type(reader._waiter) is Future
            reader.feed_data(b"abc")
            return await task
        finally:
            del loop.create_future

    assert run(loop, main()) == b"abc"
    assert calls == ["cancelled", "set_result"]


async def _waits(reader, n, keep=None):
    """n reads that each wait for their byte (fed once the read waits);
    `keep(i, waiter)` is called with each read's waiter while it waits."""
    for i in range(n):
        task = asyncio.ensure_future(reader.read(1))
        await asyncio.sleep(0)
        waiter = reader._waiter
        assert type(waiter) is asyncio.Future and not waiter.done()
        if keep is not None:
            keep(i, waiter)
        del waiter
        reader.feed_data(bytes([i]))
        assert await task == bytes([i])


def test_each_wait_has_a_pending_future_of_its_own(loop, streams):
    # A waiter that anything else holds (here: a list) is never made the
    # waiter of a later read (zuvrs renews only waiters nobody else sees).
    async def main():
        reader = streams.StreamReader(loop=loop)
        held = []
        await _waits(reader, 8, lambda i, w: held.append(w))
        assert len({id(w) for w in held}) == 8
        assert all(w.done() and w.result() is None and w.get_loop() is loop for w in held)

    run(loop, main())


def test_a_waiter_with_a_weak_reference_or_an_attribute_is_not_renewed(loop, streams):
    async def main():
        reader = streams.StreamReader(loop=loop)
        refs, marked = [], []

        def keep(i, waiter):
            if i % 2:
                refs.append(weakref.ref(waiter))
            else:
                waiter.mark = i
                marked.append(weakref.ref(waiter))

        await _waits(reader, 8, keep)
        # Whatever is still alive is still done with its own state: never
        # renewed into a later wait's future.
        for ref in refs + marked:
            fut = ref()
            if fut is not None:
                assert fut.done() and fut.result() is None
        for i, ref in zip(range(0, 8, 2), marked):
            if ref() is not None:
                assert ref().mark == i

    run(loop, main())


def test_a_cancelled_wait_does_not_outlive_its_read(loop, streams):
    # The cancelled read's waiter (and all it holds) is let go once the
    # read is over, as under asyncio: a reader keeps for renewal only
    # waiters that ended with their result.
    async def main():
        reader = streams.StreamReader(loop=loop)
        await _waits(reader, 2)
        task = asyncio.ensure_future(reader.read(1))
        await asyncio.sleep(0)
        gone = weakref.ref(reader._waiter)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        del task
        gc.collect()
        assert gone() is None
        await _waits(reader, 2)

    run(loop, main())


def test_waits_with_a_patched_create_future_use_it_every_time(loop, streams):
    made = []

    async def main():
        reader = streams.StreamReader(loop=loop)
        await _waits(reader, 2)
        original = loop.create_future
        loop.create_future = lambda: made.append(1) or original()
        try:
            await _waits(reader, 5)
        finally:
            del loop.create_future
        await _waits(reader, 2)

    run(loop, main())
    assert made == [1] * 5


def test_waits_after_asyncio_futures_future_is_replaced_use_the_new_class(loop, streams, monkeypatch):
    # create_future makes `asyncio.futures.Future` as the module has it at
    # each call, so a reader's waits follow a replacement at once, and go
    # back when it is undone (the renewed waiters included).
    class Recording(asyncio.Future):
        pass

    async def main():
        reader = streams.StreamReader(loop=loop)
        await _waits(reader, 3)
        kinds = []
        with monkeypatch.context() as patch:
            patch.setattr(asyncio.futures, "Future", Recording)
            for i in range(4):
                task = asyncio.ensure_future(reader.read(1))
                await asyncio.sleep(0)
                kinds.append(type(reader._waiter))
                reader.feed_data(bytes([i]))
                assert await task == bytes([i])
        await _waits(reader, 3)
        return kinds

    assert run(loop, main()) == [Recording] * 4


def test_concurrent_read_is_refused(loop, streams):
    async def main():
        reader = streams.StreamReader(loop=loop)
        first = asyncio.create_task(reader.readline())
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match=r"^read\(\) called while another coroutine is already waiting"):
            await reader.read(1)
        reader.feed_data(b"x\n")
        assert await first == b"x\n"

    run(loop, main())


def test_buffer_identity_and_outside_changes(loop, streams):
    async def main():
        reader = streams.StreamReader(loop=loop)
        buf = reader._buffer
        assert isinstance(buf, bytearray)
        reader.feed_data(b"hello\nworld\n")
        assert buf is reader._buffer and buf == b"hello\nworld\n"
        assert await reader.readline() == b"hello\n"
        assert buf == b"world\n"
        buf.clear()
        reader.feed_data(b"x\n")
        assert await reader.readline() == b"x\n"
        reader._buffer = bytearray(b"replaced\n")
        assert await reader.readline() == b"replaced\n"

    run(loop, main())


def test_buffer_held_then_let_go(loop, streams):
    """A `_buffer` Python code holds is the buffer; once let go, reads and
    feeds go on with the same contents."""

    async def main():
        reader = streams.StreamReader(loop=loop)
        reader.feed_data(b"one\ntw")
        held = reader._buffer
        held.extend(b"o\nthree")
        assert await reader.readline() == b"one\n"
        assert held == b"two\nthree" and held is reader._buffer
        del held
        gc.collect()
        reader.feed_data(b"\nfour")
        assert await reader.readline() == b"two\n"
        assert await reader.readline() == b"three\n"
        pending = asyncio.ensure_future(reader.readexactly(6))
        await asyncio.sleep(0)
        assert bytes(reader._buffer) == b"four"
        reader.feed_data(b"56")
        assert await pending == b"four56"
        assert len(reader._buffer) == 0
        reader.feed_data(b"x" * 100_000)
        assert await reader.read(100_000) == b"x" * 100_000
        reader.feed_data(b"tail")
        reader.feed_eof()
        assert await reader.read() == b"tail" and reader.at_eof()

    run(loop, main())


def test_feed_data_of_ints_as_asyncio(loop, streams):
    """feed_data of an iterable of ints extends the buffer as bytearray
    would; other objects get bytearray's TypeError."""

    async def main():
        reader = streams.StreamReader(loop=loop)
        reader.feed_data([104, 105, 10])
        assert await reader.readline() == b"hi\n"
        with pytest.raises(TypeError):
            reader.feed_data(3.5)
        return bytes(reader._buffer)

    assert run(loop, main()) == b""


class _RecordingTransport(asyncio.Transport):
    def __init__(self, can_pause=True):
        super().__init__()
        self.calls = []
        self.can_pause = can_pause

    def pause_reading(self):
        if not self.can_pause:
            raise NotImplementedError
        self.calls.append("pause")

    def resume_reading(self):
        self.calls.append("resume")


def test_reading_pauses_over_twice_the_limit_and_resumes_at_it(loop, streams):
    async def main():
        reader = streams.StreamReader(limit=4, loop=loop)
        transport = _RecordingTransport()
        reader.set_transport(transport)
        reader.feed_data(b"12345678")
        assert transport.calls == []
        reader.feed_data(b"9")
        assert transport.calls == ["pause"] and reader._paused
        reader.feed_data(b"abcdef")  # already paused: no second pause
        assert await reader.read(6) == b"123456"
        assert transport.calls == ["pause"]
        assert await reader.read(5) == b"789ab"
        assert transport.calls == ["pause", "resume"] and not reader._paused
        reader.feed_data(b"x" * 9)
        assert transport.calls[-1] == "pause"
        assert await reader.readexactly(9) == b"cdefxxxxx"
        assert transport.calls == ["pause", "resume", "pause", "resume"]
        # A read that must wait resumes a paused transport first.
        reader.feed_data(b"y" * 9)
        assert transport.calls[-1] == "pause" and reader._paused
        task = asyncio.create_task(reader.readexactly(30))
        await asyncio.sleep(0)
        assert transport.calls[-1] == "resume" and not reader._paused
        reader.feed_data(b"z" * 17)
        assert await task == b"xxxx" + b"y" * 9 + b"z" * 17
        return transport.calls

    assert run(loop, main()) == ["pause", "resume", "pause", "resume", "pause", "resume", "pause", "resume"]


def test_transport_that_cannot_pause_is_forgotten(loop, streams):
    async def main():
        reader = streams.StreamReader(limit=2, loop=loop)
        transport = _RecordingTransport(can_pause=False)
        reader.set_transport(transport)
        reader.feed_data(b"12345")
        assert reader._transport is None and not reader._paused
        reader.feed_data(b"6789")
        assert await reader.read(100) == b"123456789"

    run(loop, main())


def test_set_transport_twice_fails(loop, streams):
    reader = streams.StreamReader(loop=loop)
    reader.set_transport(_RecordingTransport())
    with pytest.raises(AssertionError, match="Transport already set"):
        reader.set_transport(_RecordingTransport())


def test_invalid_limit(loop, streams):
    with pytest.raises(ValueError, match="imit cannot be <= 0"):
        streams.StreamReader(limit=0, loop=loop)
    with pytest.raises(ValueError):
        streams.StreamReader(limit=-1, loop=loop)


def test_repr_and_attributes_match(loop):
    readers = [cls(limit=7, loop=loop) for cls in (asyncio.StreamReader, zs.StreamReader)]
    for reader in readers:
        reader.feed_data(b"abc")
        reader.feed_eof()
    assert repr(readers[0]) == repr(readers[1])
    for name in ("_limit", "_eof", "_paused", "_exception", "_transport", "_waiter", "_buffer"):
        assert getattr(readers[0], name) == getattr(readers[1], name), name
    assert readers[1]._loop is loop


def test_subclass_overrides_are_used(loop):
    class Upper(zs.StreamReader):
        async def readuntil(self, separator=b"\n"):
            return (await super().readuntil(separator)).upper()

    class Counting(zs.StreamReader):
        fed = 0

        def feed_data(self, data):
            self.fed += 1
            super().feed_data(data)

    async def main():
        reader = Upper(loop=loop)
        reader.feed_data(b"shout\nagain\n")
        assert await reader.readline() == b"SHOUT\n"
        assert [line async for line in _take(reader, 1)] == [b"AGAIN\n"]
        counting = Counting(loop=loop)
        counting.feed_data(b"x")
        assert counting.fed == 1

    run(loop, main())


async def _take(reader, n):
    async for line in reader:
        yield line
        n -= 1
        if not n:
            return


# -- over real transports --------------------------------------------------------


@pytest.fixture(scope="module")
def tls_contexts(tmp_path_factory):
    from _tls_certs import make_pki
    from _tls_support import client_context, server_context

    pki = make_pki(tmp_path_factory.mktemp("pki"))
    return server_context(pki), client_context(pki)


async def _echo_lines(reader, writer):
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            writer.write(line)
            await writer.drain()
    finally:
        writer.close()


@pytest.mark.parametrize("family", ["tcp", "unix"])
def test_echo_lines_over_sockets(loop, streams, family, tmp_path):
    lines = [b"%d %s\n" % (i, b"x" * (i % 300)) for i in range(2000)]

    async def main():
        if family == "tcp":
            server = await streams.start_server(_echo_lines, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            reader, writer = await streams.open_connection("127.0.0.1", port)
        else:
            path = str(tmp_path / "s.sock")
            server = await streams.start_unix_server(_echo_lines, path)
            reader, writer = await streams.open_unix_connection(path)
        assert type(reader) is streams.StreamReader and type(writer) is streams.StreamWriter
        got = []
        for i in range(0, len(lines), 50):
            writer.writelines(lines[i:i + 50])
            await writer.drain()
            for _ in range(50):
                got.append(await reader.readline())
        writer.write_eof()
        assert await reader.read() == b""
        assert reader.at_eof()
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        return got

    assert run(loop, main(), timeout=30) == lines


def test_bulk_through_a_small_limit_pauses_and_delivers_everything(loop, streams):
    """Flow control on a real transport: the server's reader pauses its
    transport over twice the limit; every byte arrives, in order."""
    size = 8 * 1024 * 1024
    block = bytes(range(256)) * 256

    async def main():
        done = loop.create_future()
        paused = []

        async def handle(reader, writer):
            total = 0
            crc = 0
            import zlib

            while True:
                data = await reader.read(3000)
                if not data:
                    break
                paused.append(reader._paused)
                total += len(data)
                crc = zlib.crc32(data, crc)
                await asyncio.sleep(0)
            done.set_result((total, crc))
            writer.close()

        server = await streams.start_server(handle, "127.0.0.1", 0, limit=1024)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await streams.open_connection("127.0.0.1", port)
        import zlib

        expect = 0
        for _ in range(size // len(block)):
            writer.write(block)
            expect = zlib.crc32(block, expect)
            await writer.drain()
        writer.write_eof()
        total, crc = await done
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        return total, crc == expect, any(paused)

    total, same, was_paused = run(loop, main(), timeout=60)
    assert total == size and same and was_paused



def test_peer_reset_reaches_the_reader(loop, streams):
    async def main():
        server, (reader, writer), (_, peer) = await connected_streams(streams)
        read = asyncio.create_task(reader.read(10))
        await asyncio.sleep(0.01)
        peer.transport.abort()
        assert await read == b""
        writer.close()
        # A write to a connection the peer has gone from: drain fails at last.
        server.close()
        await server.wait_closed()

    run(loop, main())


def test_drain_semantics(loop, streams):
    async def main():
        server, (reader, writer), (peer_reader, peer_writer) = await connected_streams(streams)
        # Nothing to wait for: drain completes at once.
        assert await writer.drain() is None
        # Paused by the transport: drain waits until the peer reads.
        writer.transport.set_write_buffer_limits(high=1024)
        big = b"z" * (8 * 1024 * 1024)
        writer.write(big)
        drain = asyncio.ensure_future(writer.drain())
        await asyncio.sleep(0.05)
        assert not drain.done()
        assert await peer_reader.readexactly(len(big)) == big
        await asyncio.wait_for(drain, TIMEOUT)
        # An exception on the reader is raised by drain.
        exc = ValueError("reader failed")
        reader.set_exception(exc)
        with pytest.raises(ValueError):
            await writer.drain()
        reader._exception = None
        # After the connection is lost: ConnectionResetError.
        peer_writer.transport.abort()
        await asyncio.sleep(0.05)
        writer.write(b"after")
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            for _ in range(20):
                writer.write(b"x" * 65536)
                await writer.drain()
                await asyncio.sleep(0.01)
        writer.close()
        server.close()
        await server.wait_closed()

    run(loop, main(), timeout=30)


def test_writer_api_as_asyncio(loop, streams):
    async def main():
        server, (reader, writer), (peer_reader, peer_writer) = await connected_streams(streams)
        port = server.sockets[0].getsockname()[1]
        assert isinstance(peer_writer, asyncio.StreamWriter)
        assert type(peer_reader) is type(reader) and type(peer_writer) is type(writer)
        assert writer.get_extra_info("peername") == ("127.0.0.1", port)
        assert writer.transport is writer._transport
        assert writer.can_write_eof()
        assert repr(writer).startswith("<StreamWriter transport=")
        writer.writelines([b"a", bytearray(b"b"), memoryview(b"c")])
        writer.write(b"\n")
        assert await peer_reader.readline() == b"abc\n"
        with pytest.raises(TypeError):
            writer.write("text")
        assert not writer.is_closing()
        writer.close()
        assert writer.is_closing()
        await writer.wait_closed()
        assert await peer_reader.read() == b""
        peer_writer.close()
        server.close()
        await server.wait_closed()

    run(loop, main())


# Each read called as a user might: by position, by keyword, with None
# (asyncio's reads take no None for their size or separator: a TypeError
# when awaited), with a wrong type, or with a wrong count (TypeError at the
# call). What each gives, and what is left to read after it.
READ_CALLS = [
    ("read", (2,), {}),
    ("read", (), {"n": 2}),
    ("read", (None,), {}),
    ("read", (), {"n": None}),
    ("read", (1.5,), {}),
    ("read", (1, 2), {}),
    ("read", (), {"size": 1}),
    ("readexactly", (2,), {}),
    ("readexactly", (), {"n": 2}),
    ("readexactly", (None,), {}),
    ("readexactly", (), {}),
    ("readexactly", (1,), {"n": 1}),
    ("readline", (), {}),
    ("readline", (1,), {}),
    ("readuntil", (b"c",), {}),
    ("readuntil", (), {"separator": b"c"}),
    ("readuntil", (None,), {}),
    ("readuntil", (), {"separator": None}),
    ("readuntil", ("c",), {}),
]


def test_read_argument_shapes_as_asyncio(loop):
    async def outcomes(streams):
        reader = streams.StreamReader(loop=asyncio.get_running_loop())
        reader.feed_data(b"abc\n" * len(READ_CALLS))
        seen = []
        for name, args, kwargs in READ_CALLS:
            try:
                awaitable = getattr(reader, name)(*args, **kwargs)
            except TypeError:
                seen.append((name, "TypeError at the call"))
                continue
            try:
                seen.append((name, await asyncio.wait_for(awaitable, TIMEOUT)))
            except Exception as exc:
                seen.append((name, type(exc).__name__))
            seen.append(("left", len(reader._buffer)))
        return seen

    async def main():
        return await outcomes(asyncio), await outcomes(zs)

    expected, native = run(loop, main())
    assert native == expected
    assert ("read", "TypeError") in expected and ("read", b"ab") in expected


def test_write_argument_shapes_as_asyncio(loop, streams):
    async def main():
        server, (reader, writer), (peer_reader, peer_writer) = await connected_streams(streams)
        writer.write(data=b"a")
        writer.writelines(data=[b"b", b"c"])
        for call in (lambda: writer.write(), lambda: writer.write(b"x", b"y"), lambda: writer.drain(1),
                     lambda: writer.writelines(), lambda: writer.write(dat=b"x")):
            with pytest.raises(TypeError):
                call()
        writer.write(b"\n")
        await writer.drain()
        assert await peer_reader.readline() == b"abc\n"
        writer.close()
        await writer.wait_closed()
        peer_writer.close()
        server.close()
        await server.wait_closed()

    run(loop, main())


def test_handler_exception_is_reported_and_closes(loop, streams):
    if not PY311:
        pytest.skip("3.10's start_server does not report a failed handler")

    async def main():
        contexts = []
        loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))

        async def handle(reader, writer):
            raise ValueError("handler failed")

        server = await streams.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await streams.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
        writer.close()
        server.close()
        await server.wait_closed()
        return contexts

    contexts = run(loop, main())
    assert [c["message"] for c in contexts] == ["Unhandled exception in client_connected_cb"]
    assert isinstance(contexts[0]["exception"], ValueError)


def test_native_reads_skip_data_received_on_zuvrs(loop_name, loop):
    """On a zuvrs transport the native protocol's reads go to the reader
    without data_received; on other transports through it, as asyncio."""
    calls = []

    async def main():
        accepted = loop.create_future()

        async def handle(reader, writer):
            accepted.set_result(writer)

        server = await zs.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader = zs.StreamReader(loop=loop)
        protocol = zs.StreamReaderProtocol(reader, loop=loop)
        original = protocol.data_received
        protocol.data_received = lambda data: (calls.append(data), original(data))
        transport, _ = await loop.create_connection(lambda: protocol, "127.0.0.1", port)
        peer = await accepted
        peer.write(b"hello\n")
        assert await reader.readline() == b"hello\n"
        transport.close()
        peer.close()
        server.close()
        await server.wait_closed()

    run(loop, main())
    assert calls == ([] if loop_name == "zuvrs" else [b"hello\n"])


@pytest.mark.skipif(not PY311, reason="StreamWriter.start_tls() is 3.11+")
def test_start_tls_over_native_streams(loop, streams, tls_contexts):
    server_ctx, client_ctx = tls_contexts

    async def main():
        async def handle(reader, writer):
            line = await reader.readline()
            # The client starts its handshake once it has this, and this
            # side reads nothing more before start_tls takes the socket.
            writer.write(b"ok\n")
            await writer.drain()
            await writer.start_tls(server_ctx)
            writer.write(b"secure " + line)
            await writer.drain()
            assert await reader.readline() == b"bye\n"
            writer.close()

        server = await streams.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await streams.open_connection("127.0.0.1", port)
        writer.write(b"hi\n")
        assert await reader.readline() == b"ok\n"
        await writer.start_tls(client_ctx, server_hostname="localhost")
        assert writer.get_extra_info("ssl_object") is not None
        assert await reader.readline() == b"secure hi\n"
        writer.write(b"bye\n")
        await writer.drain()
        assert await reader.read() == b""
        writer.close()
        server.close()
        await server.wait_closed()

    run(loop, main(), timeout=20)


def test_tls_echo_over_native_streams(loop, streams, tls_contexts):
    server_ctx, client_ctx = tls_contexts
    lines = [b"%d %s\n" % (i, b"y" * (i % 50)) for i in range(500)]

    async def main():
        server = await streams.start_server(_echo_lines, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await streams.open_connection("127.0.0.1", port, ssl=client_ctx,
                                                       server_hostname="localhost")
        got = []
        for line in lines:
            writer.write(line)
            got.append(await reader.readline())
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        return got

    assert run(loop, main(), timeout=30) == lines


def test_protocol_knows_tls_and_names_outlive_the_close(loop, streams, tls_contexts):
    """The protocol's TLS flag (what eof_received answers by) on plain and
    TLS connections, and the names a plain connection reports once closed,
    on both ends, as asyncio's."""
    server_ctx, client_ctx = tls_contexts

    async def connection(ssl):
        accepted = asyncio.get_running_loop().create_future()

        async def handle(reader, writer):
            accepted.set_result((reader, writer))

        kwargs = {"ssl": server_ctx} if ssl else {}
        server = await streams.start_server(handle, "127.0.0.1", 0, **kwargs)
        port = server.sockets[0].getsockname()[1]
        kwargs = {"ssl": client_ctx, "server_hostname": "localhost"} if ssl else {}
        reader, writer = await streams.open_connection("127.0.0.1", port, **kwargs)
        _, server_writer = await accepted
        flags = (writer._protocol._over_ssl, server_writer._protocol._over_ssl)
        writer.close()
        await writer.wait_closed()
        server_writer.close()
        await server_writer.wait_closed()
        # (asyncio's TLS transports answer nothing once closed.)
        names = None if ssl else [
            (w.get_extra_info("sockname"), w.get_extra_info("peername"), w.get_extra_info("socket").fileno())
            for w in (writer, server_writer)
        ]
        server.close()
        await server.wait_closed()
        return flags, names, port

    async def main():
        return await connection(False), await connection(True)

    plain, tls = run(loop, main(), timeout=20)
    assert plain[0] == (False, False)
    assert tls[0] == (True, True)
    _, ((c_name, c_peer, c_fd), (s_name, s_peer, s_fd)), port = plain
    assert c_peer == s_name == ("127.0.0.1", port)
    assert c_name == s_peer and c_name[0] == "127.0.0.1"
    assert c_fd == s_fd == -1


# -- install() ----------------------------------------------------------------


def test_import_leaves_asyncio_alone():
    code = textwrap.dedent(
        """
        import asyncio, asyncio.streams
        before = (asyncio.open_connection, asyncio.start_server,
                  asyncio.open_unix_connection, asyncio.start_unix_server,
                  asyncio.StreamReader, asyncio.StreamWriter)
        import zuvrs, zuvrs.streams
        after = (asyncio.open_connection, asyncio.start_server,
                 asyncio.open_unix_connection, asyncio.start_unix_server,
                 asyncio.StreamReader, asyncio.StreamWriter)
        assert before == after, (before, after)
        assert asyncio.streams.open_connection is asyncio.open_connection
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_install_uses_native_streams_on_zuvrs_loops_only(loop_name, loop):
    originals = (asyncio.open_connection, asyncio.start_server, asyncio.open_unix_connection,
                 asyncio.start_unix_server)
    zs.install()
    try:
        assert zs.installed()
        assert asyncio.streams.open_connection is asyncio.open_connection
        zs.install()  # twice is once

        async def main():
            got = loop.create_future()

            async def handle(reader, writer):
                got.set_result((type(reader), type(writer)))
                writer.close()

            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            server_types = await got
            writer.close()
            server.close()
            await server.wait_closed()
            return (type(reader), type(writer)), server_types

        client, server = run(loop, main())
    finally:
        zs.uninstall()
    assert not zs.installed()
    assert (asyncio.open_connection, asyncio.start_server, asyncio.open_unix_connection,
            asyncio.start_unix_server) == originals
    expected = (zs.StreamReader, zs.StreamWriter) if loop_name == "zuvrs" else (
        asyncio.StreamReader, asyncio.StreamWriter)
    assert client == expected and server == expected


def test_install_outside_a_loop_raises_as_asyncio():
    zs.install()
    try:
        coro = asyncio.open_connection("127.0.0.1", 1)
        with pytest.raises(RuntimeError, match="no running event loop"):
            coro.send(None)
    finally:
        zs.uninstall()


# -- what is made on first use -------------------------------------------------------


class _FakeTransport(asyncio.Transport):
    """A transport that records what the protocol asks of it."""

    def __init__(self, extra=None):
        super().__init__(extra)
        self.calls = []

    def abort(self):
        self.calls.append("abort")

    def is_closing(self):
        return False

    def pause_reading(self):
        self.calls.append("pause_reading")

    def resume_reading(self):
        self.calls.append("resume_reading")


_PROTOCOL_ATTRIBUTES = (
    "_paused",
    "_connection_lost",
    "_reject_connection",
    "_over_ssl",
    "_task",
    "_transport",
    "_source_traceback",
)


def _protocol_view(protocol, reader, cb):
    """What asyncio's protocol shows of its state."""
    view = {name: getattr(protocol, name) for name in _PROTOCOL_ATTRIBUTES}
    view["_transport"] = type(view["_transport"]).__name__
    view["_stream_reader"] = protocol._stream_reader is reader if reader is not None else protocol._stream_reader
    view["_strong_reader"] = protocol._strong_reader is reader if cb is not None else "unset"
    view["_client_connected_cb"] = protocol._client_connected_cb is cb
    view["_drain_waiters"] = list(protocol._drain_waiters)
    view["_closed"] = (type(protocol._closed).__name__, protocol._closed.done())
    return view


def _protocol_states(loop, streams):
    """The protocol's attributes through its life, as asyncio's show them:
    after __init__ (with and without a server callback), after
    connection_made (the reader gets the transport; TLS or not), after
    eof_received, and after connection_lost(exc) (the reader's exception,
    the closing future's, the references dropped); every attribute can be
    set and read back."""

    def cb(reader, writer):
        pass

    async def main():
        results = []
        for callback in (None, cb):
            reader = streams.StreamReader(loop=loop)
            protocol = streams.StreamReaderProtocol(reader, callback, loop=loop)
            states = [_protocol_view(protocol, reader, callback)]
            transport = _FakeTransport({"sslcontext": None})
            if callback is None:
                protocol.connection_made(transport)
                assert reader._transport is transport
                states.append(_protocol_view(protocol, reader, None))
                states.append(protocol.eof_received())
                assert reader.at_eof()
            exc = ConnectionResetError("gone")
            protocol.connection_lost(exc)
            states.append({name: getattr(protocol, name) for name in ("_connection_lost", "_transport", "_task")})
            states.append((protocol._stream_reader, protocol._closed.exception() is exc))
            for name, value in (("_paused", True), ("_over_ssl", True), ("_task", "t"), ("_transport", "x")):
                setattr(protocol, name, value)
                states.append((name, getattr(protocol, name)))
            results.append(states)
        tls = streams.StreamReaderProtocol(streams.StreamReader(loop=loop), loop=loop)
        tls.connection_made(_FakeTransport({"sslcontext": object()}))
        results.append((tls._over_ssl, tls.eof_received()))
        return results

    return run(loop, main())


def test_protocol_state_as_asyncio(loop):
    """See _protocol_states: asyncio's protocol and the native one show the
    same state at every step."""
    reference = _protocol_states(loop, asyncio)
    assert reference[0][0]["_stream_reader"] is True
    assert reference[-1] == (True, False)
    native = _protocol_states(loop, zs)
    for expected, got in zip(reference, native):
        assert got == expected


def test_rejected_connection_as_asyncio(loop, streams):
    """A protocol whose stream was collected before the connection was made
    (asyncio's _reject_connection) reports it and aborts the transport."""

    async def main():
        contexts = []
        loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
        protocol = streams.StreamReaderProtocol(streams.StreamReader(loop=loop), loop=loop)
        protocol._reject_connection = True
        transport = _FakeTransport()
        protocol.connection_made(transport)
        return transport.calls, [c["message"] for c in contexts], protocol._transport

    calls, messages, kept = run(loop, main())
    assert calls == ["abort"]
    assert len(messages) == 1 and messages[0].startswith("An open stream was garbage collected")
    assert kept is None


def test_lost_connection_wakes_paused_drains_with_its_error(loop, streams):
    """Drains waiting while writing is paused end with the connection's
    error when it is lost, and later drains raise at once."""

    async def main():
        server, (reader, writer), (_, peer) = await connected_streams(streams)
        protocol = writer._protocol
        protocol.pause_writing()
        drains = [asyncio.ensure_future(writer.drain()) for _ in range(2)]
        await asyncio.sleep(0)
        assert not any(d.done() for d in drains)
        protocol.connection_lost(BrokenPipeError("lost"))
        outcomes = [type(r).__name__ for r in await asyncio.gather(*drains, return_exceptions=True)]
        with pytest.raises(BrokenPipeError):
            # (The reader's exception, which drain() raises first.)
            await writer.drain()
        writer.transport.abort()
        peer.close()
        server.close()
        await server.wait_closed()
        return outcomes

    assert run(loop, main()) == ["BrokenPipeError", "BrokenPipeError"]


def test_protocol_made_without_a_loop_is_asyncio_s(loop, streams):
    """A protocol made with no loop argument inside a running loop takes
    that loop, as asyncio's does, and works over a real connection."""

    async def main():
        reader = streams.StreamReader()
        protocol = streams.StreamReaderProtocol(reader)
        assert protocol._loop is loop
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await loop.create_connection(lambda: protocol, "127.0.0.1", port)
        data = await asyncio.wait_for(reader.read(), TIMEOUT)
        transport.close()
        server.close()
        await server.wait_closed()
        return data

    assert run(loop, main()) == b""


def test_close_waiter_and_done_future_as_asyncio(loop, streams):
    """wait_closed() before and after the end, a close with an error that
    nobody retrieves (not reported), and the writer's completed future."""

    async def main():
        contexts = []
        loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
        server, (reader, writer), (_, peer) = await connected_streams(streams)
        assert writer._complete_fut.done() and writer._complete_fut.result() is None
        waiting = asyncio.ensure_future(writer.wait_closed())
        await asyncio.sleep(0)
        assert not waiting.done()
        writer.close()
        await asyncio.wait_for(waiting, TIMEOUT)
        await writer.wait_closed()
        # The peer's end closed by an error no one asks about.
        peer.transport._force_close(ConnectionResetError("reset"))
        await asyncio.sleep(0.05)
        with pytest.raises(ConnectionResetError):
            await peer.wait_closed()
        server.close()
        await server.wait_closed()
        del peer, reader, writer
        gc.collect()
        return contexts

    assert run(loop, main()) == []


# -- failures and resources ------------------------------------------------------


def test_exported_buffer_fails_the_connection_as_asyncio(loop, streams):
    """A view held on the reader's buffer makes the next append fail (a
    bytearray with exports cannot grow): asyncio reports it as the
    protocol's data_received failing and closes the transport."""

    async def main():
        contexts = []
        loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
        server, (reader, writer), (_, peer) = await connected_streams(streams)
        peer.write(b"first\n")
        assert await reader.readline() == b"first\n"
        view = memoryview(reader._buffer)
        peer.write(b"second\n")
        with pytest.raises(BufferError):
            await asyncio.wait_for(reader.readline(), TIMEOUT)
        view.release()
        assert writer.is_closing()
        peer.close()
        server.close()
        await server.wait_closed()
        return [(c["message"], type(c.get("exception")).__name__) for c in contexts]

    assert run(loop, main()) == [("Fatal error: protocol.data_received() call failed.", "BufferError")]


def test_connections_do_not_leak(loop, streams):
    from _support import fd_count, gc_object_count

    async def round_trip(port):
        reader, writer = await streams.open_connection("127.0.0.1", port)
        writer.write(b"ping\n")
        assert await reader.readline() == b"ping\n"
        writer.close()
        await writer.wait_closed()

    async def main():
        server = await streams.start_server(_echo_lines, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        for _ in range(50):
            await round_trip(port)
        await asyncio.sleep(0.05)
        gc.collect()
        objects, fds = gc_object_count(), fd_count()
        for _ in range(300):
            await round_trip(port)
        await asyncio.sleep(0.05)
        gc.collect()
        grown = gc_object_count() - objects, fd_count() - fds
        server.close()
        await server.wait_closed()
        return grown

    objects, fds = run(loop, main(), timeout=60)
    assert fds <= 0 and objects < 200, (objects, fds)
