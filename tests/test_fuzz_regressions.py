"""Parity tests for the differences the transport fuzzer found
(tests/test_fuzz_transports.py), each reduced to its program."""

import asyncio
import logging
import socket
import struct
import sys

import pytest
from _support import TcpPair, run

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

