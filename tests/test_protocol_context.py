"""The context protocol callbacks run in.

asyncio runs a socket transport's reads in the context its fd watcher was
registered in, which is the context the transport was made in; what a
callback scheduled later runs in depends on who scheduled it. zuvrs, as
uvloop, runs every protocol callback in one context: the one the transport
was made in. The two agree wherever asyncio's rule gives that context
(data, EOF, connection_made, connection_lost after the peer closed, a
datagram); where asyncio's rule gives another (flow control driven by a
write from another task, connection_lost after close() from another
context, a subprocess's exit), the tests say what each loop does.
"""

import asyncio
import contextvars
import socket
import sys

import pytest
from _support import run

cvar = contextvars.ContextVar("cvar", default="outer")


class Recorder(asyncio.Protocol):
    """Records (callback, cvar) for every protocol callback."""

    def __init__(self, loop):
        self.log = []
        self.transport = None
        self.done = loop.create_future()
        self.got_data = loop.create_future()
        self.got_eof = loop.create_future()

    def note(self, what):
        self.log.append((what, cvar.get()))

    def connection_made(self, transport):
        self.transport = transport
        self.note("connection_made")

    def data_received(self, data):
        self.note("data_received")
        if not self.got_data.done():
            self.got_data.set_result(None)

    def eof_received(self):
        self.note("eof_received")
        self.got_eof.set_result(None)

    def pause_writing(self):
        self.note("pause_writing")

    def resume_writing(self):
        self.note("resume_writing")

    def connection_lost(self, exc):
        self.note("connection_lost")
        self.done.set_result(exc)


class BufferedRecorder(Recorder, asyncio.BufferedProtocol):
    def get_buffer(self, sizehint):
        self.note("get_buffer")
        return bytearray(1024)

    def buffer_updated(self, nbytes):
        self.data_received(None)


def callbacks_seen(log):
    """Each callback once, with every context it ran in."""
    seen = {}
    for what, value in log:
        seen.setdefault(what, set()).add(value)
    return seen


async def connected_pair(loop, protocol, family):
    """A client transport for `protocol` (made in the current context) and
    the accepted peer socket."""
    if family == socket.AF_UNIX:
        a, b = socket.socketpair()
        await loop.connect_accepted_socket(lambda: protocol, a)
        return b
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        accepted = loop.run_in_executor(None, listener.accept)
        await loop.create_connection(lambda: protocol, *listener.getsockname())
        peer, _ = await accepted
    return peer


@pytest.mark.parametrize("protocol_class", [Recorder, BufferedRecorder])
@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_UNIX])
def test_stream_callbacks_run_in_the_transports_context(loop, protocol_class, family):
    async def main():
        cvar.set("made")
        proto = protocol_class(loop)
        peer = await connected_pair(loop, proto, family)
        cvar.set("elsewhere")  # the task's context: not the transport's copy
        with peer:
            peer.sendall(b"data")
            await proto.got_data
            peer.shutdown(socket.SHUT_WR)
            await proto.got_eof
        await proto.done
        proto.transport.close()
        return callbacks_seen(proto.log)

    seen = run(loop, main())
    expected = {"connection_made", "data_received", "eof_received", "connection_lost"}
    if protocol_class is BufferedRecorder:
        expected.add("get_buffer")
    assert set(seen) == expected
    assert all(values == {"made"} for values in seen.values()), seen


def test_server_connections_run_in_the_servers_context(loop):
    async def main():
        cvar.set("server")
        protos = []

        def factory():
            proto = Recorder(loop)
            proto.note("factory")
            protos.append(proto)
            return proto

        server = await loop.create_server(factory, "127.0.0.1", 0)
        cvar.set("client")
        with socket.create_connection(server.sockets[0].getsockname()) as s:
            s.sendall(b"x")
            while not protos:
                await asyncio.sleep(0.001)
            await protos[0].got_data
        await protos[0].done
        server.close()
        await server.wait_closed()
        return callbacks_seen(protos[0].log)

    seen = run(loop, main())
    assert seen == {"factory": {"server"}, "connection_made": {"server"}, "data_received": {"server"},
                    "eof_received": {"server"}, "connection_lost": {"server"}}


def test_callbacks_share_one_context(loop):
    """A variable set in connection_made is seen by data_received: one
    context for the transport's life on zuvrs (as on uvloop); asyncio runs
    connection_made in a copy of its own."""
    seen = []

    class Setter(Recorder):
        def connection_made(self, transport):
            super().connection_made(transport)
            cvar.set("set in connection_made")

        def data_received(self, data):
            seen.append(cvar.get())
            super().data_received(data)

    async def main():
        cvar.set("made")
        proto = Setter(loop)
        peer = await connected_pair(loop, proto, socket.AF_UNIX)
        with peer:
            peer.sendall(b"x")
            await proto.got_data
        proto.transport.close()
        await proto.done

    run(loop, main())
    assert seen == (["made"] if type(loop).__module__.startswith("asyncio") else ["set in connection_made"])


