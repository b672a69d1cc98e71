"""Methods patched on asyncio's own stream classes reach native streams too.

Test suites patch asyncio's classes while they run
(``mock.patch.object(asyncio.StreamWriter, "writelines")``, as redis-py's
does): asyncio's streams then call the patch. zuvrs.streams' classes define
native methods ahead of asyncio's, and must call it all the same
(src/streams/patched.rs). Each test runs the same body with asyncio's
stream classes and with zuvrs.streams', on the stdlib loop and on zuvrs.
"""

import asyncio
import contextlib
from unittest import mock

import pytest
from _support import TIMEOUT, connected_streams, run

zs = pytest.importorskip("zuvrs.streams")

IMPLEMENTATIONS = {"asyncio": asyncio, "native": zs}

ASYNCIO_CLASSES = {
    "StreamReader": asyncio.StreamReader,
    "StreamWriter": asyncio.StreamWriter,
    "StreamReaderProtocol": asyncio.StreamReaderProtocol,
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def streams(request):
    """The stream module under test: asyncio's or zuvrs.streams."""
    return IMPLEMENTATIONS[request.param]


def test_every_native_method_is_watched():
    """A method a native core defines ahead of asyncio's is on its watch
    list (a new native method cannot be left out)."""
    for core, (asyncio_class, names, built_on) in zs._NATIVE_METHODS.items():
        shared = {
            name for name, value in vars(core).items()
            if name in vars(asyncio_class) and callable(vars(asyncio_class)[name])
        }
        assert shared, core
        assert shared <= set(names), (core, shared - set(names))
        assert all(dep in names for deps in built_on.values() for dep in deps)


@contextlib.contextmanager
def recording(calls, names_by_class):
    """Every named method of asyncio's classes replaced by one that notes
    its name in `calls` and calls asyncio's own."""
    with contextlib.ExitStack() as stack:
        for class_name, names in names_by_class.items():
            cls = ASYNCIO_CLASSES[class_name]
            for name in names:
                original = vars(cls)[name]

                def wrapper(self, *args, __original=original, __name=f"{class_name}.{name}", **kwargs):
                    calls.append(__name)
                    return __original(self, *args, **kwargs)

                stack.enter_context(mock.patch.object(cls, name, wrapper))
        yield


def _watched():
    return {
        asyncio_class.__name__: [n for n in names if n in vars(asyncio_class)]
        for asyncio_class, names, _ in zs._NATIVE_METHODS.values()
    }


# What a line echo over a connection calls on every implementation.
ECHO_CALLS = {
    "StreamReaderProtocol.connection_made", "StreamReaderProtocol.data_received",
    "StreamReaderProtocol.eof_received", "StreamReaderProtocol.connection_lost",
    "StreamReader.feed_data", "StreamReader.feed_eof", "StreamReader.set_transport",
    "StreamReader.readline", "StreamReader.readuntil", "StreamReader.readexactly", "StreamReader.read",
    "StreamWriter.write", "StreamWriter.writelines", "StreamWriter.drain",
}


async def _echo(streams):
    """A line echoed over 127.0.0.1 and the connection closed from the
    client's end; the client's and the server's results."""
    got = asyncio.get_running_loop().create_future()

    async def handle(reader, writer):
        line = await reader.readline()
        writer.writelines([line])
        await writer.drain()
        got.set_result((line, await reader.read()))
        writer.close()

    server = await streams.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await streams.open_connection("127.0.0.1", port)
    writer.write(b"hello\n")
    await writer.drain()
    echoed = await reader.readexactly(6)
    writer.write_eof()
    server_saw = await asyncio.wait_for(got, TIMEOUT)
    rest = await reader.read()
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()
    return echoed, rest, server_saw


def test_patched_methods_are_called_as_by_asyncio(loop, streams):
    """Every watched method patched at once: a line echo calls the patches
    (the transport's native feeding of the reader steps aside too) and
    gives asyncio's results."""
    calls = []
    with recording(calls, _watched()):
        result = run(loop, _echo(streams))
    assert result == (b"hello\n", b"", (b"hello\n", b""))
    assert ECHO_CALLS <= set(calls), ECHO_CALLS - set(calls)


def test_native_again_once_unpatched(loop, streams):
    """A patch undone leaves the native methods native again (the watch's
    answer is not kept past a change of asyncio's class)."""

    async def main():
        reader = streams.StreamReader(loop=asyncio.get_running_loop())
        with mock.patch.object(asyncio.StreamReader, "readline", mock.AsyncMock(return_value=b"patched")):
            assert await reader.readline() == b"patched"
        reader.feed_data(b"real\n")
        assert await reader.readline() == b"real\n"
        with mock.patch.object(asyncio.StreamReader, "readline", mock.AsyncMock(return_value=b"again")):
            assert await reader.readline() == b"again"
        reader.feed_eof()
        assert await reader.readline() == b""

    run(loop, main())


def test_writer_patches(loop, streams):
    """redis-py's case (a writelines that fails), write and drain."""

    async def main():
        server, (_, writer), (peer_reader, peer_writer) = await connected_streams(streams)
        refused = mock.Mock(side_effect=ConnectionRefusedError)
        with mock.patch.object(asyncio.StreamWriter, "writelines", refused):
            with pytest.raises(ConnectionRefusedError):
                writer.writelines([b"never"])
        assert refused.call_count == 1
        written = []
        with mock.patch.object(asyncio.StreamWriter, "write", lambda self, data: written.append(data)):
            writer.write(b"kept back")
        assert written == [b"kept back"]
        with mock.patch.object(asyncio.StreamWriter, "drain", mock.AsyncMock(return_value="patched")):
            assert await writer.drain() == "patched"
        assert await writer.drain() is None
        writer.write(b"sent")
        writer.write_eof()
        assert await asyncio.wait_for(peer_reader.read(), TIMEOUT) == b"sent"
        peer_writer.close()
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()

    run(loop, main())


# Reader methods patched with a Mock: (name, arguments, what the call gives).
READER_CALLS = [
    ("read", (5,), "awaited"),
    ("read", (), "awaited"),
    ("readexactly", (3,), "awaited"),
    ("readline", (), "awaited"),
    ("readuntil", (b"!",), "awaited"),
    ("readuntil", (), "awaited"),
    ("feed_data", (b"x",), "returned"),
    ("feed_eof", (), "returned"),
    ("at_eof", (), "returned"),
    ("exception", (), "returned"),
    ("set_exception", (ValueError("x"),), "returned"),
    ("set_transport", (None,), "returned"),
    ("_maybe_resume_transport", (), "returned"),
    ("_wakeup_waiter", (), "returned"),
]


@pytest.mark.parametrize("name, args, kind", READER_CALLS, ids=lambda v: v if isinstance(v, str) else None)
def test_reader_patches(loop, streams, name, args, kind):
    async def main():
        reader = streams.StreamReader(loop=asyncio.get_running_loop())
        patch = mock.AsyncMock(return_value="patched") if kind == "awaited" else mock.Mock(return_value="patched")
        with mock.patch.object(asyncio.StreamReader, name, patch):
            result = getattr(reader, name)(*args)
            if kind == "awaited":
                result = await result
        patch.assert_called_once_with(*args)
        return result

    assert run(loop, main()) == "patched"


def test_async_iteration_patched(loop, streams):
    async def main():
        reader = streams.StreamReader(loop=asyncio.get_running_loop())
        lines = iter([b"one\n", b"two\n"])

        async def anext(self):
            try:
                return next(lines)
            except StopIteration:
                raise StopAsyncIteration from None

        with mock.patch.object(asyncio.StreamReader, "__anext__", anext):
            return [line async for line in reader]

    assert run(loop, main()) == [b"one\n", b"two\n"]


def test_what_reads_are_built_on_patched(loop, streams):
    """A patched _wait_for_data is what every read waits with, as under
    asyncio (the native reads then are asyncio's)."""

    async def main():
        loop = asyncio.get_running_loop()
        reader = streams.StreamReader(loop=loop)
        waits = []
        original = asyncio.StreamReader._wait_for_data

        async def wait_for_data(self, func_name):
            waits.append(func_name)
            await original(self, func_name)

        with mock.patch.object(asyncio.StreamReader, "_wait_for_data", wait_for_data):
            for read, data in [(reader.readline(), b"a\n"), (reader.readexactly(2), b"bc"),
                               (reader.read(10), b"d"), (reader.readuntil(b"!"), b"e!")]:
                task = asyncio.ensure_future(read)
                await asyncio.sleep(0)
                loop.call_soon(reader.feed_data, data)
                assert await task == data
        return waits

    assert run(loop, main()) == ["readuntil", "readexactly", "read", "readuntil"]


def test_data_received_patched_on_an_open_connection(loop, streams):
    """A patch made while a connection is open reaches its next reads (the
    transport stops feeding the native reader directly)."""

    async def main():
        server, (reader, writer), (_, peer_writer) = await connected_streams(streams)
        peer_writer.write(b"before\n")
        assert await reader.readline() == b"before\n"
        seen = []
        original = asyncio.StreamReaderProtocol.data_received

        def data_received(self, data):
            seen.append(data)
            original(self, data)

        with mock.patch.object(asyncio.StreamReaderProtocol, "data_received", data_received):
            peer_writer.write(b"during\n")
            assert await reader.readline() == b"during\n"
        peer_writer.write(b"after\n")
        assert await reader.readline() == b"after\n"
        writer.close()
        peer_writer.close()
        server.close()
        await server.wait_closed()
        return seen

    assert run(loop, main()) == [b"during\n"]


def test_an_answer_is_kept_while_asyncio_is_unchanged(loop):
    """The native methods look at asyncio's classes again only after one
    of them changed, not on every call (on every supported Python: how
    CPython marks a changed class differs from 3.13 on)."""
    from zuvrs import _zuvrs

    async def main():
        reader = zs.StreamReader(loop=asyncio.get_running_loop())
        reader.at_eof()
        before = _zuvrs.asyncio_patch_looks()
        for _ in range(100):
            reader.at_eof()
            reader.feed_data(b"x")
        steady = _zuvrs.asyncio_patch_looks() - before
        with mock.patch.object(asyncio.StreamReader, "at_eof", lambda self: "patched"):
            assert reader.at_eof() == "patched"
            assert reader.at_eof() == "patched"
        assert not reader.at_eof()
        return steady, _zuvrs.asyncio_patch_looks() - before

    steady, after_patch = run(loop, main())
    assert steady == 0
    # The patch and its undoing: a look after each (not one per call).
    assert 1 <= after_patch <= 4
