"""TCP: transports, protocols, streams and servers.

Every test runs the same body on asyncio's selector loop (the reference)
and on zuvrs. TCP transports, servers and the sock_* primitives under them
are native in zuvrs; create_connection / create_server / streams / Server
objects come from asyncio.BaseEventLoop on top of them.
"""

import array
import asyncio
import errno
import gc
import hashlib
import logging
import socket
import struct
import sys
import warnings
import zlib
from asyncio import trsock

import pytest
from _support import (
    KEEP_PICKS,
    PY312,
    PY313,
    TIMEOUT,
    ChunkKeeper,
    RecordingProtocol,
    TcpPair,
    check_kept_chunks,
    check_kept_chunks_memory,
    collect_exceptions,
    fd_count,
    ipv6_loopback_works,
    last_json_line,
    malloc_usable_size,
    numbered_chunks,
    one_at_a_time,
    payload,
    run,
    run_child,
    unused_tcp_port,
    wait_until,
)


def reference_loop(loop):
    """True for the stdlib selector loop (the reference), False for zuvrs."""
    return isinstance(loop, asyncio.selector_events.BaseSelectorEventLoop)


def skip_asyncio_310_pause_on_connect(loop):
    """Before 3.11 asyncio's selector transport ignores pause_reading() called
    in connection_made(): it adds the reader right after, regardless (3.11
    made _add_reader check is_reading()). A server that pauses on connect
    then keeps reading, so flow-control tests cannot use it as reference."""
    if sys.version_info < (3, 11) and reference_loop(loop):
        pytest.skip("asyncio < 3.11 ignores pause_reading() in connection_made()")


KiB = 1024
MiB = 1024 * KiB


