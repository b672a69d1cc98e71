"""Unix socket paths with a NUL inside, and abstract names.

A path must never silently become another one. asyncio's create_unix_server
(and create_datagram_endpoint's local_addr) checks the path with os.stat
first, which refuses a NUL inside (ValueError); the socket module itself
passes such a path to the kernel, which reads it up to the NUL, so a
connect or sendto reaches the truncated path on both loops. A leading NUL
is a Linux abstract name, legal everywhere. Each test states the stdlib
loop's answer and runs on both loops.
"""

import asyncio
import os
import pathlib
import socket
import sys

import pytest
from _support import run


def outcome(loop, coro):
    try:
        return ("ok", run(loop, coro))
    except Exception as exc:
        return (type(exc), str(exc))


def _forms(path):
    """The same path as str, bytes and path-like object."""
    return {"str": path, "bytes": os.fsencode(path), "pathlike": pathlib.Path(path)}


def stat_refusal(path):
    """os.stat's ValueError for `path` (its message depends on the type
    and, for a str, on the Python version)."""
    try:
        os.stat(path)
    except ValueError as exc:
        return (ValueError, str(exc))
    raise AssertionError(f"os.stat took {path!r}")


STR_NUL = stat_refusal("a\0b")[1]


@pytest.mark.parametrize("form", ["str", "bytes", "pathlike"])
def test_unix_server_refuses_a_nul_inside_the_path(loop, tmp_path, form):
    truncated = tmp_path / "a.sock"
    path = _forms(str(truncated) + "\0x")[form]
    result = outcome(loop, loop.create_unix_server(asyncio.Protocol, path))
    assert result == stat_refusal(path)
    assert not truncated.exists(), "bound at the path cut at the NUL"


def test_unix_server_stale_socket_at_the_truncated_path_stays(loop, tmp_path, caplog):
    """Nothing at the truncated path is checked, removed or logged."""
    truncated = tmp_path / "a.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(truncated))
    stale.close()
    with caplog.at_level("ERROR", logger="asyncio"):
        result = outcome(loop, loop.create_unix_server(asyncio.Protocol, str(truncated) + "\0x"))
    assert result == (ValueError, STR_NUL)
    assert truncated.exists()
    assert not caplog.records


@pytest.mark.parametrize("form", ["str", "bytes"])
def test_abstract_names_are_served_and_reached(loop, form):
    name = f"\0zuvrs-test-{os.getpid()}-{form}"
    address = name if form == "str" else name.encode()

    async def main():
        got = loop.create_future()

        class Server(asyncio.Protocol):
            def data_received(self, data):
                got.set_result(data)

        server = await loop.create_unix_server(Server, address)
        sockname = server.sockets[0].getsockname()
        tr, _ = await loop.create_unix_connection(asyncio.Protocol, address)
        tr.write(b"ping")
        data = await asyncio.wait_for(got, 5)
        tr.close()
        server.close()
        await server.wait_closed()
        return sockname, data

    sockname, data = run(loop, main())
    assert (sockname, data) == (name.encode(), b"ping")


def _serving(path):
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    return srv


@pytest.mark.parametrize("form", ["str", "bytes"])
def test_unix_connection_with_a_nul_inside_reaches_the_truncated_path(loop, tmp_path, form):
    """As the socket module's connect (asyncio's sock_connect) does."""
    truncated = str(tmp_path / "c.sock")
    path = _forms(truncated + "\0x")[form]

    async def main():
        tr, _ = await loop.create_unix_connection(asyncio.Protocol, path)
        peer = tr.get_extra_info("peername")
        tr.close()
        return peer

    with _serving(truncated):
        assert outcome(loop, main()) == ("ok", truncated)


def test_sock_connect_with_a_nul_inside_reaches_the_truncated_path(loop, tmp_path):
    truncated = str(tmp_path / "s.sock")

    async def main():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.setblocking(False)
            await loop.sock_connect(sock, truncated + "\0x")
            return sock.getpeername()

    with _serving(truncated):
        assert outcome(loop, main()) == ("ok", truncated)


def test_sock_connect_to_a_missing_truncated_path_fails(loop, tmp_path):
    async def main():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.setblocking(False)
            await loop.sock_connect(sock, str(tmp_path / "none.sock") + "\0x")

    kind, _ = outcome(loop, main())
    assert kind is FileNotFoundError


# -- datagrams -----------------------------------------------------------------------------


class _Receiver(asyncio.DatagramProtocol):
    def __init__(self):
        self.got = asyncio.get_running_loop().create_future()

    def datagram_received(self, data, addr):
        if not self.got.done():
            self.got.set_result(data)


@pytest.mark.parametrize("form", ["str", "bytes"])
def test_datagram_local_addr_refuses_a_nul_inside(loop, tmp_path, form):
    truncated = tmp_path / "d.sock"
    path = _forms(str(truncated) + "\0x")[form]
    result = outcome(loop, loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=path,
                                                         family=socket.AF_UNIX))
    if form == "bytes":
        # asyncio wants a str there.
        assert result == (TypeError, "string is expected")
    else:
        assert result == (ValueError, STR_NUL)
    assert not truncated.exists()


@pytest.mark.parametrize("form", ["str", "bytes"])
@pytest.mark.parametrize("how", ["sendto", "remote_addr"])
def test_datagrams_to_a_nul_inside_reach_the_truncated_path(loop, tmp_path, form, how):
    """The socket module's sendto / connect (which zuvrs's datagram core
    parses itself) reach the path cut at the NUL."""
    truncated = str(tmp_path / "r.sock")
    address = _forms(truncated + "\0x")[form]

    async def main():
        rtr, receiver = await loop.create_datagram_endpoint(_Receiver, local_addr=truncated, family=socket.AF_UNIX)
        if how == "sendto":
            sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            str_tr, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, sock=sender)
            str_tr.sendto(b"to the path", address)
        else:
            # (asyncio takes a str only there.)
            str_tr, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, remote_addr=truncated + "\0x",
                                                            family=socket.AF_UNIX)
            str_tr.sendto(b"to the path")
        data = await asyncio.wait_for(receiver.got, 5)
        str_tr.close()
        rtr.close()
        return data

    assert outcome(loop, main()) == ("ok", b"to the path")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract names are Linux's")
def test_datagrams_to_an_abstract_name(loop):
    name = f"\0zuvrs-dgram-{os.getpid()}"

    async def main():
        rtr, receiver = await loop.create_datagram_endpoint(_Receiver, local_addr=name, family=socket.AF_UNIX)
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        tr, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, sock=sender)
        tr.sendto(b"abstract", name.encode())
        data = await asyncio.wait_for(receiver.got, 5)
        tr.close()
        rtr.close()
        return data

    assert outcome(loop, main()) == ("ok", b"abstract")
