"""Differential fuzzing of stream transports against the stdlib loop.

hypothesis generates a program: steps of one to three transport operations
(writes of random sizes and buffer types, writelines, pause/resume_reading,
set_write_buffer_limits, write_eof, close, abort, a TCP reset) on either
end of a connection. The same program runs on asyncio's loop and on zuvrs,
over TCP, Unix sockets, pipes and TLS (both ends on the loop), and TLS
against a peer the test drives by hand (a memory-BIO SSLObject over a plain
socket) that sends its records in random slices, close_notify, a bare EOF or
a reset at random points, and TCP that start_tls() upgrades at a random
step. On TCP, Unix sockets and start_tls either end may be a
BufferedProtocol reading into buffers of random sizes and types. The
operations of a step run back to back in one
callback; then the loop runs until nothing changes any more (the protocols'
callbacks, the transports' buffers and the kernel's socket queues), so each
step starts from a settled state on both loops.

What is compared, per end: the protocol's callbacks in order and the step
they came in (connection_made, eof_received with its return and how many
bytes came before it, connection_lost with the exception's type and args
and the bytes before it), the bytes delivered (their concatenation: chunking
legitimately differs), what each operation raised, the exception handler's
calls and asyncio's log warnings, and at each settled point: bytes
received, is_closing, is_reading, the write buffer's size and whether
writing is paused. Checked on each loop by itself: the bytes received are
a prefix of the bytes written, pause_writing and resume_writing alternate,
and every byte written before a graceful close or write_eof arrives when
neither end aborted.

The suite runs a short seeded run (hypothesis derandomized). ZUVRS_FUZZ_EXAMPLES
raises the number of programs per transport and ZUVRS_FUZZ_SEED (an int or
"random") picks the programs; tools/fuzz.sh is the long run.
"""

import asyncio
import fcntl
import logging
import os
import socket
import ssl
import struct
import sys
import tempfile
import termios
import time

import pytest

pytest.importorskip("zuvrs")
hypothesis = pytest.importorskip("hypothesis")
from _support import LoopFactory  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PY311 = sys.version_info >= (3, 11)
PY312 = sys.version_info >= (3, 12)


def _socket_writelines_names():
    import asyncio.selector_events as se

    return se._SelectorSocketTransport.writelines.__code__.co_names if PY312 else ()


# From 3.12 asyncio's socket transport has a writelines() of its own (not a
# write() of the items joined), which on some releases fails from its own
# internals: to a closing or lost connection it buffers the items and raises
# TypeError or AttributeError (before CPython gh-136234), an empty item stays
# in its buffer for ever (the transport never drains, so never closes), and
# it does not pause the protocol (before gh-127655; 3.12.1 and 3.13.0 are
# among both). The fuzzer leaves those out (docs/compatibility.md).
WRITELINES_IGNORES_LOST = PY312 and "_conn_lost" not in _socket_writelines_names()
WRITELINES_NO_PAUSE = PY312 and "_maybe_pause_protocol" not in _socket_writelines_names()

# Programs per transport in the suite, and in a long run.
DEFAULT_EXAMPLES = {"tcp": 25, "unix": 20, "pipe": 25, "tls": 15, "tls_split": 20, "starttls": 10}
EXAMPLES = int(os.environ.get("ZUVRS_FUZZ_EXAMPLES", "0") or 0)
SEED = os.environ.get("ZUVRS_FUZZ_SEED", "")
# ZUVRS_FUZZ_AGAINST=asyncio compares asyncio's loop with itself: what of
# the observations is timing (to be normalised) rather than the loop.
AGAINST = os.environ.get("ZUVRS_FUZZ_AGAINST", "zuvrs")

# How long one program may take on one loop.
PROGRAM_TIMEOUT = 30.0
# A settled state: nothing changed for this many polls 1 ms apart.
STABLE_ROUNDS = 3

KiB = 1024

# What a run counted, per transport (tools/fuzz.sh prints it).
COUNTS = {}


# -- the bytes written ---------------------------------------------------------------

_BLOCK = 1 << 20
_PATTERNS = {}


def pattern(end, offset, n):
    """Bytes ``offset .. offset+n`` of what ``end`` writes (reproducible)."""
    import random

    block = _PATTERNS.get(end)
    if block is None:
        block = _PATTERNS[end] = random.Random(end).randbytes(_BLOCK)
    start = offset % _BLOCK
    if start + n <= _BLOCK:
        return block[start:start + n]
    return (block[start:] + block)[:n]