def sha256(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.hexdigest()


async def fill_until_buffered(transport, chunks, minimum):
    """Write ``chunks`` (an iterator) until at least ``minimum`` bytes stay in
    the transport's buffer across loop iterations, i.e. the kernel buffers
    are full too (the peer must not be reading). Returns what was written,
    as one bytes object."""
    written = []
    total = 0
    while True:
        while transport.get_write_buffer_size() < minimum:
            chunk = next(chunks)
            transport.write(chunk)
            written.append(chunk)
            total += len(chunk)
            assert total < 512 * MiB, "write buffer never filled"
        # Let the loop push what it can into the kernel.
        for _ in range(3):
            await asyncio.sleep(0)
        if transport.get_write_buffer_size() >= minimum:
            return b"".join(written)


def flow_events(events):
    """The pause_writing/resume_writing calls among ``events``."""
    return [e for e in events if e in ("pause_writing", "resume_writing")]


def assert_alternating(flow):
    """pause_writing and resume_writing alternate, starting with a pause."""
    assert flow[::2] == ["pause_writing"] * len(flow[::2]), flow
    assert flow[1::2] == ["resume_writing"] * len(flow[1::2]), flow


def rst_close(sock):
    """Close ``sock`` with an RST instead of a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


# -- echo ------------------------------------------------------------------------


def test_echo_protocol_pipelined(loop):
    messages = [payload(KiB, seed=i) for i in range(2000)]

    async def main():
        pair = await TcpPair.open(lambda: RecordingProtocol(echo=True))
        try:
            for m in messages:
                pair.client.transport.write(m)
            await pair.client.received(len(messages) * KiB)
            assert pair.client.nbytes == len(messages) * KiB
            assert pair.client.sha.hexdigest() == sha256(*messages)
            assert pair.server.sha.hexdigest() == sha256(*messages)
            assert pair.client.data_types == {bytes}
            assert pair.server.data_types == {bytes}
        finally:
            await pair.aclose()

    run(loop, main(), 20)


def test_echo_protocol_ping_pong(loop):
    messages = [payload(KiB, seed=i) for i in range(500)]

    async def main():
        pair = await TcpPair.open(lambda: RecordingProtocol(echo=True))
        try:
            for i, m in enumerate(messages):
                pair.client.transport.write(m)
                await pair.client.received((i + 1) * KiB)
                assert pair.client.nbytes == (i + 1) * KiB
            assert bytes(pair.client.data) == b"".join(messages)
            # Orderly close from the client: the server sees EOF and closes.
            pair.client.transport.close()
            assert await asyncio.wait_for(pair.client.lost, TIMEOUT) is None
            assert await asyncio.wait_for(pair.server.lost, TIMEOUT) is None
            assert pair.server.events == ["made", "data", "eof", "lost"]
            assert pair.client.events == ["made", "data", "lost"]
        finally:
            await pair.aclose()

    run(loop, main(), 20)


async def _stream_echo_handler(reader, writer):
    try:
        while True:
            data = await reader.read(64 * KiB)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


def test_echo_streams_ping_pong(loop):
    messages = [payload(KiB, seed=i) for i in range(1000)]

    async def main():
        srv = await asyncio.start_server(_stream_echo_handler, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        h = hashlib.sha256()
        for m in messages:
            writer.write(m)
            await writer.drain()
            got = await asyncio.wait_for(reader.readexactly(KiB), TIMEOUT)
            h.update(got)
        assert writer.can_write_eof()
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
        assert reader.at_eof()
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), TIMEOUT)
        srv.close()
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)
        return h.hexdigest()

    assert run(loop, main(), 20) == sha256(*messages)


def test_echo_streams_pipelined(loop):
    messages = [payload(KiB, seed=i) for i in range(4000)]
    total = len(messages) * KiB

    async def main():
        srv = await asyncio.start_server(_stream_echo_handler, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def send():
            for m in messages:
                writer.write(m)
                await writer.drain()

        sender = asyncio.create_task(send())
        got = await asyncio.wait_for(reader.readexactly(total), 10)
        await sender
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), TIMEOUT)
        srv.close()
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)
        return hashlib.sha256(got).hexdigest()

    assert run(loop, main(), 20) == sha256(*messages)


BULK_BLOCK = MiB
BULK_COUNT = 100  # 100 MiB each way


def _bulk_expected(block):
    crc = 0
    for chunk in numbered_chunks(block, BULK_COUNT):
        crc = zlib.crc32(chunk, crc)
    return BULK_BLOCK * BULK_COUNT, crc


async def _bulk_send(writer, block):
    for chunk in numbered_chunks(block, BULK_COUNT):
        writer.write(chunk)
        await writer.drain()
    writer.write_eof()


async def _bulk_recv(reader):
    crc = n = 0
    while True:
        data = await reader.read(256 * KiB)
        if not data:
            return n, crc
        n += len(data)
        crc = zlib.crc32(data, crc)


def test_bulk_100mib_both_directions(loop):
    up, down = payload(BULK_BLOCK, seed=1), payload(BULK_BLOCK, seed=2)

    async def main():
        server_result = asyncio.get_running_loop().create_future()

        async def handler(reader, writer):
            try:
                received, _ = await asyncio.gather(_bulk_recv(reader), _bulk_send(writer, down))
                server_result.set_result(received)
            except BaseException as exc:  # surface server-side failures in the test
                if not server_result.done():
                    server_result.set_exception(exc)
                raise
            finally:
                writer.close()

        srv = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client_received, _ = await asyncio.gather(_bulk_recv(reader), _bulk_send(writer, up))
        server_received = await asyncio.wait_for(server_result, 30)
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), TIMEOUT)
        srv.close()
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)
        return client_received, server_received

    client_received, server_received = run(loop, main(), 60)
    assert server_received == _bulk_expected(up)
    assert client_received == _bulk_expected(down)


# -- transport API -------------------------------------------------------------------


def test_extra_info_socket_taken_before_and_after_close(loop):
    # The socket extra taken while open works on the connection's fd; once
    # the transport has closed, the same object (and one taken only then)
    # shows a closed socket of the same kind, as asyncio's do, and the fd is
    # not closed twice.
    async def main():
        pair = await TcpPair.open()
        ct, st = pair.client.transport, pair.server.transport
        early = ct.get_extra_info("socket")
        assert early.getpeername() == ct.get_extra_info("peername")
        assert early.fileno() >= 0
        await pair.aclose()
        late = st.get_extra_info("socket")
        for sock in (early, late):
            assert isinstance(sock, trsock.TransportSocket)
            assert sock.family == socket.AF_INET
            assert sock.fileno() == -1
        assert ct.get_extra_info("socket") is early

    run(loop, main())


def test_extra_info_first_asked_after_close(loop):
    # Names nobody asked for while the connection was open are still there
    # after it closed, on both ends, with what was not asked for at all
    # answered by the default.
    async def main():
        pair = await TcpPair.open()
        ct, st = pair.client.transport, pair.server.transport
        assert ct.get_extra_info("sslcontext") is None
        assert st.get_extra_info("nothing", "default") == "default"
        await pair.aclose()
        for t in (ct, st):
            assert t.get_extra_info("sockname")[0] == "127.0.0.1"
            assert t.get_extra_info("peername")[0] == "127.0.0.1"
            assert t.get_extra_info("socket").fileno() == -1
            assert t.get_extra_info("nothing", 7) == 7
        assert ct.get_extra_info("sockname") == st.get_extra_info("peername")
        assert ct.get_extra_info("peername") == st.get_extra_info("sockname")

    run(loop, main())


def test_transport_types_and_extra_info(loop):
    async def main():
        pair = await TcpPair.open()
        try:
            ct, st = pair.client.transport, pair.server.transport
            for t in (ct, st):
                assert isinstance(t, asyncio.Transport)
                assert isinstance(t, asyncio.ReadTransport)
                assert isinstance(t, asyncio.WriteTransport)
                sock = t.get_extra_info("socket")
                assert isinstance(sock, trsock.TransportSocket)
                assert sock.family == socket.AF_INET
                assert sock.type == socket.SOCK_STREAM
                assert sock.fileno() >= 0
                assert t.get_extra_info("sockname") == sock.getsockname()
                assert t.get_extra_info("peername") == sock.getpeername()
                assert t.get_extra_info("no such key") is None
                assert t.get_extra_info("no such key", 42) == 42
                assert t.can_write_eof() is True
                assert t.is_closing() is False
                assert t.is_reading() is True
                assert t.get_write_buffer_size() == 0
            assert ct.get_extra_info("peername") == ("127.0.0.1", pair.port)
            assert st.get_extra_info("peername") == ct.get_extra_info("sockname")
            assert st.get_extra_info("sockname") == ct.get_extra_info("peername")
            assert ct.get_protocol() is pair.client
            assert st.get_protocol() is pair.server
            assert ct.get_extra_info("socket").fileno() != st.get_extra_info("socket").fileno()
        finally:
            await pair.aclose()

    run(loop, main())


def test_tcp_nodelay_on_both_ends(loop):
    async def main():
        pair = await TcpPair.open()
        try:
            return [
                t.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                for t in (pair.client.transport, pair.server.transport)
            ]
        finally:
            await pair.aclose()

    client, server = run(loop, main())
    assert client != 0
    assert server != 0


def test_write_buffer_limits(loop):
    async def main():
        pair = await TcpPair.open()
        try:
            t = pair.client.transport
            assert t.get_write_buffer_limits() == (16 * KiB, 64 * KiB)
            t.set_write_buffer_limits(high=1000)
            assert t.get_write_buffer_limits() == (250, 1000)
            t.set_write_buffer_limits(high=1000, low=10)
            assert t.get_write_buffer_limits() == (10, 1000)
            t.set_write_buffer_limits(low=100)
            assert t.get_write_buffer_limits() == (100, 400)
            t.set_write_buffer_limits(2000, 500)
            assert t.get_write_buffer_limits() == (500, 2000)
            t.set_write_buffer_limits(high=0)
            assert t.get_write_buffer_limits() == (0, 0)
            t.set_write_buffer_limits()
            assert t.get_write_buffer_limits() == (16 * KiB, 64 * KiB)
            for bad in ({"high": 10, "low": 20}, {"low": -1}, {"high": -1}, {"high": -4, "low": -1}):
                with pytest.raises(ValueError):
                    t.set_write_buffer_limits(**bad)
                # A rejected call changes nothing.
                assert t.get_write_buffer_limits() == (16 * KiB, 64 * KiB)
        finally:
            await pair.aclose()

    run(loop, main())


def test_write_accepts_bytes_like(loop):
    async def main():
        pair = await TcpPair.open()
        try:
            t = pair.client.transport
            t.write(b"a")
            t.write(bytearray(b"b"))
            t.write(memoryview(b"xcd")[1:])
            t.write(b"")
            t.writelines([b"e", bytearray(b"f"), memoryview(b"g")])
            t.writelines(x for x in (b"h", b"i"))
            t.writelines([])
            await pair.server.received(9)
            await asyncio.sleep(0.02)
            assert bytes(pair.server.data) == b"abcdefghi"
        finally:
            await pair.aclose()

    run(loop, main())


def test_write_any_memoryview_format(loop):
    """A memoryview of any format is written as its raw bytes."""
    ints = array.array("i", [1, 2, 3])
    doubles = array.array("d", [0.5, -2.0])

    async def main():
        pair = await TcpPair.open()
        try:
            t = pair.client.transport
            t.write(memoryview(ints))
            t.writelines([memoryview(doubles), b"!"])
            n = len(ints.tobytes()) + len(doubles.tobytes()) + 1
            await pair.server.received(n)
            return bytes(pair.server.data)
        finally:
            await pair.aclose()

    assert run(loop, main()) == ints.tobytes() + doubles.tobytes() + b"!"


def test_write_copies_mutable_buffers(loop):
    """Changing a bytearray (or what a memoryview shows) after write() does
    not change what is sent."""

    async def main():
        pair = await TcpPair.open(lambda: RecordingProtocol(pause_on_connect=True))
        try:
            t = pair.client.transport
            ba = bytearray(b"original")
            t.write(ba)
            ba[:] = b"MUTATED!"
            backing = bytearray(b"viewdata")
            t.write(memoryview(backing))
            backing[:] = b"CHANGED!"
            # Also when the data has to wait in the transport's buffer.
            await fill_until_buffered(t, numbered_chunks(payload(256 * KiB), 10**6), 2 * MiB)
            late = bytearray(b"late")
            t.write(late)
            late[:] = b"LATE"
            before = pair.server.nbytes
            pair.server.transport.resume_reading()
            t.close()
            await asyncio.wait_for(pair.server.lost, 10)
            data = bytes(pair.server.data)
            return before, data
        finally:
            await pair.aclose()

    _, data = run(loop, main(), 20)
    assert data.startswith(b"originalviewdata")
    if reference_loop(loop) and sys.version_info >= (3, 12):
        # asyncio's selector transport buffers write() data without copying
        # from 3.12 (GH-91166, zero-copy writes): the reference sends what the
        # bytearray holds when the buffer is flushed. zuvrs copies, as asyncio
        # did before 3.12.
        assert data.endswith((b"late", b"LATE"))
    else:
        assert data.endswith(b"late")


def test_many_small_writes_in_one_turn(loop):
    """100,000 tiny writes without yielding arrive complete and in order."""
    records = [b"%09d\n" % i for i in range(100_000)]

    async def main():
        pair = await TcpPair.open(lambda: RecordingProtocol(keep_data=False))
        try:
            t = pair.client.transport
            for r in records[:50_000]:
                t.write(r)
            t.writelines(records[50_000:])
            await pair.server.received(10 * len(records), timeout=10)
            return pair.server.nbytes, pair.server.sha.hexdigest()
        finally:
            await pair.aclose()

    assert run(loop, main(), 20) == (10 * len(records), sha256(*records))


def test_write_rejects_non_bytes(loop):
    async def main():
        pair = await TcpPair.open()
        try:
            t = pair.client.transport
            for bad in ("str", 123, None, array.array("b", b"xy"), [b"a"]):
                with pytest.raises(TypeError):
                    t.write(bad)
            # writelines with a bad item raises and writes nothing of it.
            with pytest.raises(TypeError):
                t.writelines([b"partial", "str"])
            t.write(b"END")
            await pair.server.received(3)
            await asyncio.sleep(0.05)
            assert bytes(pair.server.data) == b"END"
            assert not t.is_closing()
        finally:
            await pair.aclose()

    run(loop, main())


def test_write_after_write_eof_raises(loop):
    async def main():
        pair = await TcpPair.open(lambda: RecordingProtocol(eof_result=True))
        try:
            t = pair.client.transport
            t.write(b"data")
            t.write_eof()
            t.write_eof()  # a second call is a no-op
            for data in (b"x", b""):
                with pytest.raises(RuntimeError, match="write_eof"):
                    t.write(data)
            with pytest.raises(RuntimeError):
                t.writelines([b"x"])
            with pytest.raises(RuntimeError):
                t.writelines([])
            assert not t.is_closing()
            await asyncio.wait_for(pair.server.eof, TIMEOUT)
            assert bytes(pair.server.data) == b"data"
            # The client still reads after write_eof().
            pair.server.transport.write(b"reply")
            await pair.client.received(5)
            assert bytes(pair.client.data) == b"reply"
        finally:
            await pair.aclose()

    run(loop, main())


def test_writes_after_close_are_dropped(loop, caplog):
    async def main():
        pair = await TcpPair.open()
        try:
            t = pair.client.transport
            t.write(b"before")
            await pair.server.received(6)
            t.close()
            assert t.is_closing()
            # Dropped silently; asyncio warns from the 5th write on.
            for _ in range(10):
                t.write(b"after")
            await asyncio.wait_for(pair.client.lost, TIMEOUT)
            t.write(b"after lost")
            await asyncio.wait_for(pair.server.lost, TIMEOUT)
            assert bytes(pair.server.data) == b"before"
            assert pair.server.events == ["made", "data", "eof", "lost"]
        finally:
            await pair.aclose()

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        run(loop, main())
    warnings = [r for r in caplog.records if r.getMessage() == "socket.send() raised exception."]
    # connection-lost writes number 5 to 11 warn
    assert len(warnings) == 7


def test_set_protocol_switches_delivery(loop):
    async def main():
        pair = await TcpPair.open()
        try:
            t = pair.client.transport
            pair.server.transport.write(b"one")
            await pair.client.received(3)
            other = RecordingProtocol()
            t.set_protocol(other)
            assert t.get_protocol() is other
            pair.server.transport.write(b"two")
            await other.received(3)
            assert bytes(other.data) == b"two"
            assert bytes(pair.client.data) == b"one"
            pair.server.transport.close()
            # EOF and connection_lost go to the new protocol.
            await asyncio.wait_for(other.lost, TIMEOUT)
            assert other.events == ["data", "eof", "lost"]
            assert not pair.client.lost.done()
        finally:
            await pair.aclose()

    run(loop, main())


@pytest.mark.parametrize("keep", ["all", "some", "none"])
def test_data_received_bytes_stay_what_they_were(loop, keep):
    # Messages of 70-250 KiB, each sent once the previous one was answered,
    # so most reads are shorter than a read buffer but large.
    async def main():
        pair = await TcpPair.open(client_factory=lambda: ChunkKeeper(KEEP_PICKS[keep]))
        try:
            await check_kept_chunks(pair.server, pair.client, KEEP_PICKS[keep])
        finally:
            await pair.aclose()

    run(loop, main())


def test_kept_data_costs_about_its_size(loop):
    if malloc_usable_size() is None:
        pytest.skip("needs glibc's malloc_usable_size")

    async def main():
        pair = await TcpPair.open(client_factory=lambda: ChunkKeeper(KEEP_PICKS["all"]))
        try:
            await check_kept_chunks_memory(pair.server, pair.client)
        finally:
            await pair.aclose()

    run(loop, main())


def test_set_protocol_between_plain_and_buffered(loop):
    async def main():
        pair = await TcpPair.open()
        try:
            t, st = pair.client.transport, pair.server.transport
            st.write(b"plain")
            await pair.client.received(5)
            buffered = RecordingBufferedProtocol()
            t.set_protocol(buffered)
            st.write(b"buffered")
            await wait_until(lambda: len(buffered.received) >= 8)
            assert bytes(buffered.received) == b"buffered"
            plain = RecordingProtocol()
            t.set_protocol(plain)
            st.write(b"plain again")
            await plain.received(11)
            assert bytes(plain.data) == b"plain again"
            assert bytes(pair.client.data) == b"plain"
            assert bytes(buffered.received) == b"buffered"
        finally:
            await pair.aclose()

    run(loop, main())


def test_pause_reading_stops_data_received(loop):
    async def main():
        pair = await TcpPair.open()
        try:
            ct, st = pair.client.transport, pair.server.transport
            assert ct._paused is False  # asyncio's attribute, read by code outside it
            ct.pause_reading()
            assert ct.is_reading() is False
            assert ct._paused is True
            ct.pause_reading()  # idempotent
            st.write(b"while paused")
            await asyncio.sleep(0.1)
            assert pair.client.nbytes == 0
            ct.resume_reading()
            assert ct.is_reading() is True
            assert ct._paused is False
            ct.resume_reading()  # idempotent
            await pair.client.received(12)
            assert bytes(pair.client.data) == b"while paused"
            # EOF is not seen while paused either.
            ct.pause_reading()
            st.write(b"+more")
            st.close()
            await asyncio.wait_for(pair.server.lost, TIMEOUT)
            await asyncio.sleep(0.1)
            assert not pair.client.eof.done()
            assert pair.client.nbytes == 12
            ct.resume_reading()
            assert await asyncio.wait_for(pair.client.lost, TIMEOUT) is None
            assert bytes(pair.client.data) == b"while paused+more"
            assert pair.client.events == ["made", "data", "eof", "lost"]
            # A closed transport is not reading, and pause/resume are no-ops.
            assert ct.is_closing() is True
            assert ct.is_reading() is False
            ct.pause_reading()
            ct.resume_reading()
            assert ct.is_reading() is False
        finally:
            await pair.aclose()

    run(loop, main())


def test_flow_control_pause_and_resume_writing(loop):
    skip_asyncio_310_pause_on_connect(loop)
    chunk = payload(64 * KiB, seed=3)
    high = 64 * KiB

    async def main():
        # The server does not read until told to.
        pair = await TcpPair.open(lambda: RecordingProtocol(keep_data=False, pause_on_connect=True))
        try:
            client, t = pair.client, pair.client.transport
            t.set_write_buffer_limits(high=high)
            low = t.get_write_buffer_limits()[0]
            # A well-behaved producer: writes while not paused, yielding to
            # the loop, until it has been paused for 0.2 s.
            sent = 0
            paused_since = None
            deadline = loop.time() + 10
            while True:
                assert loop.time() < deadline, "producer never got stuck"
                if client.writing_paused:
                    if paused_since is None:
                        paused_since = loop.time()
                    elif loop.time() - paused_since > 0.2:
                        break
                    await asyncio.sleep(0.01)
                else:
                    paused_since = None
                    t.write(chunk)
                    sent += len(chunk)
                    await asyncio.sleep(0)
            assert client.pause_writing_calls >= 1
            assert client.pause_writing_calls == client.resume_writing_calls + 1
            assert_alternating(flow_events(client.events))
            assert all(size > high for size in client.sizes_at_pause), client.sizes_at_pause
            assert all(size <= low for size in client.sizes_at_resume), client.sizes_at_resume
            # Bounded: the buffer holds at most one write beyond the high mark,
            # and only the kernel's socket buffers hold the rest.
            assert high < t.get_write_buffer_size() <= high + len(chunk)
            assert pair.server.nbytes == 0
            assert sent < 64 * MiB
            # The peer drains: resume_writing() is called once the buffer is
            # at or below the low-water mark, and everything arrives.
            pauses = client.pause_writing_calls
            pair.server.transport.resume_reading()
            await client.until(lambda: client.resume_writing_calls == pauses, what="resume_writing()")
            assert client.sizes_at_resume[-1] <= low
            await pair.server.received(sent, timeout=10)
            assert pair.server.nbytes == sent
            assert pair.server.sha.hexdigest() == sha256(*[chunk] * (sent // len(chunk)))
            assert client.pause_writing_calls == pauses
            assert not client.writing_paused
        finally:
            await pair.aclose()

    run(loop, main(), 20)


def test_pause_writing_on_set_write_buffer_limits(loop):
    async def main():
        pair = await TcpPair.open(lambda: RecordingProtocol(keep_data=False, pause_on_connect=True))
        try:
            client, t = pair.client, pair.client.transport
            written = await fill_until_buffered(t, numbered_chunks(payload(16 * KiB), 10**6), 1)
            assert t.get_write_buffer_size() <= 64 * KiB
            assert not client.writing_paused  # not above the default high-water mark
            pauses = client.pause_writing_calls
            # Lowering the limits under the buffered amount pauses at once.
            t.set_write_buffer_limits(high=0)
            assert client.pause_writing_calls == pauses + 1
            assert client.writing_paused
            pair.server.transport.resume_reading()
            await client.until(lambda: client.resume_writing_calls, what="resume_writing()")
            assert t.get_write_buffer_size() == 0
            await pair.server.received(len(written), timeout=10)
            assert pair.server.sha.hexdigest() == sha256(written)
        finally:
            await pair.aclose()

    run(loop, main(), 20)


@pytest.mark.parametrize("which", ["pause_writing", "resume_writing"])
def test_flow_control_callback_errors_are_reported(loop, which):
    contexts = collect_exceptions(loop)

    class Failing(RecordingProtocol):
        def pause_writing(self):
            super().pause_writing()
            if which == "pause_writing":
                raise ZeroDivisionError(which)

        def resume_writing(self):
            super().resume_writing()
            if which == "resume_writing":
                raise ZeroDivisionError(which)

    async def main():
        pair = await TcpPair.open(
            lambda: RecordingProtocol(keep_data=False, pause_on_connect=True), client_factory=Failing
        )
        try:
            t = pair.client.transport
            written = await fill_until_buffered(t, numbered_chunks(payload(256 * KiB), 10**6), MiB)
            assert pair.client.pause_writing_calls >= 1
            pair.server.transport.resume_reading()
            await pair.client.until(lambda: not pair.client.writing_paused, what="resume_writing()")
            await pair.server.received(len(written), timeout=10)
            # The transport carries on.
            assert not t.is_closing()
            t.write(b"more")
            await pair.server.received(len(written) + 4)
            return pair.client
        finally:
            await pair.aclose()

    client = run(loop, main(), 20)
    assert contexts, "no error reported"
    for _, ctx in contexts:
        assert ctx["message"] == f"protocol.{which}() failed"
        assert type(ctx["exception"]) is ZeroDivisionError
        assert ctx["transport"] is client.transport
        assert ctx["protocol"] is client


def test_close_flushes_pending_data_before_eof(loop):
    skip_asyncio_310_pause_on_connect(loop)
    async def main():
        pair = await TcpPair.open(lambda: RecordingProtocol(keep_data=False, pause_on_connect=True))
        try:
            client, t = pair.client, pair.client.transport
            written = await fill_until_buffered(t, numbered_chunks(payload(256 * KiB), 10**6), 2 * MiB)
            t.close()
            assert t.is_closing()
            assert t.get_write_buffer_size() > 0
            await asyncio.sleep(0.1)
            # Pending data keeps the connection open.
            assert not client.lost.done()
            assert not pair.server.eof.done()
            pair.server.transport.resume_reading()
            assert await asyncio.wait_for(client.lost, 10) is None
            assert t.get_write_buffer_size() == 0
            await asyncio.wait_for(pair.server.lost, TIMEOUT)
            assert pair.server.nbytes == len(written)
            assert pair.server.sha.hexdigest() == sha256(written)
            assert pair.server.events[-3:] == ["data", "eof", "lost"]
            flow = flow_events(client.events)
            assert [e for e in client.events if e not in flow] == ["made", "lost"]
            assert_alternating(flow)
            # Draining while closing still resumes the writer.
            assert flow[-1] == "resume_writing"
        finally:
            await pair.aclose()

    run(loop, main(), 20)


def test_abort_drops_pending_data(loop):
    async def main():
        pair = await TcpPair.open(lambda: RecordingProtocol(pause_on_connect=True))
        try:
            client, t = pair.client, pair.client.transport
            written = await fill_until_buffered(t, numbered_chunks(payload(256 * KiB), 10**6), 2 * MiB)
            t.abort()
            assert t.is_closing()
            assert t.get_write_buffer_size() == 0
            t.abort()  # a second abort is a no-op
            t.close()
            assert await asyncio.wait_for(client.lost, TIMEOUT) is None
            flow = flow_events(client.events)
            assert [e for e in client.events if e not in flow] == ["made", "lost"]
            assert_alternating(flow)
            assert flow[-1] == "pause_writing"
            pair.server.transport.resume_reading()
            await asyncio.wait_for(pair.server.lost, TIMEOUT)
            # The peer got a prefix of the stream, not all of it.
            assert 0 < pair.server.nbytes < len(written)
            assert bytes(pair.server.data) == written[: pair.server.nbytes]
        finally:
            await pair.aclose()

    run(loop, main(), 20)


def test_abort_stops_delivery(loop):
    async def main():
        pair = await TcpPair.open()
        try:
            client = pair.client
            client.transport.pause_reading()
            pair.server.transport.write(b"never delivered")
            await asyncio.sleep(0.05)
            client.transport.abort()
            assert await asyncio.wait_for(client.lost, TIMEOUT) is None
            await asyncio.sleep(0.05)
            assert client.events == ["made", "lost"]
            assert client.nbytes == 0
        finally:
            await pair.aclose()

    run(loop, main())


def _reset_scenario(loop, while_writing):
    async def main():
        lsock = socket.create_server(("127.0.0.1", 0))
        lsock.setblocking(False)
        try:
            port = lsock.getsockname()[1]
            t, client = await loop.create_connection(RecordingProtocol, "127.0.0.1", port)
            conn, _ = await asyncio.wait_for(loop.sock_accept(lsock), TIMEOUT)
            if while_writing:
                t.pause_reading()
            rst_close(conn)
            await asyncio.sleep(0.05)
            if while_writing:
                t.write(b"into a reset connection")
            exc = await asyncio.wait_for(client.lost, TIMEOUT)
            await asyncio.sleep(0.02)
            return exc, list(client.events), t.is_closing()
        finally:
            lsock.close()

    return run(loop, main())


def test_peer_reset_while_reading(loop):
    exc, events, closing = _reset_scenario(loop, while_writing=False)
    assert type(exc) is ConnectionResetError
    assert exc.errno == errno.ECONNRESET
    assert events == ["made", "lost"]
    assert closing


def test_peer_reset_while_writing(loop):
    exc, events, closing = _reset_scenario(loop, while_writing=True)
    assert type(exc) is ConnectionResetError
    assert exc.errno == errno.ECONNRESET
    assert events == ["made", "lost"]
    assert closing


def test_peer_reset_with_pending_writes(loop):
    async def main():
        lsock = socket.create_server(("127.0.0.1", 0))
        lsock.setblocking(False)
        try:
            t, client = await loop.create_connection(RecordingProtocol, *lsock.getsockname())
            conn, _ = await asyncio.wait_for(loop.sock_accept(lsock), TIMEOUT)
            # conn never reads: fill every buffer, then reset.
            await fill_until_buffered(t, numbered_chunks(payload(256 * KiB), 10**6), MiB)
            rst_close(conn)
            exc = await asyncio.wait_for(client.lost, TIMEOUT)
            assert t.is_closing()
            assert t.get_write_buffer_size() == 0
            t.write(b"dropped")  # no exception
            return exc
        finally:
            lsock.close()

    exc = run(loop, main(), 20)
    assert type(exc) is ConnectionResetError


def test_peer_reset_seen_by_streams(loop):
    async def main():
        lsock = socket.create_server(("127.0.0.1", 0))
        lsock.setblocking(False)
        try:
            reader, writer = await asyncio.open_connection(*lsock.getsockname())
            conn, _ = await asyncio.wait_for(loop.sock_accept(lsock), TIMEOUT)
            rst_close(conn)
            with pytest.raises(ConnectionResetError):
                await asyncio.wait_for(reader.read(100), TIMEOUT)
            with pytest.raises(ConnectionResetError):
                writer.write(b"x")
                await asyncio.wait_for(writer.drain(), TIMEOUT)
            writer.close()
            with pytest.raises(ConnectionResetError):
                await asyncio.wait_for(writer.wait_closed(), TIMEOUT)
        finally:
            lsock.close()

    run(loop, main())


def test_write_then_abort_sends_what_the_kernel_took(loop):
    """asyncio (like uvloop) hands data to the kernel inside write(), so a
    small write followed at once by abort() still reaches the peer."""

    async def main():
        pair = await TcpPair.open()
        try:
            pair.client.transport.write(b"last words")
            pair.client.transport.abort()
            assert await asyncio.wait_for(pair.server.lost, TIMEOUT) is None
            return bytes(pair.server.data)
        finally:
            await pair.aclose()

    assert run(loop, main()) == b"last words"


def test_write_reaches_peer_before_run_until_complete_returns(loop):
    """Data written by a coroutine is on the wire once run_until_complete()
    returns, even though the loop does not run again."""
    lsock = socket.create_server(("127.0.0.1", 0))
    try:

        async def connect():
            return await loop.create_connection(asyncio.Protocol, *lsock.getsockname())

        t, _ = run(loop, connect())
        conn, _ = lsock.accept()
        with conn:
            conn.settimeout(2)

            async def write():
                t.write(b"sync peer")

            run(loop, write())
            assert conn.recv(100) == b"sync peer"
            t.close()
            run(loop, asyncio.sleep(0.01))
    finally:
        lsock.close()


def test_fd_watchers_refuse_transport_sockets(loop):
    async def main():
        pair = await TcpPair.open()
        try:
            fd = pair.client.transport.get_extra_info("socket").fileno()
            for call in (
                lambda: loop.add_reader(fd, print),
                lambda: loop.add_writer(fd, print),
                lambda: loop.remove_reader(fd),
                lambda: loop.remove_writer(fd),
            ):
                with pytest.raises(RuntimeError, match="is used by transport"):
                    call()
            # The transport is unaffected.
            pair.server.transport.write(b"ok")
            await pair.client.received(2)
        finally:
            await pair.aclose()

    run(loop, main())


def test_half_close_eof_received_true_keeps_writable(loop):
    async def main():
        pair = await TcpPair.open(lambda: RecordingProtocol(eof_result=True))
        try:
            client, server = pair.client, pair.server
            client.transport.write(b"request")
            client.transport.write_eof()
            await asyncio.wait_for(server.eof, TIMEOUT)
            assert bytes(server.data) == b"request"
            await asyncio.sleep(0.05)
            assert not server.transport.is_closing()
            assert not server.lost.done()
            server.transport.write(b"response after eof")
            server.transport.write(b"!")
            await client.received(19)
            assert bytes(client.data) == b"response after eof!"
            server.transport.close()
            assert await asyncio.wait_for(client.lost, TIMEOUT) is None
            assert await asyncio.wait_for(server.lost, TIMEOUT) is None
            assert server.events == ["made", "data", "eof", "lost"]
            assert client.events == ["made", "data", "eof", "lost"]
        finally:
            await pair.aclose()

    run(loop, main())


def test_eof_received_false_closes(loop):
    async def main():
        pair = await TcpPair.open(lambda: RecordingProtocol(eof_result=False))
        try:
            pair.client.transport.write_eof()
            assert await asyncio.wait_for(pair.server.lost, TIMEOUT) is None
            assert pair.server.transport.is_closing()
            assert await asyncio.wait_for(pair.client.lost, TIMEOUT) is None
            assert pair.server.events == ["made", "eof", "lost"]
            assert pair.client.events == ["made", "eof", "lost"]
        finally:
            await pair.aclose()

    run(loop, main())


def test_connection_refused(loop):
    port = unused_tcp_port()

    async def main():
        with pytest.raises(ConnectionRefusedError) as ei:
            await asyncio.wait_for(loop.create_connection(asyncio.Protocol, "127.0.0.1", port), TIMEOUT)
        assert ei.value.errno == errno.ECONNREFUSED
        with pytest.raises(ConnectionRefusedError):
            await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), TIMEOUT)

    run(loop, main())


# -- BufferedProtocol ----------------------------------------------------------


class RecordingBufferedProtocol(asyncio.BufferedProtocol):
    """Hands out small buffers of varying sizes; records what arrives."""

    SIZES = (1, 7, 1000, 4096)

    def __init__(self):
        loop = asyncio.get_running_loop()
        self.transport = None
        self.buf = bytearray(max(self.SIZES))
        self.calls = 0
        self.last_size = None
        self.received = bytearray()
        self.events = []
        self.made = loop.create_future()
        self.eof = loop.create_future()
        self.lost = loop.create_future()

    def connection_made(self, transport):
        self.transport = transport
        self.events.append("made")
        self.made.set_result(transport)

    def get_buffer(self, sizehint):
        size = self.SIZES[self.calls % len(self.SIZES)]
        self.calls += 1
        self.last_size = size
        return memoryview(self.buf)[:size]

    def buffer_updated(self, nbytes):
        assert 0 < nbytes <= self.last_size
        self.received += self.buf[:nbytes]
        if not self.events or self.events[-1] != "data":
            self.events.append("data")

    def eof_received(self):
        self.events.append("eof")
        self.eof.set_result(None)

    def connection_lost(self, exc):
        self.events.append("lost")
        self.lost.set_result(exc)


@pytest.mark.parametrize("action", ["pause_reading", "close", "abort"])
def test_buffered_protocol_stops_after_pause_or_close_in_buffer_updated(loop, action):
    """No buffer_updated() after the protocol paused or closed the transport
    from inside buffer_updated(), even with more data already received."""

    class StopAfterFirst(RecordingBufferedProtocol):
        SIZES = (1000,)

        def buffer_updated(self, nbytes):
            super().buffer_updated(nbytes)
            if len(self.received) == nbytes:  # first call
                getattr(self.transport, action)()

    data = payload(200 * KiB, seed=9)

    async def main():
        pair = await TcpPair.open(client_factory=StopAfterFirst)
        try:
            client = pair.client
            pair.server.transport.write(data)
            await wait_until(lambda: client.received)
            await asyncio.sleep(0.1)
            got_while_stopped = len(client.received)
            if action == "pause_reading":
                client.transport.resume_reading()
                await wait_until(lambda: len(client.received) == len(data))
                assert bytes(client.received) == data
            else:
                await asyncio.wait_for(client.lost, TIMEOUT)
            return got_while_stopped
        finally:
            await pair.aclose()

    assert run(loop, main()) == 1000


@pytest.mark.parametrize("action", ["pause_reading", "close", "abort"])
def test_buffered_protocol_pause_or_close_in_get_buffer(loop, action):
    """A protocol that pauses or closes the transport from inside
    get_buffer() still gets that read (asyncio reads into the buffer
    whatever get_buffer() did), and nothing more while stopped."""

    class StopInGetBuffer(RecordingBufferedProtocol):
        SIZES = (1000,)

        def get_buffer(self, sizehint):
            if self.calls == 0:
                getattr(self.transport, action)()
            return super().get_buffer(sizehint)

    data = payload(200 * KiB, seed=10)

    async def main():
        pair = await TcpPair.open(client_factory=StopInGetBuffer)
        try:
            client = pair.client
            pair.server.transport.write(data)
            await wait_until(lambda: client.received)
            await asyncio.sleep(0.1)
            stopped = (len(client.received), client.calls)
            if action == "pause_reading":
                client.transport.resume_reading()
                await wait_until(lambda: len(client.received) == len(data))
                assert bytes(client.received) == data
            else:
                assert await asyncio.wait_for(client.lost, TIMEOUT) is None
            return stopped
        finally:
            await pair.aclose()

    assert run(loop, main()) == (1000, 1)


def test_buffered_protocol_client_receives_everything(loop):
    data = payload(MiB + 7, seed=5)

    async def main():
        pair = await TcpPair.open(client_factory=RecordingBufferedProtocol)
        try:
            pair.server.transport.write(data)
            pair.server.transport.close()
            client = pair.client
            assert await asyncio.wait_for(client.lost, 10) is None
            assert client.events == ["made", "data", "eof", "lost"]
            assert len(client.received) == len(data)
            assert hashlib.sha256(client.received).digest() == hashlib.sha256(data).digest()
        finally:
            await pair.aclose()

    run(loop, main(), 20)


def test_buffered_protocol_server_receives_everything(loop):
    data = payload(MiB + 7, seed=6)

    async def main():
        pair = await TcpPair.open(RecordingBufferedProtocol)
        try:
            pair.client.transport.write(data)
            pair.client.transport.write_eof()
            server = pair.server
            await asyncio.wait_for(server.lost, 10)
            assert server.events == ["made", "data", "eof", "lost"]
            assert hashlib.sha256(server.received).digest() == hashlib.sha256(data).digest()
        finally:
            await pair.aclose()

    run(loop, main(), 20)


class _FailingBuffered(RecordingBufferedProtocol):
    mode = None

    def get_buffer(self, sizehint):
        if self.mode == "get_buffer raises":
            raise ZeroDivisionError("get_buffer")
        if self.mode == "empty buffer":
            return bytearray()
        return super().get_buffer(sizehint)

    def buffer_updated(self, nbytes):
        if self.mode == "buffer_updated raises":
            raise ZeroDivisionError("buffer_updated")
        super().buffer_updated(nbytes)


@pytest.mark.parametrize(
    "mode, exc_type, message",
    [
        ("get_buffer raises", ZeroDivisionError, "Fatal error: protocol.get_buffer() call failed."),
        ("empty buffer", RuntimeError, "Fatal error: protocol.get_buffer() call failed."),
        ("buffer_updated raises", ZeroDivisionError, "Fatal error: protocol.buffer_updated() call failed."),
    ],
)
def test_buffered_protocol_errors(loop, mode, exc_type, message):
    contexts = collect_exceptions(loop)

    def factory():
        p = _FailingBuffered()
        p.mode = mode
        return p

    async def main():
        pair = await TcpPair.open(factory)
        try:
            pair.client.transport.write(b"trigger")
            exc = await asyncio.wait_for(pair.server.lost, TIMEOUT)
            assert type(exc) is exc_type
            # (EOF or a reset, depending on whether the server read the data.)
            await asyncio.wait_for(pair.client.lost, TIMEOUT)
            return exc, pair.server
        finally:
            await pair.aclose()

    exc, server = run(loop, main())
    assert len(contexts) == 1
    ctx = contexts[0][1]
    assert ctx["message"] == message
    assert ctx["exception"] is exc
    assert ctx["protocol"] is server
    assert ctx["transport"] is server.transport


def test_data_received_exception_goes_to_handler(loop):
    contexts = collect_exceptions(loop)

    class Failing(RecordingProtocol):
        def data_received(self, data):
            super().data_received(data)
            raise ZeroDivisionError("boom")

    async def main():
        pair = await TcpPair.open(Failing)
        try:
            pair.client.transport.write(b"x")
            exc = await asyncio.wait_for(pair.server.lost, TIMEOUT)
            assert pair.server.transport.is_closing()
            # The peer sees the connection close.
            assert await asyncio.wait_for(pair.client.lost, TIMEOUT) is None
            assert pair.client.events == ["made", "eof", "lost"]
            assert pair.server.events == ["made", "data", "lost"]
            return exc, pair.server
        finally:
            await pair.aclose()

    exc, server = run(loop, main())
    assert type(exc) is ZeroDivisionError
    assert len(contexts) == 1
    lp, ctx = contexts[0]
    assert lp is loop
    assert ctx["message"] == "Fatal error: protocol.data_received() call failed."
    assert ctx["exception"] is exc
    assert ctx["transport"] is server.transport
    assert ctx["protocol"] is server


def test_eof_received_exception_goes_to_handler(loop):
    contexts = collect_exceptions(loop)

    class Failing(RecordingProtocol):
        def eof_received(self):
            super().eof_received()
            raise ZeroDivisionError("eof")

    async def main():
        pair = await TcpPair.open(Failing)
        try:
            pair.client.transport.write_eof()
            exc = await asyncio.wait_for(pair.server.lost, TIMEOUT)
            await asyncio.wait_for(pair.client.lost, TIMEOUT)
            return exc
        finally:
            await pair.aclose()

    exc = run(loop, main())
    assert type(exc) is ZeroDivisionError
    assert [c["message"] for _, c in contexts] == ["Fatal error: protocol.eof_received() call failed."]
    assert contexts[0][1]["exception"] is exc


# -- servers ----------------------------------------------------------------------


async def _echo_once(host, port, data=b"ping"):
    """Connect, send ``data``, expect it echoed back, close."""
    loop = asyncio.get_running_loop()
    t, p = await asyncio.wait_for(loop.create_connection(RecordingProtocol, host, port), TIMEOUT)
    try:
        t.write(data)
        await p.received(len(data))
        assert bytes(p.data) == data
        return t.get_extra_info("peername"), t.get_extra_info("sockname")
    finally:
        t.close()
        await asyncio.wait_for(p.lost, TIMEOUT)


def _echo_factory():
    return RecordingProtocol(echo=True)


def test_create_server_port0_several_hosts(loop):
    hosts = ["127.0.0.1"] + (["::1"] if ipv6_loopback_works() else [])

    async def main():
        srv = await loop.create_server(_echo_factory, hosts, 0)
        try:
            socks = srv.sockets
            assert len(socks) == len(hosts)
            families = sorted(s.family for s in socks)
            expected = sorted(socket.AF_INET6 if ":" in h else socket.AF_INET for h in hosts)
            assert families == expected
            for s in socks:
                host, port = s.getsockname()[:2]
                assert port != 0
                peer, _ = await _echo_once(host, port)
                assert peer[:2] == (host, port)
        finally:
            srv.close()
            await asyncio.wait_for(srv.wait_closed(), TIMEOUT)

    run(loop, main())


def test_create_server_reuse_address(loop):
    async def main():
        values = {}
        for flag in (None, True, False):
            kwargs = {} if flag is None else {"reuse_address": flag}
            srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, **kwargs)
            values[flag] = srv.sockets[0].getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) != 0
            srv.close()
            await srv.wait_closed()
        return values

    # On POSIX reuse_address defaults to True.
    assert run(loop, main()) == {None: True, True: True, False: False}


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="no SO_REUSEPORT")
def test_create_server_reuse_port(loop):
    async def main():
        srv1 = await loop.create_server(_echo_factory, "127.0.0.1", 0, reuse_port=True)
        port = srv1.sockets[0].getsockname()[1]
        srv2 = await loop.create_server(_echo_factory, "127.0.0.1", port, reuse_port=True)
        try:
            for srv in (srv1, srv2):
                assert srv.sockets[0].getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) != 0
                assert srv.sockets[0].getsockname()[1] == port
            await _echo_once("127.0.0.1", port)
            # Without reuse_port the port is taken.
            with pytest.raises(OSError) as ei:
                await loop.create_server(_echo_factory, "127.0.0.1", port)
            assert ei.value.errno == errno.EADDRINUSE
        finally:
            for srv in (srv1, srv2):
                srv.close()
                await srv.wait_closed()

    run(loop, main())


def test_server_accepts_a_burst_of_connections(loop):
    n = 300

    async def main():
        srv = await loop.create_server(_echo_factory, "127.0.0.1", 0, backlog=n)
        port = srv.sockets[0].getsockname()[1]
        try:

            async def client(i):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                msg = b"client %d" % i
                writer.write(msg)
                got = await reader.readexactly(len(msg))
                writer.close()
                await writer.wait_closed()
                return got == msg

            results = await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(n))), 20)
            assert all(results)
        finally:
            srv.close()
            await srv.wait_closed()

    run(loop, main(), 30)


@pytest.mark.parametrize("debug", [False, True])
def test_server_protocol_factory_error(loop, debug):
    """A failing protocol factory drops that connection (reported only in
    debug mode) and the server keeps serving."""
    loop.set_debug(debug)
    contexts = collect_exceptions(loop)
    calls = []

    def factory():
        calls.append(None)
        if len(calls) == 1:
            raise ZeroDivisionError("no protocol")
        return RecordingProtocol(echo=True)

    async def main():
        srv = await loop.create_server(factory, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if not debug:
                # (In debug mode the reported exception's traceback keeps the
                # accepted socket alive.)
                try:
                    assert await asyncio.wait_for(reader.read(100), TIMEOUT) == b""
                except ConnectionResetError:
                    pass
            else:
                await wait_until(lambda: contexts)
            writer.close()
            await _echo_once("127.0.0.1", port)
        finally:
            srv.close()
            await srv.wait_closed()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # asyncio leaves the socket to the GC
        run(loop, main())
    messages = [ctx["message"] for _, ctx in contexts]
    if debug:
        assert messages == ["Error on transport creation for incoming connection"]
        assert type(contexts[0][1]["exception"]) is ZeroDivisionError
    else:
        assert messages == []


def _listen_backlog(sock):
    """The backlog a listening TCP socket was given (Linux: TCP_INFO's
    tcpi_sacked holds sk_max_ack_backlog for listeners)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return struct.unpack_from("8B6I", info)[13]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO layout is Linux's")
def test_create_server_backlog(loop):
    async def main():
        srv = await loop.create_server(_echo_factory, "127.0.0.1", 0, backlog=7)
        try:
            assert _listen_backlog(srv.sockets[0]) == 7
            await _echo_once("127.0.0.1", srv.sockets[0].getsockname()[1])
        finally:
            srv.close()
            await srv.wait_closed()

    run(loop, main())


def test_start_serving_false_then_start_serving(loop):
    async def main():
        srv = await loop.create_server(_echo_factory, "127.0.0.1", 0, start_serving=False, backlog=9)
        try:
            assert srv.is_serving() is False
            port = srv.sockets[0].getsockname()[1]
            # Bound but not listening yet.
            with pytest.raises(ConnectionRefusedError):
                await asyncio.wait_for(loop.create_connection(asyncio.Protocol, "127.0.0.1", port), TIMEOUT)
            await srv.start_serving()
            assert srv.is_serving() is True
            if sys.platform.startswith("linux"):
                assert _listen_backlog(srv.sockets[0]) == 9
            await _echo_once("127.0.0.1", port)
            await srv.start_serving()  # no-op when serving
            assert srv.is_serving() is True
        finally:
            srv.close()
            await srv.wait_closed()

    run(loop, main())


def test_serve_forever_cancelled(loop):
    async def main():
        srv = await loop.create_server(_echo_factory, "127.0.0.1", 0, start_serving=False)
        port = srv.sockets[0].getsockname()[1]
        task = asyncio.ensure_future(srv.serve_forever())
        await asyncio.sleep(0.01)
        assert srv.is_serving()
        await _echo_once("127.0.0.1", port)
        with pytest.raises(RuntimeError):
            await srv.serve_forever()  # already serving forever
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, TIMEOUT)
        assert not srv.is_serving()
        assert srv.sockets == ()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.wait_for(loop.create_connection(asyncio.Protocol, "127.0.0.1", port), TIMEOUT)

    run(loop, main())


