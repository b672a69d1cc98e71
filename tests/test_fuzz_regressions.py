"""Parity tests for the differences the transport fuzzer found
(tests/test_fuzz_transports.py), each reduced to its program."""

import asyncio
import logging
import socket
import struct
import sys

import pytest
from _support import RecordingProtocol, TcpPair, run, wait_until

PY312 = sys.version_info >= (3, 12)


def test_write_eof_after_peer_reset_raises(loop):
    """write_eof() with nothing buffered shuts the socket down at once, as
    asyncio's sock.shutdown(SHUT_WR): on a connection the peer has reset
    (not yet noticed: reading is paused) the OSError reaches the caller."""

    async def main():
        pair = await TcpPair.open()
        a, b = pair.client.transport, pair.server.transport
        a.pause_reading()
        b.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        b.abort()
        await pair.server.lost
        await asyncio.sleep(0.01)
        with pytest.raises(OSError) as info:
            a.write_eof()
        await pair.aclose()
        return info.value.errno

    assert run(loop, main()) in (107, 32)  # ENOTCONN (Linux), EPIPE


def test_write_eof_sends_eof_at_once(loop):
    """write(); write_eof() in one callback: the EOF follows the data."""

    async def main():
        pair = await TcpPair.open()
        a = pair.client.transport
        a.write(b"x" * 100)
        a.write_eof()
        await asyncio.wait_for(pair.server.eof, 5)
        data = bytes(pair.server.data)
        await pair.aclose()
        return data

    assert run(loop, main()) == b"x" * 100


@pytest.mark.skipif(PY312, reason="3.12+'s socket writelines() is its own (not one write())")
def test_writelines_to_lost_connection_counts_once(loop, caplog):
    """Up to 3.11 writelines() is one write() of the items joined: to a lost
    connection it is one dropped write towards asyncio's warning."""

    async def main():
        pair = await TcpPair.open()
        a = pair.client.transport
        a.close()
        a.writelines([b"1", b"2", b"3", b"4"])
        a.write(b"5")
        a.write(b"6")
        await asyncio.wait_for(pair.client.lost, 5)
        await pair.aclose()

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        run(loop, main())
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def _socket_writelines_counts():
    """Whether asyncio's socket writelines() to a lost connection counts
    towards the warning (up to 3.11 it is a write(); from 3.12 only where it
    checks _conn_lost, CPython gh-136234: 3.12.1 and 3.13.0 do not)."""
    if not PY312:
        return True
    import asyncio.selector_events as se

    return "_conn_lost" in se._SelectorSocketTransport.writelines.__code__.co_names


@pytest.mark.parametrize("family", ["tcp", "unix"])
def test_writelines_to_lost_connection_counts_as_asyncio(loop, caplog, family):
    """Two writelines() of three items to a lost connection, then writes: the
    warning comes at the write asyncio's count says (one per writelines()
    where it counts, none from 3.12.1's own writelines(), which instead fails
    from its internals: TypeError or AttributeError, left to the caller)."""

    async def main():
        lp = asyncio.get_running_loop()
        if family == "tcp":
            pair = await TcpPair.open()
            proto, closer = pair.client, pair.aclose
        else:
            mine, theirs = socket.socketpair()
            _, proto = await lp.create_unix_connection(RecordingProtocol, sock=mine)

            async def closer():
                theirs.close()

        tr = proto.transport
        tr.close()
        await asyncio.wait_for(proto.lost, 5)
        for _ in range(2):
            try:
                tr.writelines([b"1", b"2", b"3"])
            except (TypeError, AttributeError):
                pass
        warned_at = None
        for i in range(8):
            tr.write(b"x")
            if any(r.name == "asyncio" for r in caplog.records):
                warned_at = i
                break
        await closer()
        return warned_at

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        warned_at = run(loop, main())
    # close() counts one; the fifth count warns.
    assert warned_at == (2 if _socket_writelines_counts() else 4)



def test_writelines_is_one_write(loop):
    """writelines() is one write to asyncio (one send of the items joined up
    to 3.11, one sendmsg after): the socket is tried for all of them at once,
    so to a peer that has closed, a large item and a small one go out
    together and the connection learns of the close only by reading."""

    async def main():
        pair = await TcpPair.open()
        b = pair.server.transport
        b.pause_reading()
        pair.client.transport.close()
        await asyncio.wait_for(pair.client.lost, 5)
        await asyncio.sleep(0.01)
        b.writelines([b"x" * 65537, b"y"])
        await asyncio.sleep(0.05)
        lost_early = pair.server.lost.done()
        b.resume_reading()
        exc = await asyncio.wait_for(pair.server.lost, 5)
        await pair.aclose()
        return lost_early, pair.server.eof.done(), exc

    assert run(loop, main()) == (False, True, None)


def test_write_pipe_reader_closed_with_data_left(loop):
    """The reader closes while a write waits for room: the writer ends with
    a bare BrokenPipeError() (asyncio sees it through its watch of the pipe,
    polled before its writes)."""
    import os

    async def main():
        rfd, wfd = os.pipe()
        lost = loop.create_future()

        class W(asyncio.Protocol):
            def connection_lost(self, exc):
                lost.set_result(exc)

        rtr, _ = await loop.connect_read_pipe(asyncio.Protocol, os.fdopen(rfd, "rb", 0))
        wtr, _ = await loop.connect_write_pipe(W, os.fdopen(wfd, "wb", 0))
        rtr.close()
        wtr.write(b"z" * 65537)
        exc = await asyncio.wait_for(lost, 5)
        return type(exc), exc.args

    assert run(loop, main()) == (BrokenPipeError, ())


