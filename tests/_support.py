"""Small helpers shared by the zuvrs parity tests.

Every test in this directory runs the same body on the stdlib selector loop
("asyncio") and on zuvrs ("zuvrs"); asyncio is the reference behaviour.
"""

import asyncio
import contextlib
import fcntl
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import warnings

PY311 = sys.version_info >= (3, 11)
PY312 = sys.version_info >= (3, 12)
PY313 = sys.version_info >= (3, 13)
PY314 = sys.version_info >= (3, 14)

LOOP_NAMES = ("asyncio", "zuvrs")

# Default guard for anything that could hang.
TIMEOUT = 5.0


class LoopFactory:
    """A callable making a fresh event loop, tagged with the loop's name."""

    def __init__(self, name):
        self.name = name

    def __call__(self):
        if self.name == "asyncio":
            # What asyncio.new_event_loop() returns on Linux under the default
            # policy; spelled out so that a leaked policy (zuvrs.install())
            # can never silently turn the reference loop into a zuvrs loop.
            return asyncio.SelectorEventLoop()
        import zuvrs

        return zuvrs.new_event_loop()

    def __repr__(self):
        return f"LoopFactory({self.name!r})"


async def noop_coro():
    """A coroutine function (for 'coroutines cannot be used with ...' checks)."""


# The four ways to schedule a plain callback, as f(loop, callback, *args, **kw);
# the timer variants use a deadline that is already due.
SCHEDULERS = {
    "call_soon": lambda lp, cb, *args, **kw: lp.call_soon(cb, *args, **kw),
    "call_soon_threadsafe": lambda lp, cb, *args, **kw: lp.call_soon_threadsafe(cb, *args, **kw),
    "call_later": lambda lp, cb, *args, **kw: lp.call_later(0, cb, *args, **kw),
    "call_at": lambda lp, cb, *args, **kw: lp.call_at(lp.time(), cb, *args, **kw),
}


def loop_type(factory):
    """The class of the loops ``factory`` makes."""
    lp = factory()
    lp.close()
    return type(lp)


class Guard:
    """Stop ``loop`` after ``timeout`` seconds so a broken loop cannot hang.

    Used as a context manager around run_forever()/run_until_complete().
    On exit it cancels the guard timer and fails the test if it fired while
    the body completed normally (run_until_complete() already fails on its
    own with 'Event loop stopped before Future completed.').
    """

    def __init__(self, loop, timeout=TIMEOUT):
        self.loop = loop
        self.timeout = timeout
        self.fired = False
        self.handle = None

    def _fire(self):
        self.fired = True
        self.loop.stop()

    def __enter__(self):
        self.handle = self.loop.call_later(self.timeout, self._fire)
        return self

    def __exit__(self, exc_type, exc, tb):
        self.handle.cancel()
        if exc_type is None and self.fired:
            raise AssertionError(f"loop guard fired after {self.timeout}s")
        return False


def run(loop, aw, timeout=TIMEOUT):
    """run_until_complete(aw) with a guard timer."""
    with Guard(loop, timeout):
        return loop.run_until_complete(aw)


def run_forever(loop, timeout=TIMEOUT):
    """run_forever() that must be stopped by the test within ``timeout``."""
    with Guard(loop, timeout):
        loop.run_forever()


def run_once(loop):
    """Run exactly one loop iteration (stop() before run_forever())."""
    loop.stop()
    loop.run_forever()


def collect_exceptions(loop):
    """Install an exception handler that records contexts; return the list."""
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append((lp, ctx)))
    return contexts


@contextlib.contextmanager
def policy_restored():
    """Save and restore the global asyncio event loop policy."""
    with warnings.catch_warnings():
        # The policy system is deprecated on 3.14+.
        warnings.simplefilter("ignore", DeprecationWarning)
        saved = asyncio.get_event_loop_policy()
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_event_loop_policy(saved)
            asyncio.set_event_loop(None)


