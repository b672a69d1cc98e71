"""add_signal_handler / remove_signal_handler and Ctrl-C handling.

Tests of add_signal_handler that deliver a signal run in a child
interpreter: a loop that fails to install its handler would otherwise let
SIGUSR1's default action kill the whole test session. The tests of the
windows around the poll and of the program's own wakeup fd deliver signals
to this process, with Python handlers they install (and remove) themselves.
"""

import _thread
import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from _support import PY311, TIMEOUT, last_json_line, noop_coro, run_child, spawn_child

# The tests that touch SIGINT in this process expect Python's default
# handler; the suite may have been started with SIGINT ignored. (The child
# interpreters reset it themselves: see _support.child_script.)
pytestmark = pytest.mark.usefixtures("sigint_default")

# -- argument checking (no signal is delivered) ------------------------------------

@pytest.mark.parametrize("sig", [0, 1000, -1])
def test_invalid_signal_number(loop, sig):
    with pytest.raises(ValueError, match="invalid signal number"):
        loop.add_signal_handler(sig, print)
    with pytest.raises(ValueError, match="invalid signal number"):
        loop.remove_signal_handler(sig)


@pytest.mark.parametrize("sig", ["SIGUSR1", 1.0, None])
def test_signal_not_an_int(loop, sig):
    with pytest.raises(TypeError, match="sig must be an int"):
        loop.add_signal_handler(sig, print)
    with pytest.raises(TypeError, match="sig must be an int"):
        loop.remove_signal_handler(sig)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_uncatchable_signal(loop, sig):
    with pytest.raises(RuntimeError, match=f"sig {int(sig)} cannot be caught"):
        loop.add_signal_handler(sig, print)
    assert loop.remove_signal_handler(sig) is False


def test_coroutine_function_rejected(loop):
    with pytest.raises(TypeError, match="coroutines cannot be used with add_signal_handler"):
        loop.add_signal_handler(signal.SIGUSR1, noop_coro)
    assert loop.remove_signal_handler(signal.SIGUSR1) is False


def test_add_signal_handler_emits_no_deprecation_warning(loop):
    # 3.14 deprecates asyncio.iscoroutinefunction(); the loop must not call it.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        loop.add_signal_handler(signal.SIGUSR1, lambda: None)
    assert loop.remove_signal_handler(signal.SIGUSR1)


def test_remove_signal_handler_returns_bool(loop):
    assert loop.remove_signal_handler(signal.SIGUSR1) is False
    loop.add_signal_handler(signal.SIGUSR1, print)
    assert loop.remove_signal_handler(signal.SIGUSR1) is True
    assert loop.remove_signal_handler(signal.SIGUSR1) is False
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_remove_sigint_handler_restores_default_int_handler(loop):
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    loop.add_signal_handler(signal.SIGINT, print)
    assert loop.remove_signal_handler(signal.SIGINT) is True
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_add_signal_handler_from_non_main_thread(loop_factory):
    outcome = {}

    def attempt(key, fn):
        try:
            outcome[key] = fn()
        except Exception as exc:  # noqa: BLE001 - asserted below
            outcome[key] = exc

    def target():
        lp = loop_factory()
        try:
            attempt("add", lambda: lp.add_signal_handler(signal.SIGUSR1, print))
            attempt("remove", lambda: lp.remove_signal_handler(signal.SIGUSR1))
        finally:
            lp.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(10)
    assert isinstance(outcome["add"], RuntimeError), outcome
    assert outcome["remove"] is False
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


# -- delivery (child process) ------------------------------------------------------

