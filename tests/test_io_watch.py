"""add_reader / add_writer / remove_reader / remove_writer."""

import os
import socket
import tempfile
import time

import pytest
from _support import collect_exceptions, run_forever, run_once


@pytest.fixture
def sockpair():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def test_reader_callback_with_args(loop, sockpair):
    a, b = sockpair
    received = []

    def on_readable(*args):
        received.append((args, a.recv(100)))
        loop.stop()

    loop.add_reader(a.fileno(), on_readable, "x", 2)
    b.send(b"data")
    run_forever(loop)
    assert received == [(("x", 2), b"data")]
    assert loop.remove_reader(a.fileno()) is True


def test_reader_not_called_without_data(loop, sockpair):
    a, _ = sockpair
    calls = []
    loop.add_reader(a.fileno(), calls.append, "read")
    loop.call_later(0.05, loop.stop)
    run_forever(loop)
    assert calls == []
    assert loop.remove_reader(a.fileno()) is True


def test_reader_on_object_with_fileno(loop, sockpair):
    a, b = sockpair
    received = []

    def on_readable():
        received.append(a.recv(100))
        loop.stop()

    loop.add_reader(a, on_readable)
    b.send(b"obj")
    run_forever(loop)
    assert received == [b"obj"]
    # The socket object and its fd are the same registration.
    assert loop.remove_reader(a.fileno()) is True
    assert loop.remove_reader(a) is False


def test_custom_fileno_object(loop, sockpair):
    a, b = sockpair

    class Wrapper:
        def fileno(self):
            return a.fileno()

    received = []

    def on_readable():
        received.append(a.recv(100))
        loop.stop()

    loop.add_reader(Wrapper(), on_readable)
    b.send(b"wrapped")
    run_forever(loop)
    assert received == [b"wrapped"]
    assert loop.remove_reader(Wrapper()) is True


def test_remove_reader_return_values(loop, sockpair):
    a, _ = sockpair
    assert loop.remove_reader(a.fileno()) is False
    loop.add_reader(a.fileno(), print)
    assert loop.remove_reader(a.fileno()) is True
    assert loop.remove_reader(a.fileno()) is False


def test_remove_writer_return_values(loop, sockpair):
    a, _ = sockpair
    assert loop.remove_writer(a.fileno()) is False
    loop.add_writer(a.fileno(), print)
    assert loop.remove_writer(a.fileno()) is True
    assert loop.remove_writer(a.fileno()) is False


def test_removed_reader_is_not_called(loop, sockpair):
    a, b = sockpair
    calls = []
    loop.add_reader(a.fileno(), calls.append, "read")
    assert loop.remove_reader(a.fileno()) is True
    b.send(b"x")
    loop.call_later(0.03, loop.stop)
    run_forever(loop)
    assert calls == []


def test_replacing_reader(loop, sockpair):
    a, b = sockpair
    calls = []

    def second():
        calls.append("second")
        a.recv(100)
        loop.stop()

    loop.add_reader(a.fileno(), calls.append, "first")
    loop.add_reader(a.fileno(), second)
    b.send(b"x")
    run_forever(loop)
    assert calls == ["second"]
    assert loop.remove_reader(a.fileno()) is True
    assert loop.remove_reader(a.fileno()) is False


def test_replacing_writer(loop, sockpair):
    a, _ = sockpair
    calls = []

    def second():
        calls.append("second")
        calls.append(loop.remove_writer(a.fileno()))
        loop.stop()

    loop.add_writer(a.fileno(), calls.append, "first")
    loop.add_writer(a.fileno(), second)
    run_forever(loop)
    assert calls == ["second", True]
    assert loop.remove_writer(a.fileno()) is False


def test_writer_fires_when_writable(loop, sockpair):
    a, b = sockpair
    calls = []

    def on_writable(tag):
        calls.append(tag)
        a.send(b"hello")
        loop.remove_writer(a.fileno())
        loop.stop()

    loop.add_writer(a.fileno(), on_writable, "w")
    run_forever(loop)
    assert calls == ["w"]
    assert b.recv(100) == b"hello"