@contextlib.contextmanager
def one_at_a_time(name):
    """Held by one test process at a time on this machine (a lock file in
    the temporary directory): for tests too large to run beside each
    other in parallel workers."""
    with open(os.path.join(tempfile.gettempdir(), f"zuvrs-tests-{name}.lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# -- process metrics (Linux) -------------------------------------------------

def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fd_count():
    return len(os.listdir("/proc/self/fd"))


def gc_object_count():
    gc.collect()
    gc.collect()
    return len(gc.get_objects())


# -- child interpreters --------------------------------------------------------

def child_script(loop_name, body):
    """Source of a child program; ``body`` may use ``run`` and ``new_loop``.

    ``run(coro)`` is asyncio.run or zuvrs.run; ``new_loop()`` makes a loop
    of the kind under test.  SIGINT is reset to Python's default handler
    because a child started from a non-interactive shell may inherit
    SIG_IGN.
    """
    if loop_name == "asyncio":
        header = (
            "import asyncio\n"
            "run = asyncio.run\n"
            "new_loop = asyncio.SelectorEventLoop\n"
        )
    else:
        header = (
            "import asyncio, zuvrs\n"
            "run = zuvrs.run\n"
            "new_loop = zuvrs.new_event_loop\n"
        )
    prologue = "import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
    return prologue + header + textwrap.dedent(body)


def spawn_child(loop_name, body, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-c", child_script(loop_name, body)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def run_child(loop_name, body, timeout=20):
    """Run a child program to completion; returns subprocess.CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-c", child_script(loop_name, body)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def last_json_line(text):
    """The JSON document printed on the last non-empty line of ``text``."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert lines, "child printed nothing"
    return json.loads(lines[-1])


# -- networking ----------------------------------------------------------------

NOT_IMPLEMENTED = "zuvrs: not implemented yet"


def xfail_unimplemented(request, loop_name, reason=NOT_IMPLEMENTED):
    """Mark the running test xfail (non-strict) for the zuvrs param only.

    For features zuvrs does not have yet: the asyncio run must still pass,
    and the zuvrs run starts passing (XPASS) once the feature lands.
    """
    if loop_name == "zuvrs":
        import pytest

        request.applymarker(pytest.mark.xfail(strict=False, reason=reason))


def ipv6_loopback_works():
    """True if a TCP socket can be bound to ::1."""
    import socket

    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def unused_tcp_port(host="127.0.0.1"):
    """A port nothing listens on (bound then released; connecting is refused)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def payload(size, seed=0):
    """``size`` reproducible pseudo-random bytes."""
    import random

    return random.Random(seed).randbytes(size)


async def connected_streams(streams):
    """A server of ``streams`` (asyncio, or a module with its stream
    functions such as zuvrs.streams) on 127.0.0.1 and one connection to it:
    the server, the client's (reader, writer) and the server side's."""
    accepted = asyncio.get_running_loop().create_future()

    async def handle(reader, writer):
        accepted.set_result((reader, writer))

    server = await streams.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = await streams.open_connection("127.0.0.1", port)
    return server, client, await accepted


async def wait_until(predicate, timeout=TIMEOUT, interval=0.001):
    """Poll ``predicate()`` on the running loop until true; fail after timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate}")
        await asyncio.sleep(interval)


class RecordingProtocol(asyncio.Protocol):
    """A protocol recording what its transport does to it.

    Keeps the received bytes (unless ``keep_data=False``: then only their
    count and SHA-256), the order of callbacks in ``events`` (runs of
    data_received collapsed to one "data"), futures for connection_made,
    eof_received and connection_lost, and write flow-control calls.
    ``echo=True`` writes everything received back; ``eof_result`` is what
    eof_received() returns; ``pause_on_connect`` pauses reading in
    connection_made().
    """

    def __init__(self, *, keep_data=True, echo=False, eof_result=None, pause_on_connect=False):
        import hashlib

        loop = asyncio.get_running_loop()
        self.loop = loop
        self.transport = None
        self.keep_data = keep_data
        self.echo = echo
        self.eof_result = eof_result
        self.pause_on_connect = pause_on_connect
        self.events = []
        self.data = bytearray()
        self.nbytes = 0
        self.sha = hashlib.sha256()
        self.data_types = set()
        self.made = loop.create_future()
        self.eof = loop.create_future()
        self.lost = loop.create_future()
        self.pause_writing_calls = 0
        self.resume_writing_calls = 0
        self.writing_paused = False
        # get_write_buffer_size() at each pause_writing / resume_writing call.
        self.sizes_at_pause = []
        self.sizes_at_resume = []
        self._changed = None

    # -- waiting ------------------------------------------------------------

    def _notify(self):
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    async def until(self, predicate, timeout=TIMEOUT, what=None):
        """Wait until ``predicate()`` holds (re-checked on every callback)."""
        deadline = self.loop.time() + timeout
        while not predicate():
            remaining = deadline - self.loop.time()
            if remaining <= 0:
                raise AssertionError(
                    f"timed out waiting for {what or predicate} "
                    f"(received {self.nbytes} bytes, events {self.events})"
                )
            self._changed = self.loop.create_future()
            try:
                await asyncio.wait_for(self._changed, remaining)
            except asyncio.TimeoutError:
                pass

    async def received(self, n, timeout=TIMEOUT):
        """Wait for at least ``n`` bytes in total; fail early if the
        connection is lost first."""
        await self.until(lambda: self.nbytes >= n or self.lost.done(), timeout, f"{n} bytes")
        assert self.nbytes >= n, f"connection lost after {self.nbytes}/{n} bytes (events {self.events})"

    # -- protocol ------------------------------------------------------------

    def _event(self, name):
        if not (name == "data" and self.events and self.events[-1] == "data"):
            self.events.append(name)
        self._notify()

    def connection_made(self, transport):
        self.transport = transport
        if self.pause_on_connect:
            transport.pause_reading()
        self.made.set_result(transport)
        self._event("made")

    def data_received(self, data):
        self.data_types.add(type(data))
        self.nbytes += len(data)
        self.sha.update(data)
        if self.keep_data:
            self.data += data
        if self.echo:
            self.transport.write(data)
        self._event("data")

    def eof_received(self):
        self.eof.set_result(None)
        self._event("eof")
        return self.eof_result

    def pause_writing(self):
        self.pause_writing_calls += 1
        self.writing_paused = True
        self.sizes_at_pause.append(self.transport.get_write_buffer_size())
        self._event("pause_writing")

    def resume_writing(self):
        self.resume_writing_calls += 1
        self.writing_paused = False
        self.sizes_at_resume.append(self.transport.get_write_buffer_size())
        self._event("resume_writing")

    def connection_lost(self, exc):
        if not self.lost.done():
            self.lost.set_result(exc)
        self._event("lost")


class TcpPair:
    """A server and one connection to it, both ends with protocols.

    Use ``pair = await TcpPair.open(...)`` inside the loop; ``client`` and
    ``server`` are the protocols (``.transport`` on each), ``srv`` the
    asyncio.Server. ``await pair.aclose()`` closes everything.
    """

    def __init__(self):
        self.srv = None
        self.port = None
        self.client = None
        self.server = None
        self.accepted = []

    @classmethod
    async def open(cls, server_factory=RecordingProtocol, client_factory=RecordingProtocol, *,
                   host="127.0.0.1", server_kwargs=None, client_kwargs=None, timeout=TIMEOUT):
        loop = asyncio.get_running_loop()
        self = cls()

        def factory():
            proto = server_factory()
            self.accepted.append(proto)
            return proto

        self.srv = await loop.create_server(factory, host, 0, **(server_kwargs or {}))
        self.port = self.srv.sockets[0].getsockname()[1]
        _, self.client = await asyncio.wait_for(
            loop.create_connection(client_factory, host, self.port, **(client_kwargs or {})), timeout
        )
        await wait_until(lambda: self.accepted, timeout)
        self.server = self.accepted[0]
        await asyncio.wait_for(asyncio.shield(self.server.made), timeout)
        return self

    async def aclose(self):
        for proto in (self.client, *self.accepted):
            lost = getattr(proto, "lost", None)
            if proto is not None and proto.transport is not None and not (lost and lost.done()):
                proto.transport.abort()
        if self.srv is not None:
            self.srv.close()
            await asyncio.wait_for(self.srv.wait_closed(), TIMEOUT)
        # Let connection_lost callbacks run.
        for _ in range(3):
            await asyncio.sleep(0)


class ChunkKeeper(asyncio.Protocol):
    """Keeps the `bytes` objects data_received gets (those `keep(i)` picks,
    by index), with a copy and the hash of each made on arrival; answers
    b"k" once `size` more bytes have come (see check_kept_chunks)."""

    def __init__(self, keep):
        self.size = 1 << 60
        self.keep = keep
        self.kept = []
        self.copies = []
        self.stale_hashes = 0
        self.count = 0
        self.pending = 0
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        assert type(data) is bytes
        copy = bytes(bytearray(data))
        # A hash of the contents, not one cached for an earlier read's.
        if hash(data) != hash(copy):
            self.stale_hashes += 1
        self.copies.append(copy)
        if self.keep(self.count):
            self.kept.append((data, copy))
        self.count += 1
        self.pending += len(data)
        while self.pending >= self.size:
            self.pending -= self.size
            self.transport.write(b"k")


#: Which of a ChunkKeeper's `bytes` it keeps.
KEEP_PICKS = {"all": lambda i: True, "some": lambda i: i % 3 == 1, "none": lambda i: False}


async def send_answered(server, client, sizes):
    """Writes a message of each size from `server` (a RecordingProtocol) to
    `client` (a ChunkKeeper), each once the previous one was answered:
    most reads are then shorter than a read buffer, but large. Returns the
    messages."""
    messages = [payload(n, seed=i) for i, n in enumerate(sizes)]
    for message in messages:
        client.size = len(message)
        before = server.nbytes
        server.transport.write(message)
        await server.received(before + 1)
    return messages


async def check_kept_chunks(server, client, keep):
    """What a protocol keeps of data_received's `bytes` keeps its contents
    while later reads arrive, and each `bytes` hashes as its contents."""
    sizes = [70 * 1024, 130 * 1024, 250 * 1024, 90 * 1024, 200 * 1024, 70 * 1024] * 3
    messages = await send_answered(server, client, sizes)
    assert b"".join(client.copies) == b"".join(messages)
    assert client.stale_hashes == 0
    for data, copy in client.kept:
        assert data == copy and len(data) == len(copy)
    assert len(client.kept) == sum(1 for i in range(client.count) if keep(i))


async def check_kept_chunks_memory(server, client):
    """A protocol that keeps every `bytes` it gets: each holds memory about
    its size (at most one per connection a whole read buffer), however
    long the reads were."""
    usable = malloc_usable_size()
    await send_answered(server, client, [70 * 1024, 100 * 1024, 180 * 1024, 250 * 1024] * 4)
    # (Objects above 512 bytes are blocks of malloc's own; a read buffer
    # is 256 KiB, in whole pages when mmap made it.)
    held = [(usable(id(data)), len(data)) for data, _ in client.kept if len(data) > 4 * 1024]
    assert held and all(m <= 264 * 1024 for m, _ in held), held
    assert sum(1 for m, n in held if m > 1.5 * n) <= 1, held


def malloc_usable_size():
    """glibc's malloc_usable_size, or None."""
    import ctypes

    try:
        f = ctypes.CDLL(None).malloc_usable_size
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_void_p]
    f.restype = ctypes.c_size_t
    return f


def numbered_chunks(block, count):
    """``count`` chunks like ``block``, each starting with its 8-byte index
    (so lost, repeated or reordered chunks change any checksum)."""
    tail = block[8:]
    for i in range(count):
        yield i.to_bytes(8, "big") + tail


# -- datagrams ---------------------------------------------------------------------


def recording_socket(calls, family, type=socket.SOCK_DGRAM):
    """A socket whose class overrides sendto and recvfrom, appending each
    call's name to `calls` (a transport must call the socket's own methods)."""

    class Recording(socket.socket):
        def sendto(self, *args):
            calls.append("sendto")
            return super().sendto(*args)

        def recvfrom(self, *args):
            calls.append("recvfrom")
            return super().recvfrom(*args)

    return Recording(family, type)


class DatagramRecorder(asyncio.DatagramProtocol):
    """A datagram protocol recording what its transport does to it.

    ``datagrams`` holds (data, addr) pairs, ``errors`` the exceptions given to
    error_received, ``events`` the callback names in order (runs of
    "datagram" collapsed to one); ``got`` is a queue of (data, addr) pairs and
    exceptions; ``made`` and ``lost`` are futures; write flow-control calls
    are counted. ``echo=True`` sends every datagram back to its sender.
    """

    def __init__(self, echo=False):
        loop = asyncio.get_running_loop()
        self.echo = echo
        self.transport = None
        self.datagrams = []
        self.errors = []
        self.events = []
        self.got = asyncio.Queue()
        self.made = loop.create_future()
        self.lost = loop.create_future()
        self.pause_writing_calls = 0
        self.resume_writing_calls = 0
        self.sizes_at_pause = []
        self.sizes_at_resume = []

    def _event(self, name):
        if not (name == "datagram" and self.events and self.events[-1] == name):
            self.events.append(name)

    def connection_made(self, transport):
        self.transport = transport
        self.made.set_result(transport)
        self._event("made")

    def datagram_received(self, data, addr):
        self.datagrams.append((data, addr))
        self._event("datagram")
        if self.echo:
            self.transport.sendto(data, addr)
        self.got.put_nowait((data, addr))

    def error_received(self, exc):
        self.errors.append(exc)
        self._event("error")
        self.got.put_nowait(exc)

    def pause_writing(self):
        self.pause_writing_calls += 1
        self.sizes_at_pause.append(self.transport.get_write_buffer_size())
        self._event("pause_writing")

    def resume_writing(self):
        self.resume_writing_calls += 1
        self.sizes_at_resume.append(self.transport.get_write_buffer_size())
        self._event("resume_writing")

    def connection_lost(self, exc):
        self._event("lost")
        if not self.lost.done():
            self.lost.set_result(exc)
        else:
            self.events.append("lost again")


# -- child processes (Linux) -------------------------------------------------------


def proc_stat(pid):
    """(state, ppid, pgrp, session) of process ``pid`` from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3])


def child_pids():
    """Pids of this process's children (running or zombie)."""
    me = os.getpid()
    children = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(name)
            if st is not None and st[1] == me:
                children.add(int(name))
    return children


def zombie_children(pids=None):
    """Pids of this process's children that are zombies (<defunct>),
    restricted to ``pids`` when given."""
    me = os.getpid()
    candidates = pids if pids is not None else [int(n) for n in os.listdir("/proc") if n.isdigit()]
    zombies = []
    for pid in candidates:
        st = proc_stat(pid)
        if st is not None and st[0] == "Z" and st[1] == me:
            zombies.append(pid)
    return sorted(zombies)