pytest.importorskip("cryptography")
from _tls_certs import make_pki  # noqa: E402
from _tls_support import SSLPROTO_311, TLS12, TlsPair, client_context, server_context  # noqa: E402


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@SSLPROTO_311
def test_tls_abort_after_write_sends_it(loop, pki):
    """sslproto encrypts in write() and its socket transport sends at once:
    write(); abort() in one callback leaves the record sent."""

    async def main():
        pair = await TlsPair.open(server_context(pki, version=TLS12), client_context(pki, version=TLS12))
        pair.client_transport.write(b"z")
        pair.client_transport.abort()
        await asyncio.wait_for(pair.server.lost, 5)
        data = bytes(pair.server.data)
        await pair.aclose()
        return data

    assert run(loop, main()) == b"z"


@SSLPROTO_311
def test_tls_limits_after_write(loop, pki):
    """sslproto compares new water marks with what its write() left (nothing
    once encrypted): high 0 pauses (its test is >=), and the protocol stays
    paused."""

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        proto = pair.client
        pair.client_transport.write(b"y" * 101)
        pair.client_transport.set_write_buffer_limits(low=0)
        await wait_until(lambda: len(pair.server.data) == 101)
        await asyncio.sleep(0.01)
        calls = (proto.pause_writing_calls, proto.resume_writing_calls)
        await pair.aclose()
        return calls

    assert run(loop, main()) == (1, 0)


@SSLPROTO_311
def test_tls_writelines_with_an_empty_item(loop, pki):
    """An empty item of writelines() is nothing: what is written after it
    goes out."""

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        pair.client_transport.writelines([b""])
        await asyncio.sleep(0.01)
        pair.client_transport.write(b"after")
        await wait_until(lambda: len(pair.server.data) == 5)
        data = bytes(pair.server.data)
        await pair.aclose()
        return data

    assert run(loop, main()) == b"after"


@SSLPROTO_311
def test_tls_close_after_peer_eof_while_paused(loop, pki):
    """The peer's EOF while reading is paused leaves the connection open
    (flushing); close() then makes the transport closing, as asyncio's."""

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        tr = pair.client_transport
        tr.pause_reading()
        pair.server.transport.abort()
        await asyncio.sleep(0.05)
        before = tr.is_closing()
        tr.close()
        after = tr.is_closing()
        await pair.aclose()
        return before, after

    assert run(loop, main()) == (False, True)



@SSLPROTO_311
def test_tls_writes_after_close_warn_as_asyncio(loop, pki, caplog):
    """connection_lost counts towards sslproto's 'SSL connection is closed'
    warning, so the fifth write after the end logs it."""

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        pair.client_transport.close()
        await asyncio.wait_for(pair.client.lost, 5)
        for _ in range(5):
            pair.client_transport.writelines([])
        await pair.aclose()

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        run(loop, main())
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == ["SSL connection is closed"]


@SSLPROTO_311
def test_tls_buffered_protocol_empty_buffer_is_eof(loop, pki):
    """A BufferedProtocol on TLS whose get_buffer() returns an empty buffer:
    sslproto reads 0 bytes into it and takes that for close_notify, so the
    protocol gets eof_received() and the connection shuts down cleanly (the
    socket transport's RuntimeError is not raised there)."""

    events = []

    class Empty(asyncio.BufferedProtocol):
        def connection_made(self, transport):
            self.transport = transport
            self.lost = asyncio.get_running_loop().create_future()

        def get_buffer(self, sizehint):
            events.append("get_buffer")
            return bytearray(0)

        def buffer_updated(self, nbytes):
            events.append(("buffer_updated", nbytes))

        def eof_received(self):
            events.append("eof")

        def connection_lost(self, exc):
            events.append(("lost", type(exc).__name__ if exc else None))
            self.lost.set_result(None)

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki), server_factory=Empty)
        pair.client_transport.write(b"hello")
        await asyncio.wait_for(pair.server.lost, 5)
        client_lost = await asyncio.wait_for(pair.client.lost, 5)
        await pair.aclose()
        return events[events.index("eof") - 1:], describe(client_lost)

    def describe(exc):
        return exc if exc is None else type(exc).__name__

    assert run(loop, main()) == (["get_buffer", "eof", "get_buffer", ("lost", None)], None)


@pytest.mark.parametrize("end", ["write_eof", "abort"])
def test_write_pipe_writes_after_the_end_warn_as_asyncio(loop, caplog, end):
    """A write pipe's write_eof() (close()) or abort() does not count towards
    the warning about dropped writes: five writes after it log nothing."""
    import os

    async def main():
        rfd, wfd = os.pipe()
        rpipe = os.fdopen(rfd, "rb", 0)
        wtr, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(wfd, "wb", 0))
        getattr(wtr, end)()
        for _ in range(5):
            wtr.write(b"x")
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        rpipe.close()

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        run(loop, main())
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