def as_type(data, kind):
    if kind == "bytearray":
        return bytearray(data)
    if kind == "memoryview":
        return memoryview(bytearray(data))
    return data


def describe(exc):
    if exc is None:
        return None
    args = exc.args
    if isinstance(exc, ssl.SSLError):
        # (OpenSSL's text names the function on some versions only.)
        return (type(exc).__name__, getattr(exc, "reason", None))
    return (type(exc).__name__, args)


def kernel_queues(fd):
    """(bytes to read, bytes not yet sent) the kernel holds for ``fd``."""
    out = []
    for req in (termios.FIONREAD, termios.TIOCOUTQ):
        try:
            buf = fcntl.ioctl(fd, req, b"\0\0\0\0")
            out.append(struct.unpack("i", buf)[0])
        except OSError:
            out.append(None)
    return tuple(out)


# -- the recording protocol ---------------------------------------------------------------


class FuzzProtocol(asyncio.Protocol):
    def __init__(self, run, end, eof_result):
        self.run = run
        self.end = end
        self.eof_result = eof_result
        self.transport = None
        self.data = bytearray()
        self.lost = False
        self.eof = False
        self.wpaused = False

    def connection_made(self, transport):
        self.transport = transport
        self.run.event(self.end, ("made",))

    def data_received(self, data):
        self.deliver(data)

    def deliver(self, data):
        if self.eof:
            self.run.event(self.end, ("data after eof", len(data)))
        if self.lost:
            self.run.event(self.end, ("data after lost", len(data)))
        self.data += data
        self.run.tick()

    def eof_received(self):
        self.eof = True
        self.run.event(self.end, ("eof", len(self.data), self.eof_result))
        return self.eof_result

    def pause_writing(self):
        if self.wpaused:
            self.run.event(self.end, ("pause_writing while paused",))
        self.wpaused = True
        self.run.tick()

    def resume_writing(self):
        if not self.wpaused:
            self.run.event(self.end, ("resume_writing while not paused",))
        self.wpaused = False
        self.run.tick()

    def connection_lost(self, exc):
        if self.lost:
            self.run.event(self.end, ("lost again",))
        self.lost = True
        self.run.event(self.end, ("lost", len(self.data), describe(exc)))


class BufferedFuzzProtocol(FuzzProtocol, asyncio.BufferedProtocol):
    """FuzzProtocol whose bytes come through get_buffer()/buffer_updated():
    each get_buffer() lends the next of the program's buffers (its size and
    type cycled from ``buffers``; an empty one is a protocol error)."""

    def __init__(self, run, end, eof_result, buffers):
        super().__init__(run, end, eof_result)
        self.buffers = buffers
        self.lent = 0
        self.buf = None
        self.hints = set()

    def get_buffer(self, sizehint):
        size, kind = self.buffers[self.lent % len(self.buffers)]
        self.lent += 1
        self.buf = bytearray(size)
        if self.run.is_tls(self.end):
            # sslproto's hint is what its incoming BIO holds, which depends
            # on how the socket's reads were split: not compared. And it
            # reads the rest of a record into buf[offset:], a copy when buf
            # is a bytearray, so those bytes are lost (they arrive as
            # zeros): a memoryview, which slices without copying.
            return memoryview(self.buf)
        self.hints.add(sizehint)
        return memoryview(self.buf) if kind == "memoryview" else self.buf

    def buffer_updated(self, nbytes):
        if self.buf is None:
            self.run.event(self.end, ("buffer_updated without get_buffer", nbytes))
            return
        self.deliver(bytes(self.buf[:nbytes]))
        self.buf = None

    def data_received(self, data):
        self.run.event(self.end, ("data_received on a buffered protocol", len(data)))
        self.deliver(data)


class _LogCatcher(logging.Handler):
    def __init__(self, run):
        super().__init__(logging.WARNING)
        self.run = run

    def emit(self, record):
        self.run.event("loop", ("log", record.getMessage()))


# -- one run of a program on one loop ----------------------------------------------------------