def test_server_object_api(loop):
    async def main():
        srv = await loop.create_server(_echo_factory, "127.0.0.1", 0)
        assert srv.get_loop() is loop
        assert srv.is_serving() is True
        socks = srv.sockets
        assert isinstance(socks, tuple) and len(socks) == 1
        assert isinstance(socks[0], trsock.TransportSocket)
        assert socks[0].family == socket.AF_INET
        assert socks[0].type == socket.SOCK_STREAM
        port = socks[0].getsockname()[1]
        async with srv as entered:
            assert entered is srv
            await _echo_once("127.0.0.1", port)
        # Leaving the block closed the server.
        assert srv.is_serving() is False
        assert srv.sockets == ()
        srv.close()  # idempotent
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.wait_for(loop.create_connection(asyncio.Protocol, "127.0.0.1", port), TIMEOUT)

    run(loop, main())


def test_server_close_keeps_connections(loop):
    async def main():
        pair = await TcpPair.open(_echo_factory)
        try:
            pair.srv.close()
            assert not pair.srv.is_serving()
            with pytest.raises(ConnectionRefusedError):
                await asyncio.wait_for(loop.create_connection(asyncio.Protocol, "127.0.0.1", pair.port), TIMEOUT)
            pair.client.transport.write(b"still open")
            await pair.client.received(10)
            assert bytes(pair.client.data) == b"still open"
            pair.client.transport.close()
            await asyncio.wait_for(pair.server.lost, TIMEOUT)
            await asyncio.wait_for(pair.srv.wait_closed(), TIMEOUT)
        finally:
            await pair.aclose()

    run(loop, main())