def test_flow_control_driven_from_another_context(loop):
    """pause_writing (from a write in another task) and resume_writing
    (once the peer reads): asyncio calls them in the writer's context
    (pause_writing from write(), resume_writing from the writer watcher
    that write() registered); zuvrs, as uvloop, in the transport's."""

    async def main():
        cvar.set("made")
        proto = Recorder(loop)
        peer = await connected_pair(loop, proto, socket.AF_INET)

        async def writer():
            cvar.set("writer")
            proto.transport.set_write_buffer_limits(high=256, low=128)
            while not proto.transport.get_write_buffer_size():
                proto.transport.write(b"q" * 65536)

        await loop.create_task(writer())
        peer.setblocking(False)
        while ("resume_writing", cvar.get()) not in proto.log and len(proto.log) < 3:
            try:
                peer.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.005)
        peer.close()
        proto.transport.close()
        await proto.done
        return callbacks_seen(proto.log)

    seen = run(loop, main())
    own = "writer" if type(loop).__module__.startswith("asyncio") else "made"
    assert seen["pause_writing"] == {own}
    assert seen["resume_writing"] == {own}


def test_connection_lost_after_close_from_another_context(loop):
    """close() called in another context: asyncio schedules connection_lost
    in the closer's context, zuvrs (as uvloop) in the transport's."""

    async def main():
        cvar.set("made")
        proto = Recorder(loop)
        peer = await connected_pair(loop, proto, socket.AF_UNIX)

        def close():
            cvar.set("closer")
            proto.transport.close()

        loop.call_soon(close)
        await proto.done
        peer.close()
        return callbacks_seen(proto.log)

    seen = run(loop, main())
    own = "closer" if type(loop).__module__.startswith("asyncio") else "made"
    assert seen["connection_lost"] == {own}


def test_datagram_callbacks_run_in_the_transports_context(loop):
    class Datagrams(asyncio.DatagramProtocol):
        def __init__(self):
            self.log = []
            self.got = loop.create_future()
            self.errors = loop.create_future()
            self.done = loop.create_future()

        def connection_made(self, transport):
            self.log.append(("connection_made", cvar.get()))

        def datagram_received(self, data, addr):
            self.log.append(("datagram_received", cvar.get()))
            self.got.set_result(None)

        def error_received(self, exc):
            self.log.append(("error_received", cvar.get()))
            if not self.errors.done():
                self.errors.set_result(exc)

        def connection_lost(self, exc):
            self.log.append(("connection_lost", cvar.get()))
            self.done.set_result(None)

    async def main():
        cvar.set("made")
        proto = Datagrams()
        transport, _ = await loop.create_datagram_endpoint(lambda: proto, local_addr=("127.0.0.1", 0))
        cvar.set("elsewhere")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"x", transport.get_extra_info("sockname"))
            await proto.got
        # Nobody listens on the socket's own port once it is bound to
        # another destination: ECONNREFUSED reaches error_received.
        closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()
        closed.close()
        transport.sendto(b"x", dead)
        transport.close()
        await proto.done
        return callbacks_seen(proto.log)

    seen = run(loop, main())
    assert seen["connection_made"] == {"made"}
    assert seen["datagram_received"] == {"made"}
    assert "connection_lost" in seen


def test_subprocess_pipe_callbacks_run_in_the_transports_context(loop):
    class Child(asyncio.SubprocessProtocol):
        def __init__(self):
            self.log = []
            self.exited = loop.create_future()
            self.done = loop.create_future()

        def connection_made(self, transport):
            self.log.append(("connection_made", cvar.get()))

        def pipe_data_received(self, fd, data):
            self.log.append(("pipe_data_received", cvar.get()))

        def pipe_connection_lost(self, fd, exc):
            self.log.append((f"pipe_connection_lost {fd}", cvar.get()))

        def process_exited(self):
            self.log.append(("process_exited", cvar.get()))
            self.exited.set_result(None)

        def connection_lost(self, exc):
            self.log.append(("connection_lost", cvar.get()))
            self.done.set_result(None)

    async def main():
        cvar.set("made")
        proto = Child()
        transport, _ = await loop.subprocess_exec(
            lambda: proto, sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read())",
        )
        cvar.set("elsewhere")
        stdin = transport.get_pipe_transport(0)
        stdin.write(b"data")
        stdin.write_eof()
        await proto.exited
        await proto.done
        transport.close()
        return callbacks_seen(proto.log)

    seen = run(loop, main())
    assert seen["connection_made"] == {"made"}
    assert seen["pipe_data_received"] == {"made"}
    assert seen["pipe_connection_lost 1"] == seen["pipe_connection_lost 2"] == {"made"}
    # stdin's end comes from write_eof(), called in another context, which
    # asyncio schedules connection_lost in (as for close() above).
    own = "elsewhere" if type(loop).__module__.startswith("asyncio") else "made"
    assert seen["pipe_connection_lost 0"] == {own}
    assert "process_exited" in seen and "connection_lost" in seen