class Run:
    """A program's run on one loop: the ends, and what was observed."""

    def __init__(self, loop, kind, program):
        self.loop = loop
        self.kind = kind
        self.program = program
        self.step = "setup"
        self.obs = {}
        self.ticks = 0
        self.protos = {}
        self.fds = {}
        self.written = {}
        # Bytes an end had written when it first closed or wrote EOF.
        self.graceful_at = {}
        self.aborted = set()
        self.closed = set()
        self.peer = None
        # Ends upgraded by start_tls().
        self.tls_ends = set()
        self.server = None
        self.cleanup = []

    # -- recording ------------------------------------------------------------

    def event(self, end, what):
        self.obs.setdefault(end, []).append((self.step, what))
        self.ticks += 1

    def tick(self):
        self.ticks += 1

    def signature(self):
        sig = [self.ticks]
        for end, proto in sorted(self.protos.items()):
            tr = proto.transport
            sig.append(len(proto.data))
            if tr is not None:
                if end != "r":
                    sig.append(tr.get_write_buffer_size())
                sig.append(tr.is_closing())
            if not proto.lost and end in self.fds:
                sig.append(kernel_queues(self.fds[end]))
        if self.peer is not None:
            sig.append(self.peer.signature())
        return tuple(sig)

    async def settle(self):
        stable = 0
        last = None
        deadline = time.monotonic() + 10
        while stable < STABLE_ROUNDS:
            await asyncio.sleep(0.001)
            if self.peer is not None:
                self.peer.pump()
            sig = self.signature()
            if sig == last:
                stable += 1
            else:
                stable, last = 0, sig
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.kind}: no settled state after step {self.step}: {sig}")

    def snapshot(self):
        for end, proto in sorted(self.protos.items()):
            tr = proto.transport
            state = {"received": len(proto.data), "paused_writing": proto.wpaused}
            if tr is not None:
                state["closing"] = tr.is_closing()
                # (3.10's read pipe transport has no is_reading(): 3.11 added it.)
                if end != "w" and (PY311 or self.kind != "pipe"):
                    state["reading"] = tr.is_reading()
                if end != "r":
                    # How much of a write the kernel takes under back-pressure
                    # depends on how writes were split into system calls
                    # (zuvrs batches a turn's writes into one): whether
                    # anything is left is compared, not how much.
                    size = tr.get_write_buffer_size()
                    state["buffered"] = size if size == 0 else "some"
            self.event(end, ("state", tuple(sorted(state.items()))))
        if self.peer is not None:
            self.event("peer", ("state", self.peer.state()))

    # -- operations -------------------------------------------------------------

    def is_tls(self, end):
        return self.kind.startswith("tls") or end in self.tls_ends

    async def start_tls(self):
        """Upgrades both ends to TLS (``a`` the client) when both are open,
        reading, with nothing buffered or unread (else the bytes would be
        taken for the handshake's)."""
        a, b = self.protos["a"], self.protos["b"]
        ok = not self.tls_ends and all(
            not p.lost and not p.eof and not p.transport.is_closing() and p.transport.is_reading()
            and p.transport.get_write_buffer_size() == 0 and kernel_queues(self.fds[end]) == (0, 0)
            for end, p in (("a", a), ("b", b)))
        self.event("a", ("starttls", ok))
        if not ok:
            return
        sctx, cctx = self.program["contexts"]
        try:
            ta, tb = await asyncio.wait_for(asyncio.gather(
                self.loop.start_tls(a.transport, a, cctx, server_hostname="localhost"),
                self.loop.start_tls(b.transport, b, sctx, server_side=True)), 10)
        except Exception as exc:  # noqa: BLE001
            self.event("a", ("starttls failed", describe(exc)))
            return
        a.transport, b.transport = ta, tb
        self.tls_ends = {"a", "b"}

    def take(self, end, n):
        return pattern(end, len(self.written.setdefault(end, bytearray())), n)

    def do(self, end, op):
        if end == "peer":
            return self.peer.do(op)
        proto = self.protos[end]
        tr = proto.transport
        name = op[0]
        try:
            if name == "write":
                data = self.take(end, op[1])
                tr.write(as_type(data, op[2]))
                self.written[end] += data
            elif name == "writelines":
                sizes = op[1]
                socket_kind = self.kind in ("tcp", "unix", "starttls") and not self.is_tls(end)
                if PY312 and socket_kind:
                    if WRITELINES_IGNORES_LOST and tr.is_closing():
                        return
                    sizes = [n for n in sizes if n]
                datas = []
                for n in sizes:
                    d = pattern(end, len(self.written.setdefault(end, bytearray())) + sum(map(len, datas)), n)
                    datas.append(d)
                tr.writelines(datas)
                for d in datas:
                    self.written[end] += d
                if WRITELINES_NO_PAUSE and socket_kind:
                    # What later releases' writelines() does at its end.
                    tr.set_write_buffer_limits(*reversed(tr.get_write_buffer_limits()))
            elif name == "pause_reading":
                tr.pause_reading()
            elif name == "resume_reading":
                tr.resume_reading()
            elif name == "limits":
                if self.is_tls(end) and proto.lost:
                    # asyncio's SSLProtocol has let go of the protocol and
                    # may call pause_writing() on None (docs/compatibility.md).
                    return
                tr.set_write_buffer_limits(high=op[1], low=op[2])
            elif name == "write_eof":
                self.event(end, ("can_write_eof", tr.can_write_eof()))
                self.note_graceful(end, tr)
                tr.write_eof()
            elif name == "close":
                if self.is_tls(end) and tr.is_closing():
                    # A second close() of asyncio's TLS transport drops its
                    # SSLProtocol: every method fails with AttributeError
                    # from then on (docs/compatibility.md).
                    return
                self.note_graceful(end, tr)
                tr.close()
                self.closed.add(end)
            elif name == "abort":
                if end == "w" and tr.is_closing():
                    # asyncio's write pipe fails from its own internals then
                    # (AttributeError, docs/compatibility.md); zuvrs's does
                    # nothing more.
                    return
                tr.abort()
                self.aborted.add(end)
            elif name == "reset":
                sock = tr.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                tr.abort()
                self.aborted.add(end)
            else:
                raise AssertionError(name)
        except Exception as exc:  # noqa: BLE001
            self.event(end, ("raised", name, type(exc).__name__, str(exc)))

    def note_graceful(self, end, tr):
        """The first close()/write_eof() of a transport not yet closing (one
        that eof_received's answer closed has dropped later writes)."""
        if end not in self.graceful_at and not tr.is_closing():
            self.graceful_at[end] = len(self.written.setdefault(end, bytearray()))
        elif end not in self.graceful_at:
            self.graceful_at[end] = None

    # -- the checks each loop must pass by itself ----------------------------------------------

    def check_delivery(self, pairs):
        """``pairs``: (writer, reader) ends."""
        if self.peer is not None:
            sent = bytes(self.written.get("a", b""))
            assert self.peer.data == sent[:len(self.peer.data)], "a->peer: received bytes are not what was written"
            got = bytes(self.protos["a"].data)
            assert got == pattern("peer", 0, len(got)), "peer->a: received bytes are not what was written"
        for w, r in pairs:
            written = bytes(self.written.get(w, b""))
            got = bytes(self.protos[r].data)
            assert got == written[:len(got)], f"{w}->{r}: received bytes are not what was written"
            if (self.graceful_at.get(w) is not None and not (self.aborted & {w, r}) and r not in self.closed
                    and not any(what[0] == "lost" and what[2] is not None
                                for end in (w, r) for _, what in self.obs.get(end, ()))):
                assert len(got) >= self.graceful_at[w], (
                    f"{w}->{r}: {len(got)} of the {self.graceful_at[w]} bytes written before "
                    f"{w}'s close/write_eof arrived")