@pytest.mark.skipif(sys.version_info < (3, 12, 1), reason="wait_closed() waits for connections from 3.12.1")
def test_server_wait_closed_waits_for_connections(loop):
    async def main():
        pair = await TcpPair.open()
        try:
            pair.srv.close()
            waiter = asyncio.ensure_future(pair.srv.wait_closed())
            await asyncio.sleep(0.05)
            assert not waiter.done()
            pair.server.transport.close()
            await asyncio.wait_for(waiter, TIMEOUT)
        finally:
            await pair.aclose()

    run(loop, main())


@pytest.mark.skipif(not PY313, reason="Server.close_clients/abort_clients are 3.13+")
@pytest.mark.parametrize("method", ["close_clients", "abort_clients"])
def test_server_close_and_abort_clients(loop, method):
    async def main():
        pair = await TcpPair.open()
        try:
            pair.srv.close()
            getattr(pair.srv, method)()
            assert await asyncio.wait_for(pair.server.lost, TIMEOUT) is None
            assert await asyncio.wait_for(pair.client.lost, TIMEOUT) is None
            await asyncio.wait_for(pair.srv.wait_closed(), TIMEOUT)
            assert "eof" in pair.client.events
        finally:
            await pair.aclose()

    run(loop, main())


# -- create_connection / connect_accepted_socket ------------------------------------


