"""add_signal_handler / remove_signal_handler and Ctrl-C handling.

Tests that actually deliver a signal run in a child interpreter: a loop that
fails to install its handler would otherwise let SIGUSR1's default action
kill the whole test session.
"""

import signal
import sys
import textwrap
import threading
import time

import pytest
from _support import last_json_line, noop_coro, run_child, spawn_child

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
