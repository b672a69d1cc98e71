"""Bad input gets what the stdlib loop gives: the same exception (or the
same acceptance), from the same call or the same later report.

Each test runs one body on the stdlib loop and on zuvrs and compares with
the stdlib's answer, which the body states.
"""

import asyncio
import decimal
import socket
import sys

import pytest
from _support import collect_exceptions, run


def outcome(loop, call):
    """('ok', result) or (exception type, message) of call(), run on the
    loop if it returns a coroutine."""
    try:
        result = call()
        if asyncio.iscoroutine(result):
            result = run(loop, result)
        return ("ok", result)
    except Exception as exc:
        return (type(exc), str(exc))


# -- getaddrinfo --------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [("", 0), (b"", 0), (None, None), ("", 80, socket.AI_NUMERICHOST)],
    ids=["empty-str", "empty-bytes", "nothing", "empty-numeric"],
)
def test_getaddrinfo_of_nothing_is_eai_noname(loop, args):
    host, port, *flags = args
    kind, message = outcome(loop, lambda: loop.getaddrinfo(host, port, flags=flags[0] if flags else 0))
    assert kind is socket.gaierror, message


def test_getaddrinfo_port_too_large_is_the_stdlibs_error(loop):
    # Up to 3.11 socket.getaddrinfo takes an int port as a C long
    # (OverflowError beyond); from 3.12 on it gives the resolver the digits,
    # which it refuses (gaierror).
    kind, message = outcome(loop, lambda: loop.getaddrinfo("127.0.0.1", 2**64))
    if sys.version_info < (3, 12):
        assert kind is OverflowError
        assert "too large" in message
    else:
        assert kind is socket.gaierror


@pytest.mark.parametrize("port", [True, 80.0])
def test_getaddrinfo_port_of_another_type_is_os_error(loop, port):
    # Only an exact int, a str, bytes or None is a port to the socket module.
    kind, message = outcome(loop, lambda: loop.getaddrinfo("127.0.0.1", port))
    assert kind is OSError
    assert message == "Int or String expected"


def test_getaddrinfo_port_ends_at_nul(loop):
    # The C string the socket module makes of "80\0" ends at the NUL.
    kind, infos = outcome(loop, lambda: loop.getaddrinfo("localhost", "80\0", type=socket.SOCK_STREAM))
    assert kind == "ok"
    assert infos and all(info[4][1] == 80 for info in infos)


# -- call_later / call_at / context= -------------------------------------------------


def test_call_later_of_a_huge_int_is_overflow(loop):
    kind, message = outcome(loop, lambda: loop.call_later(10**400, print))
    assert (kind, message) == (OverflowError, "int too large to convert to float")


@pytest.mark.parametrize("delay", [decimal.Decimal("0.01"), "later"], ids=["decimal", "str"])
def test_call_later_adds_as_float_plus_delay(loop, delay):
    kind, message = outcome(loop, lambda: loop.call_later(delay, print))
    assert kind is TypeError
    assert message.startswith("unsupported operand type(s) for +: 'float' and ")


def test_call_later_with_a_float_convertible_object_is_a_type_error(loop):
    class Delay:
        def __float__(self):
            return 0.01

    kind, message = outcome(loop, lambda: loop.call_later(Delay(), print))
    assert kind is TypeError
    assert message == "unsupported operand type(s) for +: 'float' and 'Delay'"


def test_call_later_with_radd_works(loop):
    class Delay:
        def __radd__(self, other):
            return other + 0.001

    fired = []
    loop.call_later(Delay(), fired.append, "fired")
    loop.call_later(0.05, loop.stop)
    loop.run_forever()
    assert fired == ["fired"]


@pytest.mark.parametrize("schedule", ["call_soon", "call_later", "call_at"])
def test_a_context_that_is_not_a_context_is_reported_when_due(loop, schedule):
    errors = collect_exceptions(loop)
    calls = []
    if schedule == "call_soon":
        h = loop.call_soon(calls.append, 1, context=42)
    elif schedule == "call_later":
        h = loop.call_later(0, calls.append, 1, context=42)
    else:
        h = loop.call_at(loop.time(), calls.append, 1, context=42)
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert calls == []
    assert len(errors) == 1
    ctx = errors[0][1]
    assert ctx["message"].startswith("Exception in callback ")
    assert isinstance(ctx["exception"], AttributeError)
    assert ctx["handle"] is h


def test_a_context_like_object_runs_the_callback(loop):
    class Runner:
        def __init__(self):
            self.ran = []

        def run(self, func, *args):
            self.ran.append(args)
            return func(*args)

    runner = Runner()
    got = []
    loop.call_soon(got.append, "x", context=runner)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert got == ["x"] and runner.ran == [("x",)]


# -- fd watchers ---------------------------------------------------------------------


def test_remove_reader_of_a_huge_fd_is_false(loop):
    assert loop.remove_reader(2**40) is False
    assert loop.remove_writer(2**40) is False


def test_add_reader_of_a_huge_fd_is_overflow(loop):
    kind, message = outcome(loop, lambda: loop.add_reader(2**40, print))
    assert (kind, message) == (OverflowError, "Python int too large to convert to C int")