def test_writer_waits_for_buffer_space(loop, sockpair):
    a, b = sockpair
    # Fill a's send buffer until it would block.
    try:
        while True:
            a.send(b"x" * 65536)
    except BlockingIOError:
        pass
    calls = []
    loop.add_writer(a.fileno(), calls.append, "writable")
    loop.call_later(0.03, loop.stop)
    run_forever(loop)
    assert calls == []

    def drain():
        try:
            while b.recv(1 << 20):
                pass
        except BlockingIOError:
            pass

    def check():
        if calls:
            loop.stop()
        else:
            loop.call_later(0.005, check)

    loop.call_soon(drain)
    loop.call_soon(check)
    run_forever(loop)
    assert calls and set(calls) == {"writable"}
    assert loop.remove_writer(a.fileno()) is True


def test_reader_and_writer_on_same_fd_are_independent(loop, sockpair):
    a, b = sockpair
    events = []

    def on_writable():
        events.append(("w", loop.remove_writer(a.fileno())))
        b.send(b"ping")

    def on_readable():
        events.append(("r", a.recv(100)))
        loop.stop()

    loop.add_reader(a.fileno(), on_readable)
    loop.add_writer(a.fileno(), on_writable)
    run_forever(loop)
    assert events == [("w", True), ("r", b"ping")]
    assert loop.remove_reader(a.fileno()) is True
    assert loop.remove_writer(a.fileno()) is False


def test_remove_reader_keeps_writer(loop, sockpair):
    a, _ = sockpair
    calls = []

    def on_writable():
        calls.append("w")
        loop.stop()

    loop.add_reader(a.fileno(), calls.append, "r")
    loop.add_writer(a.fileno(), on_writable)
    assert loop.remove_reader(a.fileno()) is True
    run_forever(loop)
    assert calls == ["w"]
    assert loop.remove_writer(a.fileno()) is True


def test_reader_is_level_triggered(loop, sockpair):
    a, b = sockpair
    calls = []

    def on_readable():
        calls.append(1)
        if len(calls) == 5:  # never read: the fd stays readable
            loop.remove_reader(a.fileno())
            loop.stop()

    loop.add_reader(a.fileno(), on_readable)
    b.send(b"x")
    run_forever(loop)
    assert len(calls) == 5
    assert a.recv(100) == b"x"


def test_reader_fires_once_per_iteration(loop, sockpair):
    a, b = sockpair
    calls = []
    loop.add_reader(a.fileno(), calls.append, 1)
    b.send(b"x")
    for i in range(1, 4):
        run_once(loop)  # each iteration polls once, with a zero timeout
        assert len(calls) == i
    assert loop.remove_reader(a.fileno()) is True


def test_reader_on_peer_close(loop, sockpair):
    a, b = sockpair
    received = []

    def on_readable():
        received.append(a.recv(100))
        received.append(loop.remove_reader(a.fileno()))
        loop.stop()

    loop.add_reader(a.fileno(), on_readable)
    b.close()
    run_forever(loop)
    assert received == [b"", True]


def test_reader_on_pipe(loop):
    r, w = os.pipe()
    try:
        os.set_blocking(r, False)
        received = []

        def on_readable():
            received.append(os.read(r, 100))
            loop.stop()

        loop.add_reader(r, on_readable)
        os.write(w, b"pipe")
        run_forever(loop)
        assert received == [b"pipe"]
        assert loop.remove_reader(r) is True
    finally:
        os.close(r)
        os.close(w)


def test_many_fds(loop):
    pairs = [socket.socketpair() for _ in range(100)]
    try:
        received = {}

        def on_readable(i, sock):
            received[i] = sock.recv(100)
            loop.remove_reader(sock.fileno())
            if len(received) == len(pairs):
                loop.stop()

        for i, (a, _b) in enumerate(pairs):
            a.setblocking(False)
            loop.add_reader(a.fileno(), on_readable, i, a)
        for i, (_a, b) in enumerate(pairs):
            b.send(str(i).encode())
        run_forever(loop)
        assert received == {i: str(i).encode() for i in range(len(pairs))}
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_add_reader_while_running(loop, sockpair):
    a, b = sockpair
    received = []

    def on_readable():
        received.append(a.recv(100))
        loop.stop()

    def register():
        loop.add_reader(a.fileno(), on_readable)
        b.send(b"late")

    loop.call_later(0.01, register)
    run_forever(loop)
    assert received == [b"late"]
    loop.remove_reader(a.fileno())