def test_create_connection_with_sock(loop):
    async def main():
        srv = await loop.create_server(_echo_factory, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), TIMEOUT)
            t, p = await loop.create_connection(RecordingProtocol, sock=sock)
            assert t.get_extra_info("socket").fileno() == sock.fileno()
            assert t.get_extra_info("peername") == ("127.0.0.1", port)
            t.write(b"via sock")
            await p.received(8)
            assert bytes(p.data) == b"via sock"
            t.close()
            await asyncio.wait_for(p.lost, TIMEOUT)
            # The transport closed the socket.
            assert sock.fileno() == -1

            # A blocking connected socket is made non-blocking.
            bsock = socket.create_connection(("127.0.0.1", port))
            t, p = await loop.create_connection(RecordingProtocol, sock=bsock)
            assert bsock.gettimeout() == 0
            t.write(b"blocking")
            await p.received(8)
            t.close()
            await asyncio.wait_for(p.lost, TIMEOUT)

            other = socket.socket()
            try:
                with pytest.raises(ValueError):
                    await loop.create_connection(RecordingProtocol, "127.0.0.1", port, sock=other)
                with pytest.raises(ValueError):
                    await loop.create_connection(RecordingProtocol)
            finally:
                other.close()
        finally:
            srv.close()
            await srv.wait_closed()

    run(loop, main())


