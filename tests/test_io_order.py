"""When a new connection's first data reaches its protocol.

asyncio's loop runs an fd's read callback from the ready queue, behind what
was queued before the poll that saw it. A transport queues connection_made,
the start of reading and its waiter's result together, so data that is
already waiting reaches data_received only after the coroutine awaiting the
connection has resumed (and after what connection_made queued). Programs
rely on it: asyncssh's port forwarder sets up its peer after
create_connection() returns. Each path that makes a transport is tested
here with data that is in the socket (or pipe) before the transport exists,
while a ping-pong between two other transports keeps the loop polling every
turn (an idle poll would hide the order).
"""

import asyncio
import contextlib
import os
import socket
import subprocess
import sys

import pytest
from _support import TIMEOUT, run, wait_until

# What the peer sent before the transport was made.
EARLY = b"early bytes\n"


class _PingPong(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)


@contextlib.asynccontextmanager
async def loop_kept_polling():
    """One byte bouncing between two connected transports: every turn of
    the loop polls and finds I/O."""
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    ta, _ = await loop.connect_accepted_socket(_PingPong, a)
    tb, _ = await loop.connect_accepted_socket(_PingPong, b)
    ta.write(b"x")
    await asyncio.sleep(0.01)
    try:
        yield
    finally:
        ta.abort()
        tb.abort()
        await asyncio.sleep(0)


class Recorder(asyncio.Protocol):
    """Records connection_made and data_received in the shared `events`."""

    def __init__(self, events):
        self.events = events
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        self.events.append("connection_made")

    def data_received(self, data):
        self.events.append(("data", data))

    def eof_received(self):
        self.events.append("eof")

    # Datagrams and pipes of subprocesses.
    def datagram_received(self, data, addr):
        self.events.append(("data", data))


def assert_returned_first(events):
    assert events[:3] == ["connection_made", "returned", ("data", EARLY)], events


def _listening(family=socket.AF_INET, address=("127.0.0.1", 0)):
    lsock = socket.socket(family, socket.SOCK_STREAM)
    lsock.bind(address)
    lsock.listen(8)
    return lsock


def _accept_and_send(lsock):
    """In a protocol factory, called once the connection is made: the peer
    accepts it and sends, so the data is there before the transport."""
    conn, _ = lsock.accept()
    conn.sendall(EARLY)
    return conn


# -- clients -----------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_create_connection_resumes_before_first_data(loop, host):
    """The address literal (a native connect on zuvrs) and a name (resolved,
    then sock_connect)."""

    async def main():
        events = []
        peers = []
        with _listening() as lsock:
            port = lsock.getsockname()[1]

            def factory():
                peers.append(_accept_and_send(lsock))
                return Recorder(events)

            async with loop_kept_polling():
                tr, _ = await loop.create_connection(factory, host, port, family=socket.AF_INET)
                events.append("returned")
                await wait_until(lambda: len(events) >= 3)
                tr.close()
        for p in peers:
            p.close()
        assert_returned_first(events)

    run(loop, main())


@pytest.mark.parametrize("how", ["create_connection", "connect_accepted_socket"])
def test_socket_given_resumes_before_first_data(loop, how):
    async def main():
        events = []
        a, b = socket.socketpair()
        b.sendall(EARLY)
        async with loop_kept_polling():
            if how == "create_connection":
                tr, _ = await loop.create_connection(lambda: Recorder(events), sock=a)
            else:
                tr, _ = await loop.connect_accepted_socket(lambda: Recorder(events), a)
            events.append("returned")
            await wait_until(lambda: len(events) >= 3)
            tr.close()
        b.close()
        assert_returned_first(events)

    run(loop, main())