@pytest.mark.parametrize("side", ["reader", "writer"])
def test_remove_watch_of_a_socket_closed_since(loop, side):
    # The selector finds a closed socket among its keys by identity.
    a, b = socket.socketpair()
    try:
        add = loop.add_reader if side == "reader" else loop.add_writer
        remove = loop.remove_reader if side == "reader" else loop.remove_writer
        add(a, print)
        a.close()
        assert remove(a) is True
        # Gone from the watches, a closed socket is invalid again.
        with pytest.raises(ValueError, match="Invalid file descriptor: -1"):
            remove(a)
    finally:
        a.close()
        b.close()


def test_remove_watch_of_a_closed_socket_never_watched(loop):
    a, b = socket.socketpair()
    a.close()
    b.close()
    kind, message = outcome(loop, lambda: loop.remove_reader(a))
    assert (kind, message) == (ValueError, "Invalid file descriptor: -1")


# -- transports --------------------------------------------------------------------------


def _pair(loop, protocol):
    a, b = socket.socketpair()
    transport, proto = run(loop, loop.create_connection(protocol, sock=a))
    return transport, proto, b


class Lost(asyncio.Protocol):
    lost = None

    def connection_lost(self, exc):
        self.lost = exc


def test_write_of_a_view_that_is_not_contiguous_fails_the_connection(loop):
    errors = collect_exceptions(loop)
    transport, proto, peer = _pair(loop, Lost)
    try:
        transport.write(memoryview(b"abcdef")[::2])  # no exception here
        run(loop, asyncio.sleep(0.02))
        assert isinstance(proto.lost, BufferError)
        assert [ctx["message"] for _, ctx in errors] == ["Fatal write error on socket transport"]
        assert isinstance(errors[0][1]["exception"], BufferError)
    finally:
        transport.close()
        peer.close()


def test_a_read_only_buffer_from_get_buffer_is_a_read_error(loop):
    errors = collect_exceptions(loop)

    class ReadOnly(asyncio.BufferedProtocol):
        lost = None

        def get_buffer(self, sizehint):
            return b"read-only"

        def buffer_updated(self, nbytes):
            raise AssertionError("nothing can be read into bytes")

        def connection_lost(self, exc):
            self.lost = exc

    transport, proto, peer = _pair(loop, ReadOnly)
    try:
        peer.send(b"data")
        run(loop, asyncio.sleep(0.05))
        assert isinstance(proto.lost, TypeError)
        assert "read-write bytes-like object" in str(proto.lost)
        assert [ctx["message"] for _, ctx in errors] == ["Fatal read error on socket transport"]
    finally:
        transport.close()
        peer.close()


@pytest.mark.parametrize("limits", [(1.5, None), (2**70, None), (None, 2.5)], ids=["float", "huge", "float-low"])
def test_write_buffer_limits_take_what_asyncio_takes(loop, limits):
    transport, proto, peer = _pair(loop, Lost)
    try:
        high, low = limits
        transport.set_write_buffer_limits(high, low)
        expected_high = high if high is not None else 4 * low
        expected_low = low if low is not None else expected_high // 4
        assert transport.get_write_buffer_limits() == (expected_low, expected_high)
    finally:
        transport.close()
        peer.close()
        run(loop, asyncio.sleep(0))


def test_write_buffer_limits_refuse_what_asyncio_refuses(loop):
    transport, proto, peer = _pair(loop, Lost)
    try:
        with pytest.raises(ValueError, match=r"high \(1\) must be >= low \(2\) must be >= 0"):
            transport.set_write_buffer_limits(1, 2)
    finally:
        transport.close()
        peer.close()
        run(loop, asyncio.sleep(0))


def test_sock_sendall_of_a_view_that_is_not_contiguous_is_a_buffer_error(loop):
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        kind, message = outcome(loop, lambda: loop.sock_sendall(a, memoryview(b"abcdef")[::2]))
        assert kind is BufferError
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("family", [socket.AF_UNIX, socket.AF_INET])
def test_create_connection_on_an_unconnected_socket(loop, family):
    # The first read meets the kernel's error (EINVAL, ENOTCONN): the
    # connection is lost with it, and the protocol sees no EOF.
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    events = []

    class Recorder(asyncio.Protocol):
        def eof_received(self):
            events.append("eof")

        def connection_lost(self, exc):
            events.append(exc)

    transport, _ = run(loop, loop.create_connection(Recorder, sock=sock))
    run(loop, asyncio.sleep(0.1))
    transport.close()
    run(loop, asyncio.sleep(0))
    assert len(events) == 1, events
    assert isinstance(events[0], OSError) and events[0].errno is not None


# -- set_debug and handles ---------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, "", "yes"])
def test_set_debug_takes_any_value(loop, value):
    loop.set_debug(value)
    assert bool(loop.get_debug()) == bool(value)


def test_timer_handle_has_asyncio_when_attribute(loop):
    h = loop.call_at(123.5, print)
    try:
        assert h._when == h.when() == 123.5
    finally:
        h.cancel()