def test_create_connection_local_addr(loop):
    async def main():
        pair = await TcpPair.open()
        try:
            t, p = await loop.create_connection(
                RecordingProtocol, "127.0.0.1", pair.port, local_addr=("127.0.0.1", 0)
            )
            assert t.get_extra_info("sockname")[0] == "127.0.0.1"
            t.close()
            await asyncio.wait_for(p.lost, TIMEOUT)
            local_port = unused_tcp_port()
            t, p = await loop.create_connection(
                RecordingProtocol, "127.0.0.1", pair.port, local_addr=("127.0.0.1", local_port)
            )
            assert t.get_extra_info("sockname") == ("127.0.0.1", local_port)
            await wait_until(lambda: len(pair.accepted) == 3)
            await asyncio.wait_for(asyncio.shield(pair.accepted[2].made), TIMEOUT)
            assert pair.accepted[2].transport.get_extra_info("peername") == ("127.0.0.1", local_port)
            t.close()
            await asyncio.wait_for(p.lost, TIMEOUT)
        finally:
            await pair.aclose()

    run(loop, main())


@pytest.mark.parametrize(
    "kwargs", [{}, {"happy_eyeballs_delay": 0.05}, {"happy_eyeballs_delay": 0.05, "interleave": 1}]
)
def test_create_connection_tries_every_address(loop, kwargs):
    """A name resolving to a refused address first, then a good one."""
    refused = unused_tcp_port()

    async def main():
        srv = await loop.create_server(_echo_factory, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        infos = [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", refused))]
        if ipv6_loopback_works():
            v6_refused = unused_tcp_port("::1")
            infos.append((socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("::1", v6_refused, 0, 0)))
        infos.append((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port)))
        calls = []

        async def fake_getaddrinfo(host, port_, **kw):
            calls.append(host)
            return list(infos)

        loop.getaddrinfo = fake_getaddrinfo
        try:
            t, p = await asyncio.wait_for(
                loop.create_connection(RecordingProtocol, "multi.invalid", 80, **kwargs), TIMEOUT
            )
            assert calls == ["multi.invalid"]
            assert t.get_extra_info("peername") == ("127.0.0.1", port)
            t.write(b"hi")
            await p.received(2)
            t.close()
            await asyncio.wait_for(p.lost, TIMEOUT)
        finally:
            del loop.getaddrinfo
            srv.close()
            await srv.wait_closed()

    run(loop, main())


def test_create_connection_resolves_localhost(loop):
    async def main():
        pair = await TcpPair.open(_echo_factory)
        try:
            t, p = await asyncio.wait_for(
                loop.create_connection(RecordingProtocol, "localhost", pair.port, family=socket.AF_INET), TIMEOUT
            )
            assert t.get_extra_info("peername") == ("127.0.0.1", pair.port)
            t.close()
            await asyncio.wait_for(p.lost, TIMEOUT)
        finally:
            await pair.aclose()

    run(loop, main())


def skip_unless_all_errors(loop):
    """asyncio has all_errors from 3.12; zuvrs also on 3.11 (3.10 lacks
    ExceptionGroup)."""
    if sys.version_info < (3, 11) or (not PY312 and reference_loop(loop)):
        pytest.skip("all_errors: asyncio 3.12+, zuvrs 3.11+")


@pytest.mark.parametrize("happy_eyeballs_delay", [None, 0.05])
def test_create_connection_all_errors(loop, happy_eyeballs_delay):
    skip_unless_all_errors(loop)
    port = unused_tcp_port()

    async def main():
        with pytest.raises(ExceptionGroup) as ei:  # noqa: F821 (3.11+ builtin)
            await asyncio.wait_for(
                loop.create_connection(asyncio.Protocol, "127.0.0.1", port, all_errors=True,
                                       happy_eyeballs_delay=happy_eyeballs_delay), TIMEOUT
            )
        assert ei.value.message == "create_connection failed"
        excs = ei.value.exceptions
        assert len(excs) == 1
        assert isinstance(excs[0], ConnectionRefusedError)

    run(loop, main())


def test_create_connection_all_errors_every_address(loop):
    """Two addresses (IPv6 and IPv4 loopback), both refused: both errors."""
    skip_unless_all_errors(loop)
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    port = unused_tcp_port()

    async def main():
        with pytest.raises(ExceptionGroup) as ei:  # noqa: F821 (3.11+ builtin)
            await asyncio.wait_for(
                loop.create_connection(asyncio.Protocol, "localhost", port, all_errors=True), TIMEOUT
            )
        return ei.value.exceptions

    infos = socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)
    excs = run(loop, main())
    assert len(excs) == len(infos)
    assert all(isinstance(e, OSError) for e in excs)