def test_create_unix_connection_resumes_before_first_data(loop, tmp_path):
    async def main():
        events = []
        peers = []
        path = str(tmp_path / "s.sock")
        with _listening(socket.AF_UNIX, path) as lsock:

            def factory():
                peers.append(_accept_and_send(lsock))
                return Recorder(events)

            async with loop_kept_polling():
                tr, _ = await loop.create_unix_connection(factory, path)
                events.append("returned")
                await wait_until(lambda: len(events) >= 3)
                tr.close()
        for p in peers:
            p.close()
        assert_returned_first(events)

    run(loop, main())


def test_open_connection_resumes_before_first_data(loop):
    """Streams: the reader is still empty when open_connection returns."""

    async def main():
        a, b = socket.socketpair()
        b.sendall(EARLY)
        async with loop_kept_polling():
            reader, writer = await asyncio.open_connection(sock=a)
            buffered = len(reader._buffer)
            line = await reader.readline()
            writer.close()
        b.close()
        assert (buffered, line) == (0, EARLY)

    run(loop, main())


# -- servers ------------------------------------------------------------------


def _server_test(loop, make_server, connect):
    """A server whose protocol queues a callback in connection_made: it
    runs before the client's first data reaches data_received, though the
    client sent it before the server accepted."""

    async def main():
        events = []

        class Server(Recorder):
            def connection_made(self, transport):
                super().connection_made(transport)
                loop.call_soon(events.append, "returned")

        async with loop_kept_polling():
            server, address = await make_server(lambda: Server(events))
            client = connect(address)
            client.sendall(EARLY)
            await wait_until(lambda: len(events) >= 3)
            client.close()
            server.close()
            await server.wait_closed()
        assert_returned_first(events)

    run(loop, main())


@pytest.mark.parametrize("debug", [False, True], ids=["native-accept", "debug-mode"])
def test_tcp_server_callbacks_before_first_data(loop, debug):
    """A plain TCP server (accepted natively on zuvrs; in debug mode through
    the loop's Python accept)."""
    loop.set_debug(debug)

    async def make_server(factory):
        server = await loop.create_server(factory, "127.0.0.1", 0)
        return server, server.sockets[0].getsockname()

    _server_test(loop, make_server, socket.create_connection)


def test_unix_server_callbacks_before_first_data(loop, tmp_path):
    path = str(tmp_path / "srv.sock")

    async def make_server(factory):
        return await loop.create_unix_server(factory, path), path

    def connect(address):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(address)
        return s

    _server_test(loop, make_server, connect)


def test_start_server_handler_starts_before_first_data(loop):
    """Streams: client_connected_cb starts (its task was created in
    connection_made) before the client's bytes reach the reader."""

    async def main():
        seen = []
        done = loop.create_future()

        async def handler(reader, writer):
            seen.append(len(reader._buffer))
            seen.append(await reader.readline())
            writer.close()
            done.set_result(None)

        async with loop_kept_polling():
            server = await asyncio.start_server(handler, "127.0.0.1", 0)
            client = socket.create_connection(server.sockets[0].getsockname())
            client.sendall(EARLY)
            await asyncio.wait_for(done, TIMEOUT)
            client.close()
            server.close()
            await server.wait_closed()
        assert seen == [0, EARLY]

    run(loop, main())


# -- pipes, datagrams, subprocesses -----------------------------------------


def test_connect_read_pipe_resumes_before_first_data(loop):
    async def main():
        events = []
        r, w = os.pipe()
        os.write(w, EARLY)
        pipe = open(r, "rb", buffering=0)
        async with loop_kept_polling():
            tr, _ = await loop.connect_read_pipe(lambda: Recorder(events), pipe)
            events.append("returned")
            await wait_until(lambda: len(events) >= 3)
            tr.close()
        os.close(w)
        assert_returned_first(events)

    run(loop, main())


@pytest.mark.parametrize("family", ["AF_INET", "AF_UNIX"])
def test_datagram_endpoint_resumes_before_first_datagram(loop, family, tmp_path):
    async def main():
        events = []
        if family == "AF_INET":
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", 0))
            peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(str(tmp_path / "d.sock"))
            peer = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        peer.sendto(EARLY, sock.getsockname())
        async with loop_kept_polling():
            tr, _ = await loop.create_datagram_endpoint(lambda: Recorder(events), sock=sock)
            events.append("returned")
            await wait_until(lambda: len(events) >= 3)
            tr.close()
        peer.close()
        assert_returned_first(events)

    run(loop, main())