# -- setting up each kind of connection -----------------------------------------------------


def make_protocol(run, end, eof_result):
    buffers = run.program.get("buffered", {}).get(end)
    if buffers:
        return BufferedFuzzProtocol(run, end, eof_result, buffers)
    return FuzzProtocol(run, end, eof_result)


async def open_stream_pair(run, kind):
    loop = run.loop
    eof_a, eof_b = run.program["eof"]
    accepted = []

    def server_factory():
        proto = make_protocol(run, "b", eof_b)
        accepted.append(proto)
        return proto

    def client_factory():
        return make_protocol(run, "a", eof_a)

    if kind in ("tcp", "tls", "starttls"):
        kw = {}
        ckw = {}
        if kind == "tls":
            sctx, cctx = run.program["contexts"]
            kw = {"ssl": sctx}
            ckw = {"ssl": cctx, "server_hostname": "localhost"}
        run.server = await loop.create_server(server_factory, "127.0.0.1", 0, **kw)
        port = run.server.sockets[0].getsockname()[1]
        _, client = await loop.create_connection(client_factory, "127.0.0.1", port, **ckw)
    else:
        d = tempfile.mkdtemp(prefix="zuvrs-fuzz-")
        path = os.path.join(d, "s")
        run.cleanup.append(lambda: (os.path.exists(path) and os.unlink(path), os.rmdir(d)))
        run.server = await loop.create_unix_server(server_factory, path)
        _, client = await loop.create_unix_connection(client_factory, path)
    deadline = time.monotonic() + 5
    while not (accepted and accepted[0].transport is not None):
        if time.monotonic() > deadline:
            raise AssertionError("no connection accepted")
        await asyncio.sleep(0.001)
    run.protos = {"a": client, "b": accepted[0]}
    for end, proto in run.protos.items():
        sock = proto.transport.get_extra_info("socket")
        run.fds[end] = sock.fileno()