DELIVERY_BODY = """
    import json, os, threading, time
    loop = new_loop()
    fut = loop.create_future()
    got = []

    def wrong(*args):
        got.append(["replaced handler ran"])

    def handler(*args):
        got.append(list(args) + [asyncio.get_running_loop() is loop])
        fut.set_result(time.monotonic())

    loop.add_signal_handler(signal.SIGUSR1, wrong)
    loop.add_signal_handler(signal.SIGUSR1, handler, "a", 1)
    sent = []

    def killer():
        time.sleep(0.2)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGUSR1)

    loop.call_later(30, loop.stop)  # the loop blocks in a long timer
    loop.call_soon(threading.Thread(target=killer).start)
    handled_at = loop.run_until_complete(fut)
    removed = loop.remove_signal_handler(signal.SIGUSR1)
    again = loop.remove_signal_handler(signal.SIGUSR1)
    loop.close()
    print(json.dumps({"got": got, "latency": handled_at - sent[0],
                      "removed": removed, "again": again}))
"""


def test_signal_delivered_while_blocked(loop_name):
    proc = run_child(loop_name, DELIVERY_BODY)
    assert proc.returncode == 0, proc.stderr
    result = last_json_line(proc.stdout)
    assert result["got"] == [["a", 1, True]]
    assert result["latency"] < 0.5
    assert result["removed"] is True
    assert result["again"] is False


ORDER_BODY = """
    import json, os
    loop = new_loop()
    order = []
    loop.add_signal_handler(signal.SIGUSR1, order.append, "usr1")
    loop.add_signal_handler(signal.SIGUSR2, order.append, "usr2")

    def send():
        os.kill(os.getpid(), signal.SIGUSR1)
        order.append("after-kill")  # the handler is a callback, not run inside os.kill
        os.kill(os.getpid(), signal.SIGUSR2)

    def check():
        if len(order) >= 3:
            loop.stop()
        else:
            loop.call_later(0.001, check)

    loop.call_soon(send)
    loop.call_soon(check)
    loop.call_later(10, loop.stop)
    loop.run_forever()
    loop.close()
    print(json.dumps(order))
"""


def test_signal_handler_runs_as_loop_callback(loop_name):
    proc = run_child(loop_name, ORDER_BODY)
    assert proc.returncode == 0, proc.stderr
    order = last_json_line(proc.stdout)
    assert order[0] == "after-kill"
    assert sorted(order[1:]) == ["usr1", "usr2"]


CLOSE_BODY = """
    import os, sys
    loop = new_loop()
    loop.add_signal_handler(signal.SIGUSR1, print, "should not run")
    loop.close()
    print("closed", flush=True)
    os.kill(os.getpid(), signal.SIGUSR1)  # default action again: terminate
    import time; time.sleep(2)
    print("survived", flush=True)
"""


def test_close_removes_signal_handlers(loop_name):
    proc = run_child(loop_name, CLOSE_BODY)
    assert proc.stdout.split() == ["closed"]
    assert proc.returncode == -signal.SIGUSR1


SIGINT_RESTORED_BODY = """
    import os, time
    loop = new_loop()
    loop.add_signal_handler(signal.SIGINT, print, "loop handler")
    loop.remove_signal_handler(signal.SIGINT)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(2)
        print("no KeyboardInterrupt")
    except KeyboardInterrupt:
        print("KeyboardInterrupt")
    loop.close()
"""


def test_sigint_after_remove_raises_keyboard_interrupt(loop_name):
    proc = run_child(loop_name, SIGINT_RESTORED_BODY)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["KeyboardInterrupt"]


# -- Ctrl-C on run() -----------------------------------------------------------------

MAIN_BODIES = {
    "sleep": """
        async def main():
            print("ready", flush=True)
            await asyncio.sleep(3600)
    """,
    "busy": """
        async def main():
            print("ready", flush=True)
            while True:
                await asyncio.sleep(0)
    """,
    "catch-cancel": """
        async def main():
            print("ready", flush=True)
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                print("main cancelled", flush=True)
                raise
    """,
}