def test_create_connection_all_errors_success_and_other_errors(loop):
    """all_errors changes only the all-attempts-failed error."""
    skip_unless_all_errors(loop)

    async def main():
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        t, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port, all_errors=True)
        t.close()
        server.close()
        await server.wait_closed()
        with pytest.raises(socket.gaierror):
            await loop.create_connection(asyncio.Protocol, "no-such-host.invalid", port,
                                         all_errors=True, flags=socket.AI_NUMERICHOST)

    run(loop, main())


def test_connect_accepted_socket(loop):
    async def main():
        lsock = socket.create_server(("127.0.0.1", 0))
        try:
            csock = socket.create_connection(lsock.getsockname())
            conn, _ = lsock.accept()
        finally:
            lsock.close()
        t, server = await loop.connect_accepted_socket(_echo_factory, conn)
        assert isinstance(server, RecordingProtocol)
        assert t.get_extra_info("peername") == csock.getsockname()
        assert conn.gettimeout() == 0
        ct, client = await loop.create_connection(RecordingProtocol, sock=csock)
        ct.write(b"accepted elsewhere")
        await client.received(18)
        assert bytes(client.data) == b"accepted elsewhere"
        ct.close()
        assert await asyncio.wait_for(server.lost, TIMEOUT) is None
        await asyncio.wait_for(client.lost, TIMEOUT)
        assert conn.fileno() == -1

    run(loop, main())