def test_subprocess_returns_before_first_output(loop):
    """What the child wrote before its stdout pipe was connected: asyncio's
    subprocess transport passes it on after subprocess_exec returned."""

    class Proto(asyncio.SubprocessProtocol):
        def __init__(self):
            self.events = []
            self.exited = loop.create_future()

        def connection_made(self, transport):
            self.events.append("connection_made")

        def pipe_data_received(self, fd, data):
            self.events.append(("data", data))

        def process_exited(self):
            self.exited.set_result(None)

    def write_early():
        # Runs in the child before exec, with stdout already the pipe;
        # Popen returns once the exec happened, so the bytes are waiting.
        os.write(1, EARLY)

    async def main():
        async with loop_kept_polling():
            tr, proto = await loop.subprocess_exec(
                Proto, sys.executable, "-c", "import sys; sys.stdin.read()",
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, preexec_fn=write_early,
            )
            proto.events.append("returned")
            await wait_until(lambda: len(proto.events) >= 3)
            tr.get_pipe_transport(0).close()
            await asyncio.wait_for(proto.exited, TIMEOUT)
            tr.close()
        assert_returned_first(proto.events)

    run(loop, main())


# -- TLS -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    pytest.importorskip("cryptography")
    from _tls_certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


def _contexts(pki):
    from _tls_support import client_context, server_context

    return server_context(pki), client_context(pki)


class _Greeter(asyncio.Protocol):
    """A server that sends as soon as its connection is made."""

    def connection_made(self, transport):
        transport.write(EARLY)


def test_tls_create_connection_resumes_before_first_data(loop, pki):
    """The server's first bytes follow its handshake; the client's
    create_connection(ssl=...) has returned when they arrive."""
    sctx, cctx = _contexts(pki)

    async def main():
        events = []
        async with loop_kept_polling():
            server = await loop.create_server(_Greeter, "127.0.0.1", 0, ssl=sctx)
            port = server.sockets[0].getsockname()[1]
            tr, _ = await loop.create_connection(
                lambda: Recorder(events), "127.0.0.1", port, ssl=cctx, server_hostname="localhost"
            )
            events.append("returned")
            await wait_until(lambda: len(events) >= 3)
            tr.close()
            server.close()
            await server.wait_closed()
        assert_returned_first(events)

    run(loop, main())


def test_start_tls_resumes_before_first_data(loop, pki):
    sctx, cctx = _contexts(pki)

    async def main():
        events = []
        async with loop_kept_polling():
            server = await loop.create_server(_Greeter, "127.0.0.1", 0, ssl=sctx)
            port = server.sockets[0].getsockname()[1]
            proto = Recorder(events)
            tr, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
            tls = await loop.start_tls(tr, proto, cctx, server_hostname="localhost")
            proto.connection_made(tls)  # (start_tls does not call it)
            events.append("returned")
            await wait_until(lambda: len(events) >= 3)
            tls.close()
            server.close()
            await server.wait_closed()
        assert_returned_first(events)

    run(loop, main())


def test_ssl_socket_given_resumes_before_first_data(loop, pki):
    """TLS over a socket the caller connected, with the server's bytes
    sent after its handshake (an ssl-wrapped blocking peer in a thread)."""
    import threading

    sctx, cctx = _contexts(pki)

    async def main():
        events = []
        a, b = socket.socketpair()

        def peer():
            with sctx.wrap_socket(b, server_side=True) as s:
                s.sendall(EARLY)
                s.recv(1)

        t = threading.Thread(target=peer, daemon=True)
        t.start()
        async with loop_kept_polling():
            tr, _ = await loop.create_connection(
                lambda: Recorder(events), sock=a, ssl=cctx, server_hostname="localhost"
            )
            events.append("returned")
            await wait_until(lambda: len(events) >= 3)
            tr.write(b"!")
            tr.close()
        await loop.run_in_executor(None, t.join, TIMEOUT)
        assert_returned_first(events)

    run(loop, main())