@pytest.mark.parametrize("main_kind", sorted(MAIN_BODIES))
def test_sigint_interrupts_run(loop_name, main_kind):
    if loop_name == "asyncio" and main_kind == "busy" and sys.version_info < (3, 11):
        # 3.10's asyncio.run lets KeyboardInterrupt out of whatever the loop is
        # doing; when it lands outside the coroutine (say, after _run_once
        # took the task's step off the ready queue), the step is lost and
        # run()'s cleanup waits for the main task forever. 3.11's Runner
        # cancels the main task on Ctrl-C instead.
        pytest.skip("asyncio 3.10 can hang on Ctrl-C in a busy loop")
    body = textwrap.dedent(MAIN_BODIES[main_kind]) + "run(main())\n"
    proc = spawn_child(loop_name, body)
    try:
        ready = proc.stdout.readline()
        assert ready.strip() == "ready", proc.stderr.read() if proc.poll() is not None else ready
        time.sleep(0.1)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=5)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert elapsed < 5
    assert err.rstrip().splitlines()[-1] == "KeyboardInterrupt", err
    assert "Traceback" in err
    # Uncaught KeyboardInterrupt: CPython re-raises SIGINT to die from it.
    assert proc.returncode == -signal.SIGINT
    if main_kind == "catch-cancel":
        # asyncio.run (Runner semantics) cancels the main task on Ctrl-C.
        assert out.split() == ["main", "cancelled"]
    else:
        assert out == ""


# -- signals in this process: the windows around the poll -------------------------
#
# These tests deliver signals to the test process itself, in the main thread,
# so they set the dispositions they need (the suite may have been started
# with SIGINT ignored: a background job of a non-interactive shell, nohup,
# trap '' INT) and put back what they found, the wakeup fd included.

@pytest.fixture
def signal_state():
    """Saves SIGINT's and SIGUSR1's dispositions and the wakeup fd; restores them."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGUSR1)}
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            # None: a handler not installed from Python, which cannot be put back.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        signal.set_wakeup_fd(wakeup)


def deadline_marker(loop):
    """A list that a C callback (no bytecode runs in it) fills at the guard
    deadline, just before the guard stops the loop. A signal handler that
    finds it empty ran before the deadline: the loop woke up for the signal
    itself, not for the guard's timer."""
    passed = []
    loop.call_later(TIMEOUT, passed.append, True)
    return passed


def test_sigint_tripped_just_before_a_blocking_poll(loop, signal_state):
    # The last callback of the turn trips SIGINT from C code and returns:
    # no bytecode runs after it (so the interpreter has no chance to run the
    # handler), the ready queue is empty, and the loop goes on to a poll that
    # only the wakeup fd (or the guard's timer) can end. (interrupt_main()
    # trips the signal as the C signal handler does; signal.raise_signal()
    # and os.kill() would also run the Python handler before returning.)
    late = []
    passed = deadline_marker(loop)

    def on_sigint(signum, frame):
        late.append(bool(passed))
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    loop.call_soon(_thread.interrupt_main)
    loop.call_later(TIMEOUT, loop.stop)
    with pytest.raises(KeyboardInterrupt):
        loop.run_forever()
    assert late == [False]


def test_python_signal_handler_tripped_just_before_a_blocking_poll(loop, signal_state):
    # The same for a plain Python handler (the kind asyncio.Runner installs
    # for SIGINT): it must run while the loop waits, not at the next event.
    ran = []
    passed = deadline_marker(loop)

    def on_usr1(signum, frame):
        ran.append(bool(passed))
        loop.stop()

    signal.signal(signal.SIGUSR1, on_usr1)
    loop.call_soon(_thread.interrupt_main, signal.SIGUSR1)
    loop.call_later(TIMEOUT, loop.stop)
    loop.run_forever()
    assert ran == [False]


def test_sigint_from_another_thread_while_blocked(loop, signal_state):
    # The loop waits (no timer before the guard's) with the GIL released
    # while another thread signals the main thread.
    late = []
    passed = deadline_marker(loop)

    def on_sigint(signum, frame):
        late.append(bool(passed))
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    main = threading.main_thread().ident
    killer = threading.Thread(target=lambda: (time.sleep(0.05), signal.pthread_kill(main, signal.SIGINT)))
    loop.call_soon(killer.start)
    loop.call_later(TIMEOUT, loop.stop)
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_forever()
    finally:
        killer.join()
    assert late == [False]


class _HandlerError(Exception):
    pass