async def open_pipe_pair(run):
    loop = run.loop
    eof_w, eof_r = run.program["eof"]
    rfd, wfd = os.pipe()
    rpipe = os.fdopen(rfd, "rb", 0)
    wpipe = os.fdopen(wfd, "wb", 0)
    _, wproto = await loop.connect_write_pipe(lambda: FuzzProtocol(run, "w", eof_w), wpipe)
    _, rproto = await loop.connect_read_pipe(lambda: FuzzProtocol(run, "r", eof_r), rpipe)
    run.protos = {"w": wproto, "r": rproto}
    run.fds = {"r": rfd}


class SplitPeer:
    """The far end of a TLS connection, driven by the test: an SSLObject
    over memory BIOs on a plain non-blocking socket. Its ciphertext waits in
    ``pending`` until an operation sends a slice of it."""

    def __init__(self, run, ctx, server_side, hs_split):
        self.run = run
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_side=server_side,
                                server_hostname=None if server_side else "localhost")
        self.sock = None
        self.pending = bytearray()
        self.hs_split = list(hs_split) or [1000]
        self.hs_done = False
        self.data = bytearray()
        self.written = 0
        self.raw_in = 0
        self.eof_seen = False
        self.close_notify_seen = False
        self.unwrapped = False
        self.sent_eof = False
        self.failed = False

    def signature(self):
        return (len(self.data), self.raw_in, self.eof_seen, self.close_notify_seen,
                kernel_queues(self.sock.fileno()) if self.sock is not None else None)

    def state(self):
        return (("received", len(self.data)), ("eof", self.eof_seen),
                ("close_notify", self.close_notify_seen))

    def _recv(self):
        while self.sock is not None and not self.eof_seen:
            try:
                b = self.sock.recv(256 * KiB)
            except BlockingIOError:
                return
            except OSError as exc:
                self.run.event("peer", ("recv failed", type(exc).__name__))
                self.eof_seen = True
                return
            if not b:
                self.eof_seen = True
                self.run.event("peer", ("eof", len(self.data)))
                return
            self.raw_in += len(b)
            self.incoming.write(b)

    def handshake_step(self):
        """One step of the handshake; the flight it makes, to send in slices."""
        self._recv()
        try:
            self.obj.do_handshake()
            self.hs_done = True
        except ssl.SSLWantReadError:
            pass
        return self.outgoing.read()

    def pump(self):
        if not self.hs_done or self.sock is None:
            return
        self._recv()
        while not (self.close_notify_seen or self.failed):
            try:
                chunk = self.obj.read(256 * KiB)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                chunk = b""
            except ssl.SSLError as exc:
                self.failed = True
                self.run.event("peer", ("ssl error", describe(exc)))
                break
            if not chunk:
                self.close_notify_seen = True
                self.run.event("peer", ("close_notify", len(self.data)))
                break
            self.data += chunk
            self.run.tick()
        self.pending += self.outgoing.read()

    def do(self, op):
        name = op[0]
        try:
            if name == "psend":
                self.obj.write(pattern("peer", self.written, op[1]))
                self.written += op[1]
                self.pending += self.outgoing.read()
            elif name == "pflush":
                if self.pending and self.sock is not None:
                    k = max(1, len(self.pending) * op[1] // 1000)
                    try:
                        n = self.sock.send(self.pending[:k])
                    except BlockingIOError:
                        n = 0
                    del self.pending[:n]
            elif name == "pnotify":
                if not self.unwrapped:
                    self.unwrapped = True
                    try:
                        self.obj.unwrap()
                    except ssl.SSLWantReadError:
                        pass
                    self.pending += self.outgoing.read()
            elif name == "peof":
                if self.sock is not None and not self.sent_eof:
                    self.sent_eof = True
                    self.sock.shutdown(socket.SHUT_WR)
            elif name == "preset":
                if self.sock is not None:
                    self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.sock.close()
                    self.sock = None
            else:
                raise AssertionError(name)
        except Exception as exc:  # noqa: BLE001
            self.run.event("peer", ("raised", name, type(exc).__name__))

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None


async def open_split_pair(run):
    loop = run.loop
    p = run.program
    sctx, cctx = p["contexts"]
    loop_is_server = p["loop_is_server"]
    made = []

    def factory():
        proto = FuzzProtocol(run, "a", p["eof"][0])
        made.append(proto)
        return proto

    peer = run.peer = SplitPeer(run, cctx if loop_is_server else sctx, not loop_is_server, p["hs_split"])
    if loop_is_server:
        run.server = await loop.create_server(factory, "127.0.0.1", 0, ssl=sctx)
        port = run.server.sockets[0].getsockname()[1]
        peer.sock = socket.create_connection(("127.0.0.1", port))
        peer.sock.setblocking(False)
        # (Without it a small record waits for the delayed ACK of the last.)
        peer.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = None
    else:
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        lsock.setblocking(False)
        run.cleanup.append(lsock.close)
        task = asyncio.ensure_future(loop.create_connection(
            factory, "127.0.0.1", lsock.getsockname()[1], ssl=cctx, server_hostname="localhost"))
    deadline = time.monotonic() + 10
    slices = 0
    while not (peer.hs_done and made and made[0].transport is not None and (task is None or task.done())):
        if time.monotonic() > deadline:
            raise AssertionError("no TLS handshake")
        await asyncio.sleep(0.001)
        if peer.sock is None:
            try:
                peer.sock, _ = lsock.accept()
            except BlockingIOError:
                continue
            peer.sock.setblocking(False)
            peer.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        flight = peer.handshake_step()
        while flight:
            k = max(1, len(flight) * peer.hs_split[slices % len(peer.hs_split)] // 1000)
            slices += 1
            peer.sock.sendall(flight[:k])
            flight = flight[k:]
            await asyncio.sleep(0.002)
    if task is not None:
        task.result()
    run.protos = {"a": made[0]}
    run.fds = {"a": made[0].transport.get_extra_info("socket").fileno()}


# -- running a program ---------------------------------------------------------------------


async def main(run):
    kind = run.kind
    if kind == "pipe":
        await open_pipe_pair(run)
        pairs = [("w", "r")]
    elif kind == "tls_split":
        await open_split_pair(run)
        pairs = []
    else:
        await open_stream_pair(run, kind)
        pairs = [("a", "b"), ("b", "a")]
    await run.settle()
    run.snapshot()
    for i, step in enumerate(run.program["steps"]):
        run.step = i
        if step[0][1][0] == "starttls":
            await run.start_tls()
        else:
            for end, op in step:
                run.do(end, op)
        await run.settle()
        run.snapshot()
    # The end: whatever is paused reads, the peer sends what it holds; then
    # everything still open is aborted.
    run.step = "drain"
    for end, proto in run.protos.items():
        tr = proto.transport
        if end != "w" and not tr.is_closing():
            tr.resume_reading()
    if run.peer is not None:
        run.peer.do(("pflush", 1000))
    await run.settle()
    run.snapshot()
    for end, proto in sorted(run.protos.items()):
        if isinstance(proto, BufferedFuzzProtocol):
            run.event(end, ("get_buffer sizehints", tuple(sorted(proto.hints))))
    run.check_delivery(pairs)
    run.step = "abort"
    for end, proto in run.protos.items():
        if not proto.lost:
            end_it(end, proto.transport)
    if run.peer is not None:
        run.peer.close()
    await run.settle()
    run.snapshot()
    if run.server is not None:
        run.server.close()
        await asyncio.wait_for(run.server.wait_closed(), 5)


def end_it(end, transport):
    if end == "r":
        transport.close()  # (a read pipe has no abort())
    else:
        transport.abort()


def execute(loop_name, kind, program):
    """What a program's run on ``loop_name``'s loop observed."""
    loop = LoopFactory(loop_name)()
    run = Run(loop, kind, program)
    loop.set_exception_handler(lambda lp, ctx: run.event(
        "loop", ("handler", ctx.get("message"), describe(ctx.get("exception")))))
    catcher = _LogCatcher(run)
    log = logging.getLogger("asyncio")
    log.addHandler(catcher)
    try:
        guard = loop.call_later(PROGRAM_TIMEOUT, loop.stop)
        loop.run_until_complete(main(run))
        guard.cancel()
    finally:
        log.removeHandler(catcher)
        for end, proto in run.protos.items():
            if proto.transport is not None and not proto.lost:
                end_it(end, proto.transport)
        if run.peer is not None:
            run.peer.close()
        if run.server is not None:
            run.server.close()
        loop.run_until_complete(asyncio.sleep(0.01))
        loop.close()
        asyncio.set_event_loop(None)
        for f in run.cleanup:
            f()
    return run.obs


# -- the programs -------------------------------------------------------------------------------

SIZES = st.one_of(
    st.integers(0, 100),
    st.integers(101, 16 * KiB),
    st.sampled_from([64 * KiB - 1, 64 * KiB, 64 * KiB + 1, 200 * KiB, 1 << 20]),
)
WRITE = st.tuples(st.just("write"), SIZES, st.sampled_from(["bytes", "bytearray", "memoryview"]))
WRITELINES = st.tuples(st.just("writelines"), st.lists(SIZES, max_size=4))
MARK = st.sampled_from([None, 0, 1, 512, 16 * KiB, 64 * KiB, 1 << 20])
LIMITS = st.tuples(st.just("limits"), MARK, MARK)
PAUSE = st.just(("pause_reading",))
RESUME = st.just(("resume_reading",))
WRITE_EOF = st.just(("write_eof",))
CLOSE = st.just(("close",))
ABORT = st.just(("abort",))
RESET = st.just(("reset",))
STARTTLS = st.just(("starttls",))
EOF_RESULT = st.sampled_from([None, False, True])
# A BufferedProtocol's buffers: sizes (an empty one now and then: asyncio's
# fatal "get_buffer() returned an empty buffer") and types, cycled.
BUFFER_SIZE = st.one_of(st.integers(1, 100), *[st.integers(101, 64 * KiB)] * 4,
                        *[st.sampled_from([256 * KiB, 1 << 20])] * 2, st.just(0))
BUFFERS = st.lists(st.tuples(BUFFER_SIZE, st.sampled_from(["bytearray", "memoryview"])), min_size=1, max_size=3)


def _ops(*weighted):
    return st.one_of(*[s for s, w in weighted for _ in range(w)])


def stream_op(kind):
    ops = [(WRITE, 4), (WRITELINES, 1), (PAUSE, 2), (RESUME, 2), (LIMITS, 1), (WRITE_EOF, 1),
           (CLOSE, 1), (ABORT, 1)]
    if kind in ("tcp", "tls", "starttls"):
        ops.append((RESET, 1))
    return _ops(*ops)


def steps(end_ops, max_steps=10):
    """Steps of one to three (end, operation) pairs."""
    one = st.one_of(*[st.tuples(st.just(end), op) for end, op in end_ops])
    return st.lists(st.lists(one, min_size=1, max_size=3), max_size=max_steps)


@st.composite
def programs(draw, kind, pki=None):
    p = {}
    if kind == "pipe":
        w_ops = _ops((WRITE, 4), (WRITELINES, 1), (LIMITS, 1), (WRITE_EOF, 1), (CLOSE, 1), (ABORT, 1))
        r_ops = _ops((PAUSE, 1), (RESUME, 1), (CLOSE, 1))
        p["eof"] = (None, draw(EOF_RESULT))
        p["steps"] = draw(steps([("w", w_ops), ("w", w_ops), ("r", r_ops)]))
        return p
    if kind in ("tls", "tls_split", "starttls"):
        version = draw(st.sampled_from([ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3]))
        p["version"] = version.name
        p["contexts"] = pki_contexts(pki, version)
    if kind == "tls_split":
        p["loop_is_server"] = draw(st.booleans())
        p["hs_split"] = draw(st.lists(st.integers(1, 1000), max_size=3))
        p["eof"] = (draw(EOF_RESULT),)
        loop_ops = _ops((WRITE, 3), (WRITELINES, 1), (PAUSE, 2), (RESUME, 2), (LIMITS, 1),
                        (WRITE_EOF, 1), (CLOSE, 1), (ABORT, 1))
        peer_ops = _ops(
            (st.tuples(st.just("psend"), st.one_of(st.integers(1, 100), st.integers(101, 64 * KiB))), 3),
            (st.tuples(st.just("pflush"), st.integers(1, 1000)), 4),
            (st.just(("pnotify",)), 1), (st.just(("peof",)), 1), (st.just(("preset",)), 1))
        p["steps"] = peer_apart(draw(steps([("a", loop_ops), ("peer", peer_ops), ("peer", peer_ops)], max_steps=14)))
        return p
    p["eof"] = (draw(EOF_RESULT), draw(EOF_RESULT))
    if kind in ("tcp", "unix", "starttls"):
        # Either end may read through get_buffer()/buffer_updated().
        p["buffered"] = {end: draw(st.one_of(st.just(None), BUFFERS)) for end in ("a", "b")}
    op = stream_op(kind)
    end_ops = [("a", op), ("b", op)]
    if kind == "starttls":
        end_ops.append(("a", STARTTLS))
    p["steps"] = reset_alone(draw(steps(end_ops)))
    return p


def peer_apart(program_steps):
    """The hand-driven peer's operations get steps of their own: a peer that
    acts between a write() and the end of that turn sees what zuvrs has not
    sent yet (writes are batched per turn: docs/compatibility.md), which no
    peer outside the loop's thread can tell from timing."""
    out = []
    for step in program_steps:
        current = []
        for end, op in step:
            if current and (current[-1][0] == "peer") != (end == "peer"):
                out.append(current)
                current = []
            current.append((end, op))
        out.append(current)
    return out


def reset_alone(program_steps):
    """A reset gets a step of its own: with bytes still in the kernel's send
    queue, what an RST discards depends on whether the peer's read runs
    before the socket's close in that turn, which zuvrs orders otherwise
    (docs/compatibility.md, "Differential fuzzing")."""
    out = []
    for step in program_steps:
        current = []
        for end, op in step:
            if op[0] in ("reset", "starttls"):
                if current:
                    out.append(current)
                out.append([(end, op)])
                current = []
            else:
                current.append((end, op))
        if current:
            out.append(current)
    return out


def pki_contexts(pki, version):
    from _tls_support import client_context, server_context

    return server_context(pki, version=version), client_context(pki, version=version)


def printable(program):
    return {k: v for k, v in program.items() if k != "contexts"}


def fuzz(kind, pki=None):
    examples = EXAMPLES or DEFAULT_EXAMPLES[kind]
    counts = COUNTS.setdefault(kind, {"programs": 0, "steps": 0, "seconds": 0.0})
    options = dict(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        print_blob=True,
    )
    if SEED == "random":
        pass
    elif SEED:
        options["derandomize"] = False
    else:
        options["derandomize"] = True
    began = time.monotonic()

    @settings(**options)
    @given(program=programs(kind, pki))
    def check(program):
        counts["programs"] += 1
        counts["steps"] += len(program["steps"])
        ref = execute("asyncio", kind, program)
        got = execute(AGAINST, kind, program)
        if got != ref:
            raise AssertionError(f"{kind}: {AGAINST} differs from asyncio on {printable(program)}\n"
                                 + diff(ref, got))

    if SEED and SEED != "random":
        check = hypothesis.seed(int(SEED))(check)
    try:
        check()
    finally:
        counts["seconds"] += time.monotonic() - began
        print(f"\nfuzz {kind}: {counts['programs']} programs, {counts['steps']} steps, "
              f"{counts['seconds']:.1f} s")


def diff(ref, got):
    lines = []
    for end in sorted(set(ref) | set(got), key=str):
        a, b = ref.get(end, []), got.get(end, [])
        if a == b:
            continue
        lines.append(f"-- end {end}:")
        for i in range(max(len(a), len(b))):
            x = a[i] if i < len(a) else None
            y = b[i] if i < len(b) else None
            mark = "  " if x == y else "!!"
            lines.append(f"{mark} asyncio {x}\n{mark} {AGAINST:7} {y}")
    return "\n".join(lines)


# -- the tests ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    pytest.importorskip("cryptography")
    from _tls_certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


def test_fuzz_tcp():
    fuzz("tcp")


def test_fuzz_unix():
    fuzz("unix")


def test_fuzz_pipe():
    fuzz("pipe")


@pytest.mark.skipif(not PY311, reason="asserts 3.11+'s sslproto (zuvrs's native TLS follows it)")
def test_fuzz_tls(pki):
    fuzz("tls", pki)


@pytest.mark.skipif(not PY311, reason="asserts 3.11+'s sslproto (zuvrs's native TLS follows it)")
def test_fuzz_tls_split(pki):
    fuzz("tls_split", pki)


@pytest.mark.skipif(not PY311, reason="asserts 3.11+'s sslproto (zuvrs's native TLS follows it)")
def test_fuzz_starttls(pki):
    fuzz("starttls", pki)