# -- resources ------------------------------------------------------------------------


class _WriteAndClose(asyncio.Protocol):
    lost = 0

    def connection_made(self, transport):
        transport.write(b"x")
        transport.close()

    def connection_lost(self, exc):
        type(self).lost += 1


def test_many_connections_leave_no_fds(loop):
    total, concurrency = 10_000, 16

    class Counter(_WriteAndClose):
        lost = 0

    async def main():
        srv = await loop.create_server(Counter, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        received = []

        async def one():
            t, p = await loop.create_connection(lambda: RecordingProtocol(eof_result=False), "127.0.0.1", port)
            assert await asyncio.wait_for(p.lost, TIMEOUT) is None
            received.append(bytes(p.data))

        await one()  # warm up whatever is created lazily
        await wait_until(lambda: Counter.lost == 1)
        gc.collect()
        baseline = fd_count()

        async def worker(n):
            for _ in range(n):
                await one()

        await asyncio.gather(*(worker(total // concurrency) for _ in range(concurrency)))
        await wait_until(lambda: Counter.lost == total + 1, timeout=10)
        for _ in range(5):
            await asyncio.sleep(0)
        gc.collect()
        after = fd_count()
        srv.close()
        await srv.wait_closed()
        return baseline, after, received

    baseline, after, received = run(loop, main(), 60)
    assert len(received) == total + 1
    assert set(received) == {b"x"}
    assert after == baseline


EMFILE_CHILD = """
import errno, json, os, resource, socket

async def main():
    loop = asyncio.get_running_loop()
    seen = []

    def handler(lp, ctx):
        exc = ctx.get("exception")
        seen.append({"message": ctx.get("message"), "errno": getattr(exc, "errno", None)})
        lp.default_exception_handler(ctx)

    loop.set_exception_handler(handler)

    class Echo(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport

        def data_received(self, data):
            self.transport.write(data)

    server = await loop.create_server(Echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    clients = []
    for _ in range(8):
        # The kernel completes these; they wait in the accept queue.
        c = socket.create_connection(("127.0.0.1", port))
        c.setblocking(False)
        clients.append(c)
    fillers = []
    while True:
        try:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE, exc
            break
    await asyncio.sleep(0.3)  # the server tries to accept with no fd left
    failed_while_full = sum(s["message"] == "socket.accept() out of system resource" for s in seen)
    for fd in fillers:
        os.close(fd)
    echoed = 0
    for i, c in enumerate(clients):
        msg = b"ping %d" % i
        await loop.sock_sendall(c, msg)
        got = b""
        while len(got) < len(msg):
            chunk = await asyncio.wait_for(loop.sock_recv(c, 100), 5)
            if not chunk:
                break
            got += chunk
        echoed += got == msg
    print(json.dumps({"seen": seen, "failed_while_full": failed_while_full,
                      "echoed": echoed, "clients": len(clients)}))
    for c in clients:
        c.close()
    server.close()

run(main())
"""


def test_accept_emfile_logged_and_server_recovers(loop_name):
    proc = run_child(loop_name, EMFILE_CHILD, timeout=30)
    assert proc.returncode == 0, proc.stderr
    result = last_json_line(proc.stdout)
    assert result["failed_while_full"] >= 1, result
    failures = [s for s in result["seen"] if s["message"] == "socket.accept() out of system resource"]
    assert failures and all(s["errno"] == errno.EMFILE for s in failures)
    # Only accept failures were reported.
    assert len(failures) == len(result["seen"]), result
    assert result["echoed"] == result["clients"] == 8
    assert "socket.accept() out of system resource" in proc.stderr


def test_write_of_4_gib_and_more_arrives_whole(loop):
    # One write() larger than 32 bits can count, then close(): every byte
    # reaches the peer (a length cut to 32 bits would deliver 1 MiB).
    size = (1 << 32) + (1 << 20)

    class Counter(asyncio.Protocol):
        def __init__(self):
            self.received = 0
            self.done = loop.create_future()

        def data_received(self, data):
            self.received += len(data)

        def connection_lost(self, exc):
            self.done.set_result(exc)

    async def main():
        counter = Counter()
        server = await loop.create_server(lambda: counter, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        data = bytes(size)
        transport.write(data)
        del data
        transport.close()
        assert await asyncio.wait_for(counter.done, 120) is None
        server.close()
        await server.wait_closed()
        return counter.received

    # Each half holds 4 GiB and more (asyncio's copies what the kernel did
    # not take into its buffer): not both at once in parallel workers.
    with one_at_a_time("4-gib-write"):
        assert run(loop, main(), timeout=150) == size


def test_connection_lost_that_raises_still_ends_the_connection(loop):
    """A protocol whose connection_lost() raises, on an accepted and on a
    connected transport: the error reaches the exception handler, and the
    connection still ends as it would have: the fd closed, the server's
    wait_closed() done (the server no longer counts the connection), the
    names and a closed socket still reported, the transport closing."""
    contexts = collect_exceptions(loop)
    before = fd_count()

    class Failing(asyncio.Protocol):
        def __init__(self, lost):
            self.lost = lost

        def connection_lost(self, exc):
            self.lost.set_result(exc)
            raise RuntimeError("lost " + ("server" if self.lost is server_lost else "client"))

    server_lost = loop.create_future()
    client_lost = loop.create_future()
    made = []

    def factory():
        protocol = Failing(server_lost)
        made.append(protocol)
        return protocol

    async def main():
        server = await loop.create_server(factory, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await loop.create_connection(lambda: Failing(client_lost), "127.0.0.1", port)
        await wait_until(lambda: made)
        transport.close()
        assert await asyncio.wait_for(client_lost, TIMEOUT) is None
        assert await asyncio.wait_for(server_lost, TIMEOUT) is None
        await asyncio.sleep(0)
        server.close()
        await asyncio.wait_for(server.wait_closed(), TIMEOUT)
        return transport, port

    transport, port = run(loop, main())
    assert transport.is_closing()
    assert transport.get_extra_info("peername") == ("127.0.0.1", port)
    assert transport.get_extra_info("socket").fileno() == -1
    errors = sorted(str(ctx.get("exception")) for _, ctx in contexts)
    assert errors == ["lost client", "lost server"]
    assert all(ctx["message"].startswith("Exception in callback") for _, ctx in contexts)
    loop.close()
    assert fd_count() <= before