def test_reader_exception_goes_to_handler_and_reader_stays(loop, sockpair):
    a, b = sockpair
    contexts = collect_exceptions(loop)
    calls = []

    def on_readable():
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("reader failed")
        a.recv(100)
        loop.stop()

    loop.add_reader(a.fileno(), on_readable)
    b.send(b"x")
    run_forever(loop)
    assert len(calls) == 2
    assert len(contexts) == 1
    assert contexts[0][1]["message"].startswith("Exception in callback")
    assert isinstance(contexts[0][1]["exception"], ValueError)
    loop.remove_reader(a.fileno())


def test_remove_reader_after_fd_closed(loop):
    a, b = socket.socketpair()
    fd = a.fileno()
    loop.add_reader(fd, print)
    a.close()
    try:
        assert loop.remove_reader(fd) is True
        run_once(loop)  # the loop survives the stale registration being gone
    finally:
        b.close()


# -- invalid arguments -------------------------------------------------------------

@pytest.mark.parametrize("method", ["add_reader", "add_writer"])
@pytest.mark.parametrize("bad", [-1, -100], ids=["minus1", "minus100"])
def test_invalid_fd(loop, method, bad):
    with pytest.raises(ValueError, match="Invalid file descriptor"):
        getattr(loop, method)(bad, print)


@pytest.mark.parametrize("method", ["remove_reader", "remove_writer"])
def test_remove_invalid_fd(loop, method):
    with pytest.raises(ValueError, match="Invalid file descriptor"):
        getattr(loop, method)(-1)


@pytest.mark.parametrize("method", ["add_reader", "add_writer"])
@pytest.mark.parametrize("bad", [object(), "abc", 1.5, None], ids=["object", "str", "float", "none"])
def test_object_without_fileno(loop, method, bad):
    with pytest.raises(ValueError, match="Invalid file object"):
        getattr(loop, method)(bad, print)


@pytest.mark.parametrize("method", ["remove_reader", "remove_writer"])
def test_remove_object_without_fileno(loop, method):
    with pytest.raises(ValueError, match="Invalid file object"):
        getattr(loop, method)(object())


@pytest.mark.parametrize("method", ["add_reader", "add_writer"])
def test_regular_file(loop, method):
    with tempfile.TemporaryFile() as f:
        # epoll refuses regular files with EPERM.
        with pytest.raises(PermissionError):
            getattr(loop, method)(f.fileno(), print)
        remove = method.replace("add", "remove")
        assert getattr(loop, remove)(f.fileno()) is False
        # The loop is still fine.
        run_once(loop)


def test_close_loop_with_registered_reader(loop, sockpair):
    a, b = sockpair
    loop.add_reader(a.fileno(), print)
    loop.add_writer(b.fileno(), print)
    loop.close()
    assert loop.remove_reader(a.fileno()) is False
    assert loop.remove_writer(b.fileno()) is False
    # Closing the loop does not close the watched file descriptors.
    b.send(b"still open")
    a.setblocking(True)
    assert a.recv(100) == b"still open"


def test_iteration_order_ready_then_io_then_timers(loop, sockpair):
    # One asyncio iteration runs, in order: callbacks that were already
    # ready, then the I/O callbacks of this poll, then the timers now due.
    a, b = sockpair
    order = []

    def on_readable():
        order.append("io")
        a.recv(100)
        loop.remove_reader(a.fileno())

    loop.add_reader(a.fileno(), on_readable)
    b.send(b"x")
    loop.call_later(0.001, order.append, "timer")
    loop.call_soon(order.append, "ready")
    time.sleep(0.01)
    run_once(loop)
    assert order == ["ready", "io", "timer"]


def test_busy_callbacks_do_not_starve_readers(loop, sockpair):
    a, b = sockpair
    spins = 0
    received = []

    def spin():
        nonlocal spins
        spins += 1
        if not received:
            loop.call_soon(spin)

    def on_readable():
        received.append(a.recv(100))
        loop.remove_reader(a.fileno())
        loop.stop()

    loop.add_reader(a.fileno(), on_readable)
    loop.call_soon(spin)
    loop.call_later(0.01, b.send, b"x")
    run_forever(loop)
    assert received == [b"x"]
    assert spins > 1