def test_exception_from_python_signal_handler_leaves_run_forever(loop, signal_state):
    # A Python signal handler runs between callbacks when a signal ends the
    # loop's wait; what it raises (any exception, not only
    # KeyboardInterrupt) leaves run_forever rather than going to the
    # exception handler, and the loop runs again afterwards.
    reported = []
    loop.set_exception_handler(lambda lp, ctx: reported.append(ctx))

    def on_usr1(signum, frame):
        raise _HandlerError("from the handler")

    signal.signal(signal.SIGUSR1, on_usr1)
    main = threading.main_thread().ident
    killer = threading.Thread(target=lambda: (time.sleep(0.05), signal.pthread_kill(main, signal.SIGUSR1)))
    loop.call_soon(killer.start)
    guard = loop.call_later(TIMEOUT, loop.stop)
    try:
        with pytest.raises(_HandlerError, match="from the handler"):
            loop.run_forever()
    finally:
        killer.join()
    guard.cancel()
    assert reported == []
    ran = []
    loop.call_soon(ran.append, 1)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert ran == [1]


@pytest.mark.skipif(not PY311, reason="asyncio.Runner (3.11+) cancels the main task on Ctrl-C")
def test_runner_interrupt_just_before_a_blocking_poll(loop_factory, signal_state):
    # CPython's test_runners interrupt tests, made deterministic: the main
    # task waits on a future and the interrupt comes from a C callback, so
    # Runner's SIGINT handler (which cancels the main task) only runs if the
    # wakeup fd wakes the poll.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    fut_box = []
    passed = []

    async def main():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        fut_box.append(fut)
        passed.append(deadline_marker(loop))
        loop.call_later(TIMEOUT, fut.cancel)
        loop.call_soon(_thread.interrupt_main)
        await fut

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        with pytest.raises(KeyboardInterrupt):
            runner.run(main())
    assert passed == [[]]
    assert fut_box[0].cancelled()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.skipif(not PY311, reason="asyncio.Runner is 3.11+")
def test_ignored_sigint_stays_ignored_by_runner(loop_factory, signal_state):
    # Why the Ctrl-C tests of uvloop and of CPython's test_runners hang when
    # the test process starts with SIGINT ignored (a background job of a
    # non-interactive shell, nohup ... &): Python keeps an inherited SIG_IGN,
    # asyncio.Runner then installs no handler, interrupt_main() does nothing,
    # and a child process inherits SIG_IGN and is not stopped by SIGINT. Both
    # loops leave it so.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def main():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        _thread.interrupt_main()
        signal.raise_signal(signal.SIGINT)
        for _ in range(3):
            await asyncio.sleep(0)
        return "done"

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        assert runner.run(main()) == "done"
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_keyboard_interrupt_from_protocol_callback_stops_a_waiting_loop(loop):
    # data_received runs inside libuv's read callback on zuvrs; what it
    # raises must end run_forever although nothing else would wake the loop.
    class Raiser(asyncio.Protocol):
        def data_received(self, data):
            raise KeyboardInterrupt

    a, b = socket.socketpair()
    try:
        transport, _ = loop.run_until_complete(loop.connect_accepted_socket(Raiser, a))
        passed = deadline_marker(loop)
        loop.call_later(TIMEOUT, loop.stop)
        loop.call_soon(b.send, b"x")
        with pytest.raises(KeyboardInterrupt):
            loop.run_forever()
        assert passed == []
        transport.abort()
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        b.close()


def test_child_that_exited_before_it_is_watched(loop, monkeypatch):
    # The child has exited (not yet reaped) by the time Popen returns, before
    # the loop sets up its watcher: the exit must still be reported.
    class ExitedPopen(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)

    monkeypatch.setattr(subprocess, "Popen", ExitedPopen)

    async def main():
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "raise SystemExit(7)")
        return await asyncio.wait_for(proc.wait(), TIMEOUT)

    if sys.version_info < (3, 12):
        # 3.11's policy watches children of the stdlib loop with its child
        # watcher, which needs the loop to be the current one.
        asyncio.set_event_loop(loop)
    assert loop.run_until_complete(main()) == 7