# -- resume_reading ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tcp", "datagram", "pipe"])
def test_resume_reading_delivers_after_what_was_queued(loop, kind):
    """Data that waited while reading was paused comes after a callback
    queued right after resume_reading(), as the fd's next read callback."""
    if sys.version_info < (3, 11) and isinstance(loop, asyncio.selector_events.BaseSelectorEventLoop):
        # asyncio 3.10 reads on after pause_reading() in connection_made()
        # and has no pause_reading() on datagram transports: no reference.
        pytest.skip("asyncio < 3.11 cannot pause reading in connection_made()")

    class Paused(Recorder):
        def connection_made(self, transport):
            super().connection_made(transport)
            transport.pause_reading()

    async def main():
        events = []
        if kind == "tcp":
            a, b = socket.socketpair()
            tr, _ = await loop.connect_accepted_socket(lambda: Paused(events), a)
            send = b.sendall
        elif kind == "datagram":
            a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            a.bind(("127.0.0.1", 0))
            b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            tr, _ = await loop.create_datagram_endpoint(lambda: Paused(events), sock=a)

            def send(data):
                b.sendto(data, a.getsockname())
        else:
            r, w = os.pipe()
            b = open(w, "wb", buffering=0)
            tr, _ = await loop.connect_read_pipe(lambda: Paused(events), open(r, "rb", buffering=0))
            send = b.write
        async with loop_kept_polling():
            send(EARLY)
            for _ in range(5):
                await asyncio.sleep(0)
            tr.resume_reading()
            loop.call_soon(events.append, "returned")
            await wait_until(lambda: len(events) >= 3)
            tr.close()
        b.close()
        assert_returned_first(events)

    run(loop, main())


# -- and no later -------------------------------------------------------------------------


@pytest.mark.parametrize("polling", [False, True], ids=["idle", "kept-polling"])
@pytest.mark.parametrize("kind", ["pipe", "socket"])
def test_first_data_comes_before_what_the_resumed_task_queues(loop, kind, polling):
    """The first data waits for the callbacks of the turn reading started,
    not for those queued by the resumed task: here the task closes another
    transport right after connect_read_pipe() returned (asyncssh's stdin
    redirection), and the new transport's data still comes before the old
    one's connection_lost."""

    async def main():
        events = []

        def make(name):
            def connection_lost(exc):
                events.append(("lost", name))

            proto = Recorder(events)
            proto.data_received = lambda data: events.append(("data", name, data))
            proto.connection_lost = connection_lost
            return proto

        def endpoint():
            if kind == "pipe":
                r, w = os.pipe()
                return open(r, "rb", buffering=0), open(w, "wb", buffering=0)
            a, b = socket.socketpair()
            return a, b.makefile("wb", buffering=0)

        async def connect(name, reader):
            if kind == "pipe":
                return await loop.connect_read_pipe(lambda: make(name), reader)
            return await loop.connect_accepted_socket(lambda: make(name), reader)

        old_r, old_w = endpoint()
        new_r, new_w = endpoint()
        async with loop_kept_polling() if polling else _async_null():
            old, _ = await connect("old", old_r)
            await asyncio.sleep(0.01)
            new_w.write(EARLY)
            new, _ = await connect("new", new_r)
            old.close()
            await wait_until(lambda: ("lost", "old") in events and any(e[0] == "data" for e in events))
            new.close()
        old_w.close()
        new_w.close()
        interesting = [e for e in events if e != "connection_made"]
        assert interesting[:2] == [("data", "new", EARLY), ("lost", "old")], events

    run(loop, main())


@contextlib.asynccontextmanager
async def _async_null():
    yield