# -- the program's own wakeup fd ----------------------------------------------------
#
# asyncio's run_forever does not touch signal.set_wakeup_fd, so a wakeup fd
# the program set receives the signal numbers during a run. zuvrs points the
# wakeup fd at its own socket while it runs (libuv retries a poll that a
# signal interrupts, so the loop needs the byte to wake up for Ctrl-C) and
# forwards the bytes it reads to the program's fd.

@pytest.fixture
def program_wakeup_fd(signal_state):
    """A non-blocking socket pair whose write end the program set as its wakeup fd."""
    r, w = socket.socketpair()
    r.setblocking(False)
    w.setblocking(False)
    signal.set_wakeup_fd(w.fileno())
    try:
        yield r, w
    finally:
        signal.set_wakeup_fd(-1)
        r.close()
        w.close()


def received(sock):
    try:
        return sock.recv(100)
    except BlockingIOError:
        return b""


def current_wakeup_fd():
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


def test_program_wakeup_fd_receives_signals_during_run(loop, program_wakeup_fd):
    r, w = program_wakeup_fd
    ran = []
    passed = deadline_marker(loop)

    def on_usr1(signum, frame):
        ran.append(bool(passed))
        loop.stop()

    signal.signal(signal.SIGUSR1, on_usr1)
    loop.call_soon(_thread.interrupt_main, signal.SIGUSR1)
    loop.call_later(TIMEOUT, loop.stop)
    loop.run_forever()
    assert ran == [False]
    assert received(r) == bytes([signal.SIGUSR1])
    assert current_wakeup_fd() == w.fileno()


def test_program_wakeup_fd_and_ctrl_c_both_served(loop, program_wakeup_fd):
    # With the program's wakeup fd in place, Ctrl-C still wakes the loop
    # while it waits, and the program's fd gets SIGINT's byte.
    r, w = program_wakeup_fd
    late = []
    passed = deadline_marker(loop)

    def on_sigint(signum, frame):
        late.append(bool(passed))
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    loop.call_soon(_thread.interrupt_main)
    loop.call_later(TIMEOUT, loop.stop)
    with pytest.raises(KeyboardInterrupt):
        loop.run_forever()
    assert late == [False]
    assert received(r) == bytes([signal.SIGINT])
    assert current_wakeup_fd() == w.fileno()


def test_program_wakeup_fd_receives_signal_of_last_turn(loop, program_wakeup_fd):
    # The signal comes in the run's last turn, after which the loop does not
    # poll again: its byte still reaches the program's fd.
    r, w = program_wakeup_fd
    ran = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: ran.append(signum))
    loop.call_soon(_thread.interrupt_main, signal.SIGUSR1)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert ran == [signal.SIGUSR1]
    assert received(r) == bytes([signal.SIGUSR1])
    assert current_wakeup_fd() == w.fileno()


def test_program_wakeup_fd_over_several_runs(loop, program_wakeup_fd):
    r, w = program_wakeup_fd
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    for _ in range(3):
        loop.call_soon(_thread.interrupt_main, signal.SIGUSR1)
        loop.call_soon(loop.call_soon, loop.stop)
        loop.run_forever()
        _thread.interrupt_main(signal.SIGUSR1)  # between runs: straight to the program's fd
    assert received(r) == bytes([signal.SIGUSR1]) * 6
    assert current_wakeup_fd() == w.fileno()


def test_wakeup_fd_set_during_run_is_kept(loop, signal_state):
    # A wakeup fd the program sets while the loop runs is the program's
    # after the run (asyncio never touches it in run_forever).
    r, w = socket.socketpair()
    w.setblocking(False)
    try:
        loop.call_soon(signal.set_wakeup_fd, w.fileno())
        loop.call_soon(loop.stop)
        loop.run_forever()
        assert current_wakeup_fd() == w.fileno()
    finally:
        signal.set_wakeup_fd(-1)
        r.close()
        w.close()
