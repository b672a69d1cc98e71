"""Child processes: subprocess_exec / subprocess_shell and the asyncio.subprocess
API, on both loops.

Both loops start children with subprocess.Popen under asyncio's
BaseSubprocessTransport; asyncio's selector loop learns of exits from its
child watcher, zuvrs from a pidfd watched by the loop. asyncio is the
reference.
"""

import asyncio
import gc
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest
from _support import (
    PY311,
    TIMEOUT,
    child_pids,
    fd_count,
    payload,
    proc_stat,
    run,
    wait_until,
    zombie_children,
)

MiB = 1024 * 1024
SH = "/bin/sh"
TRUE = "/bin/true" if os.path.exists("/bin/true") else "/usr/bin/true"
ENV = "/usr/bin/env" if os.path.exists("/usr/bin/env") else "/bin/env"


def sh(script, **kwargs):
    """asyncio.create_subprocess_exec(/bin/sh -c script)."""
    return asyncio.create_subprocess_exec(SH, "-c", script, **kwargs)


async def output_of(*args, **kwargs):
    """stdout of a child (exec), which must exit 0."""
    proc = await asyncio.create_subprocess_exec(*args, stdout=subprocess.PIPE, **kwargs)
    out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode == 0, (args, proc.returncode)
    return out


def sha(data):
    return hashlib.sha256(data).hexdigest()


# -- create_subprocess_exec / _shell and the standard streams -----------------------------


def test_exec_pipes(loop):
    async def main():
        proc = await asyncio.create_subprocess_exec(
            "cat", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert isinstance(proc, asyncio.subprocess.Process)
        assert proc.pid > 0 and proc.returncode is None
        assert isinstance(proc.stdin, asyncio.StreamWriter)
        assert isinstance(proc.stdout, asyncio.StreamReader)
        assert isinstance(proc.stderr, asyncio.StreamReader)
        out, err = await asyncio.wait_for(proc.communicate(b"echo through cat"), TIMEOUT)
        assert (out, err) == (b"echo through cat", b"")
        assert proc.returncode == 0

    run(loop, main())


def test_shell(loop):
    async def main():
        proc = await asyncio.create_subprocess_shell(
            "read x; echo got $x $((6 * 7)); echo oops >&2; exit 3",
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(b"line\n"), TIMEOUT)
        assert (out, err, proc.returncode) == (b"got line 42\n", b"oops\n", 3)
        proc = await asyncio.create_subprocess_shell("no-such-command-zuvrs 2>/dev/null")
        assert await asyncio.wait_for(proc.wait(), TIMEOUT) == 127

    run(loop, main())


def test_shell_arguments_are_checked(loop):
    async def main():
        with pytest.raises(ValueError, match="universal_newlines must be False"):
            await asyncio.create_subprocess_shell("true", universal_newlines=True)
        with pytest.raises(ValueError, match="text must be False"):
            await asyncio.create_subprocess_exec(TRUE, text=True)
        with pytest.raises(ValueError, match="bufsize must be 0"):
            await loop.subprocess_exec(asyncio.SubprocessProtocol, TRUE, bufsize=1)
        with pytest.raises(ValueError, match="shell must be False"):
            await loop.subprocess_exec(asyncio.SubprocessProtocol, TRUE, shell=True)
        with pytest.raises(ValueError, match="shell must be True"):
            await loop.subprocess_shell(asyncio.SubprocessProtocol, "true", shell=False)
        with pytest.raises(ValueError, match="cmd must be a string"):
            await loop.subprocess_shell(asyncio.SubprocessProtocol, ["true"])
        with pytest.raises(ValueError, match="encoding must be None"):
            await asyncio.create_subprocess_exec(TRUE, encoding="utf-8")
        with pytest.raises(ValueError, match="errors must be None"):
            await asyncio.create_subprocess_shell("true", errors="strict")

    run(loop, main())


def test_communicate_10_mib_each_way(loop):
    data = payload(10 * MiB, seed=21)

    async def main():
        proc = await sh(
            "cat; head -c 1048576 /dev/zero >&2",
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(data), 20)
        assert proc.returncode == 0
        assert len(out) == len(data) and sha(out) == sha(data)
        assert err == b"\0" * MiB

    run(loop, main(), 25)


def test_streaming_stdin_stdout(loop):
    async def main():
        proc = await asyncio.create_subprocess_exec("cat", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for i in range(50):
            line = b"line %d\n" % i
            proc.stdin.write(line)
            await proc.stdin.drain()
            assert await asyncio.wait_for(proc.stdout.readline(), TIMEOUT) == line
        proc.stdin.close()
        assert await asyncio.wait_for(proc.stdout.read(), TIMEOUT) == b""
        assert await asyncio.wait_for(proc.wait(), TIMEOUT) == 0

    run(loop, main())


def test_communicate_with_child_not_reading(loop):
    async def main():
        # The child exits without reading: communicate() ignores the broken pipe.
        proc = await sh("exit 4", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(payload(4 * MiB)), TIMEOUT)
        assert (out, err, proc.returncode) == (b"", None, 4)
        # Writing and draining to it yourself raises instead.
        proc = await sh("exit 0", stdin=subprocess.PIPE)
        await proc.wait()
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            for _ in range(64):
                proc.stdin.write(b"x" * 65536)
                await asyncio.wait_for(proc.stdin.drain(), TIMEOUT)

    run(loop, main())


def test_devnull(loop):
    async def main():
        proc = await asyncio.create_subprocess_exec(
            "cat", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        assert proc.stdin is None and proc.stderr is None
        assert await asyncio.wait_for(proc.communicate(), TIMEOUT) == (b"", None)
        assert proc.returncode == 0
        proc = await sh("echo out; echo err >&2", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert proc.stdout is None
        assert await asyncio.wait_for(proc.communicate(), TIMEOUT) == (None, b"err\n")

    run(loop, main())


def test_stderr_to_stdout(loop):
    async def main():
        proc = await sh("echo out; echo err >&2; echo out2", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stderr is None
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
        assert (out, err) == (b"out\nerr\nout2\n", None)

    run(loop, main())


def test_fd_and_file_object_redirections(loop, tmp_path):
    async def main():
        out_path = tmp_path / "out.txt"
        fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            proc = await sh("echo to an fd; echo err to an fd >&2", stdout=fd, stderr=fd)
            assert proc.stdout is None and proc.stderr is None
            assert await asyncio.wait_for(proc.wait(), TIMEOUT) == 0
        finally:
            os.close(fd)
        assert out_path.read_bytes() == b"to an fd\nerr to an fd\n"

        in_path = tmp_path / "in.txt"
        in_path.write_bytes(b"from a file object\n")
        with open(in_path, "rb") as fin, open(tmp_path / "copy.txt", "wb") as fout:
            proc = await asyncio.create_subprocess_exec("cat", stdin=fin, stdout=fout)
            assert proc.stdin is None and proc.stdout is None
            assert await asyncio.wait_for(proc.wait(), TIMEOUT) == 0
        assert (tmp_path / "copy.txt").read_bytes() == b"from a file object\n"

        with open(in_path, "rb") as fin:
            proc = await asyncio.create_subprocess_exec("cat", stdin=fin.fileno(), stdout=subprocess.PIPE)
            assert await asyncio.wait_for(proc.communicate(), TIMEOUT) == (b"from a file object\n", None)

    run(loop, main())


# -- exit status ----------------------------------------------------------------------------


def test_wait_and_exit_codes(loop):
    async def main():
        for code in (0, 1, 7, 255):
            proc = await sh(f"exit {code}")
            assert await asyncio.wait_for(proc.wait(), TIMEOUT) == code
            assert proc.returncode == code
            assert await proc.wait() == code  # again
        # Several waiters on one child.
        proc = await sh("sleep 0.05; exit 9")
        results = await asyncio.wait_for(asyncio.gather(proc.wait(), proc.wait(), proc.wait()), TIMEOUT)
        assert results == [9, 9, 9]

    run(loop, main())


def test_returncode_for_signals(loop):
    async def main():
        proc = await sh("kill -TERM $$; sleep 10")
        assert await asyncio.wait_for(proc.wait(), TIMEOUT) == -signal.SIGTERM
        for action, sig in (("kill", signal.SIGKILL), ("terminate", signal.SIGTERM)):
            proc = await asyncio.create_subprocess_exec("sleep", "30")
            getattr(proc, action)()
            assert await asyncio.wait_for(proc.wait(), TIMEOUT) == -sig
        proc = await asyncio.create_subprocess_exec("sleep", "30")
        proc.send_signal(signal.SIGUSR1)
        assert await asyncio.wait_for(proc.wait(), TIMEOUT) == -signal.SIGUSR1
        # Once the transport is finished there is no process to signal.
        for method in (proc.kill, proc.terminate, lambda: proc.send_signal(signal.SIGKILL)):
            with pytest.raises(ProcessLookupError):
                method()
        assert proc.returncode == -signal.SIGUSR1

    run(loop, main())


def test_wait_timeout_leaves_child_running(loop):
    async def main():
        proc = await asyncio.create_subprocess_exec("sleep", "30")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), 0.1)
        assert proc.returncode is None
        assert proc_stat(proc.pid)[0] in "SR"
        proc.kill()
        assert await asyncio.wait_for(proc.wait(), TIMEOUT) == -signal.SIGKILL

    run(loop, main())


def test_child_killed_mid_stream(loop):
    async def main():
        proc = await asyncio.create_subprocess_exec("cat", "/dev/zero", stdout=subprocess.PIPE)
        got = await asyncio.wait_for(proc.stdout.readexactly(1 * MiB), TIMEOUT)
        assert got == b"\0" * MiB
        proc.kill()
        rest = await asyncio.wait_for(proc.stdout.read(), TIMEOUT)  # up to EOF
        assert rest.count(b"\0") == len(rest)
        assert await asyncio.wait_for(proc.wait(), TIMEOUT) == -signal.SIGKILL
        assert proc.stdout.at_eof()

    run(loop, main())


# -- Popen options -----------------------------------------------------------------------------


def test_cwd_env_executable(loop, tmp_path):
    async def main():
        out = await output_of("pwd", cwd=tmp_path)
        assert out.decode().strip() == os.path.realpath(tmp_path)
        out = await output_of(ENV, env={"ZUVRS_VAR": "value"})
        assert out == b"ZUVRS_VAR=value\n"
        out = await output_of(ENV, env={})
        assert out == b""
        out = await output_of("argv0-name", "-c", "echo $0", executable=SH)
        assert out == b"argv0-name\n"
        proc = await asyncio.create_subprocess_shell("pwd", cwd=tmp_path, stdout=subprocess.PIPE)
        assert (await proc.communicate())[0].decode().strip() == os.path.realpath(tmp_path)

    run(loop, main())


def test_pass_fds_and_close_fds(loop):
    async def main():
        r, w = os.pipe()
        try:
            # pass_fds: the child writes to a passed descriptor.
            # (dash cannot redirect to fds above 9: write through /proc.)
            proc = await sh(f"echo passed >/proc/self/fd/{w}", pass_fds=(w,))
            assert await asyncio.wait_for(proc.wait(), TIMEOUT) == 0
            assert os.read(r, 100) == b"passed\n"
            # An inheritable descriptor survives only with close_fds=False.
            os.set_inheritable(w, True)
            proc = await sh(f"echo inherited >/proc/self/fd/{w}", close_fds=False)
            assert await asyncio.wait_for(proc.wait(), TIMEOUT) == 0
            assert os.read(r, 100) == b"inherited\n"
            proc = await sh(f"echo closed >/proc/self/fd/{w}", close_fds=True, stderr=subprocess.DEVNULL)
            assert await asyncio.wait_for(proc.wait(), TIMEOUT) != 0
            os.set_blocking(r, False)
            with pytest.raises(BlockingIOError):
                os.read(r, 100)
            # Non-inheritable descriptors never reach the child.
            os.set_inheritable(w, False)
            proc = await sh(f"echo closed >/proc/self/fd/{w}", close_fds=False, stderr=subprocess.DEVNULL)
            assert await asyncio.wait_for(proc.wait(), TIMEOUT) != 0
        finally:
            os.close(r)
            os.close(w)

    run(loop, main())


def test_start_new_session(loop):
    async def main():
        my_sid = os.getsid(0)
        proc = await asyncio.create_subprocess_exec("cat", "/proc/self/stat", stdout=subprocess.PIPE)
        out, _ = await proc.communicate()
        pid, _, _, _, pgrp, session = out.split()[:6]
        assert int(pid) == proc.pid and int(session) == my_sid
        proc = await asyncio.create_subprocess_exec(
            "cat", "/proc/self/stat", stdout=subprocess.PIPE, start_new_session=True
        )
        out, _ = await proc.communicate()
        pid, _, _, _, pgrp, session = out.split()[:6]
        assert int(session) == proc.pid != my_sid
        assert int(pgrp) == proc.pid

    run(loop, main())


@pytest.mark.skipif(not PY311, reason="process_group is 3.11+")
def test_process_group(loop):
    async def main():
        proc = await asyncio.create_subprocess_exec(
            "cat", "/proc/self/stat", stdout=subprocess.PIPE, process_group=0
        )
        out, _ = await proc.communicate()
        pid, _, _, _, pgrp, session = out.split()[:6]
        assert int(pgrp) == proc.pid != os.getpgid(0)
        assert int(session) == os.getsid(0)

    run(loop, main())


def test_umask(loop):
    async def main():
        proc = await sh("umask", stdout=subprocess.PIPE, umask=0o027)
        assert (await proc.communicate())[0].strip() == b"0027"
        current = os.umask(0o022)
        os.umask(current)
        proc = await sh("umask", stdout=subprocess.PIPE)
        assert int((await proc.communicate())[0].strip(), 8) == current

    run(loop, main())


def test_restore_signals(loop):
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN  # Python ignores SIGPIPE
    sigpipe_bit = 1 << (signal.SIGPIPE - 1)

    async def ignored_in_child(**kwargs):
        out = await output_of("cat", "/proc/self/status", **kwargs)
        line = next(ln for ln in out.splitlines() if ln.startswith(b"SigIgn:"))
        return bool(int(line.split()[1], 16) & sigpipe_bit)

    async def main():
        assert await ignored_in_child() is False  # restore_signals=True is the default
        assert await ignored_in_child(restore_signals=True) is False
        assert await ignored_in_child(restore_signals=False) is True

    run(loop, main())


@pytest.mark.skipif(os.geteuid() != 0, reason="user/group need root")
def test_user_and_group(loop):
    async def main():
        out = await output_of(
            "id", user=os.getuid(), group=os.getgid(), extra_groups=[os.getgid()]
        )
        text = out.decode()
        assert f"uid={os.getuid()}(" in text and f"gid={os.getgid()}(" in text
        out = await output_of(SH, "-c", "id -u; id -g", user=os.getuid(), group=os.getgid())
        assert out.split() == [str(os.getuid()).encode(), str(os.getgid()).encode()]

    run(loop, main())


def test_preexec_fn(loop):
    async def main():
        r, w = os.pipe()
        try:
            def preexec():
                os.write(w, b"%d" % os.getpid())

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # preexec_fn with threads
                proc = await asyncio.create_subprocess_exec(TRUE, preexec_fn=preexec)
            assert await asyncio.wait_for(proc.wait(), TIMEOUT) == 0
            assert int(os.read(r, 100)) == proc.pid
        finally:
            os.close(r)
            os.close(w)

    run(loop, main())


def test_failed_exec(loop, tmp_path):
    not_executable = tmp_path / "script.sh"
    not_executable.write_text("#!/bin/sh\nexit 0\n")

    async def main():
        before = fd_count()
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        with pytest.raises(FileNotFoundError):
            await asyncio.create_subprocess_exec(str(tmp_path / "does-not-exist"), **pipes)
        with pytest.raises(PermissionError):
            await asyncio.create_subprocess_exec(str(not_executable), **pipes)
        with pytest.raises(FileNotFoundError):
            await loop.subprocess_exec(asyncio.SubprocessProtocol, "no-such-program-zuvrs")
        with pytest.raises(FileNotFoundError):
            await asyncio.create_subprocess_exec(TRUE, cwd=tmp_path / "no-such-dir")
        await asyncio.sleep(0.01)
        assert fd_count() == before

    run(loop, main())


def test_get_extra_info_subprocess_is_popen(loop):
    async def main():
        proc = await asyncio.create_subprocess_exec("cat", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        transport = proc._transport
        popen = transport.get_extra_info("subprocess")
        assert isinstance(popen, subprocess.Popen)
        assert popen.pid == proc.pid == transport.get_pid()
        assert popen.args == ("cat",)
        assert transport.get_pipe_transport(0).get_extra_info("pipe") is popen.stdin
        assert transport.get_pipe_transport(1).get_extra_info("pipe") is popen.stdout
        assert transport.get_pipe_transport(2) is None
        await proc.communicate(b"")
        assert popen.returncode == 0
        assert transport.get_extra_info("subprocess") is popen

    run(loop, main())


# -- SubprocessTransport and SubprocessProtocol ------------------------------------------------


class SubprocessRecorder(asyncio.SubprocessProtocol):
    def __init__(self):
        loop = asyncio.get_running_loop()
        self.transport = None
        self.events = []
        self.data = {1: bytearray(), 2: bytearray()}
        self.made = loop.create_future()
        self.exited = loop.create_future()
        self.lost = loop.create_future()
        self.returncode_at_exit = None
        self.pipes_at_exit = None

    def connection_made(self, transport):
        self.transport = transport
        self.events.append("made")
        self.made.set_result(transport)

    def pipe_data_received(self, fd, data):
        assert isinstance(data, bytes)
        self.data[fd] += data
        if not (self.events and self.events[-1] == ("data", fd)):
            self.events.append(("data", fd))

    def pipe_connection_lost(self, fd, exc):
        self.events.append(("pipe_lost", fd, exc))

    def process_exited(self):
        self.events.append("exited")
        self.returncode_at_exit = self.transport.get_returncode()
        self.exited.set_result(None)

    def connection_lost(self, exc):
        self.events.append(("lost", exc))
        self.lost.set_result(exc)


def assert_documented_order(events, fds=(0, 1, 2)):
    """What asyncio guarantees: connection_made first, connection_lost last
    and once, each fd's data before its pipe_connection_lost, every pipe
    lost once, process_exited once (anywhere in between)."""
    assert events[0] == "made"
    assert events[-1] == ("lost", None)
    assert events.count("exited") == 1
    assert sum(1 for e in events if e[0] == "lost") == 1
    for fd in fds:
        lost_at = [i for i, e in enumerate(events) if e[0] == "pipe_lost" and e[1] == fd]
        assert len(lost_at) == 1, (fd, events)
        data_at = [i for i, e in enumerate(events) if e == ("data", fd)]
        assert all(i < lost_at[0] for i in data_at), (fd, events)


def test_subprocess_protocol(loop):
    async def main():
        t, p = await loop.subprocess_exec(
            SubprocessRecorder, SH, "-c", "echo out; echo err >&2; read x; echo got:$x; exit 5",
        )
        assert isinstance(t, asyncio.SubprocessTransport)
        assert p.made.done() and p.transport is t
        assert t.get_protocol() is p
        assert t.get_pid() == t.get_extra_info("subprocess").pid
        assert t.get_returncode() is None
        assert not t.is_closing()
        stdin = t.get_pipe_transport(0)
        assert isinstance(stdin, asyncio.WriteTransport)
        assert isinstance(t.get_pipe_transport(1), asyncio.ReadTransport)
        assert isinstance(t.get_pipe_transport(2), asyncio.ReadTransport)
        assert t.get_pipe_transport(3) is None
        stdin.write(b"hi\n")
        stdin.close()
        assert await asyncio.wait_for(p.lost, TIMEOUT) is None
        assert t.get_returncode() == 5
        assert p.returncode_at_exit == 5
        assert bytes(p.data[1]) == b"out\ngot:hi\n"
        assert bytes(p.data[2]) == b"err\n"
        assert_documented_order(p.events)
        assert ("pipe_lost", 0, None) in p.events
        t.close()
        assert t.is_closing()

    run(loop, main())


def test_subprocess_protocol_order_many_times(loop):
    async def main():
        for i in range(20):
            t, p = await loop.subprocess_exec(
                SubprocessRecorder, SH, "-c", f"echo {i}; echo {i} >&2; exit {i}", stdin=None,
            )
            assert t.get_pipe_transport(0) is None
            assert await asyncio.wait_for(p.lost, TIMEOUT) is None
            assert t.get_returncode() == i
            assert bytes(p.data[1]) == bytes(p.data[2]) == b"%d\n" % i
            assert_documented_order(p.events, fds=(1, 2))
            t.close()

    run(loop, main())


def test_subprocess_shell_protocol(loop):
    async def main():
        t, p = await loop.subprocess_shell(
            SubprocessRecorder, "echo $((1 + 1))", stdin=None, stderr=subprocess.DEVNULL
        )
        assert t.get_pipe_transport(2) is None
        assert await asyncio.wait_for(p.lost, TIMEOUT) is None
        assert bytes(p.data[1]) == b"2\n"
        assert_documented_order(p.events, fds=(1,))
        t.close()

    run(loop, main())


@pytest.mark.parametrize(
    "action, expected",
    [
        ("terminate", -signal.SIGTERM),
        ("kill", -signal.SIGKILL),
        ("send_signal", -signal.SIGUSR1),
    ],
)
def test_subprocess_transport_signals(loop, action, expected):
    async def main():
        t, p = await loop.subprocess_exec(SubprocessRecorder, "sleep", "30")
        await asyncio.sleep(0.02)
        assert t.get_returncode() is None
        if action == "send_signal":
            t.send_signal(signal.SIGUSR1)
        else:
            getattr(t, action)()
        assert await asyncio.wait_for(p.lost, TIMEOUT) is None
        assert t.get_returncode() == expected
        assert_documented_order(p.events)
        # The transport is finished: it has no process to signal any more.
        for method in (t.terminate, t.kill, lambda: t.send_signal(signal.SIGTERM)):
            with pytest.raises(ProcessLookupError):
                method()
        t.close()

    run(loop, main())


def test_subprocess_transport_close_kills_child(loop):
    async def main():
        t, p = await loop.subprocess_exec(SubprocessRecorder, "sleep", "30")
        pid = t.get_pid()
        stdout = t.get_pipe_transport(1)
        t.close()
        assert t.is_closing()
        assert stdout.is_closing()
        t.close()  # no-op
        await asyncio.wait_for(p.exited, TIMEOUT)
        assert t.get_returncode() == -signal.SIGKILL
        assert await asyncio.wait_for(p.lost, TIMEOUT) is None
        assert_documented_order(p.events)
        await asyncio.sleep(0.01)
        assert zombie_children([pid]) == []

    run(loop, main())


def test_subprocess_close_after_exit_keeps_returncode(loop):
    async def main():
        t, p = await loop.subprocess_exec(SubprocessRecorder, SH, "-c", "exit 3", stdin=None)
        await asyncio.wait_for(p.lost, TIMEOUT)
        t.close()
        assert t.get_returncode() == 3

    run(loop, main())


def test_subprocess_child_killed_mid_stream_protocol(loop):
    async def main():
        t, p = await loop.subprocess_exec(SubprocessRecorder, "cat", "/dev/zero", stdin=None)
        await wait_until(lambda: len(p.data[1]) >= MiB)
        t.kill()
        assert await asyncio.wait_for(p.lost, TIMEOUT) is None
        assert t.get_returncode() == -signal.SIGKILL
        assert p.data[1].count(0) == len(p.data[1])
        assert_documented_order(p.events, fds=(1, 2))
        t.close()

    run(loop, main())


def test_subprocess_pipe_flow_control_reaches_protocol(loop):
    class Flow(SubprocessRecorder):
        def pause_writing(self):
            self.events.append("pause_writing")

        def resume_writing(self):
            self.events.append("resume_writing")

    async def main():
        # A child that reads nothing for a while: stdin backs up.
        t, p = await loop.subprocess_exec(Flow, SH, "-c", "sleep 0.2; cat >/dev/null")
        stdin = t.get_pipe_transport(0)
        stdin.write(b"x" * (2 * MiB))
        assert "pause_writing" in p.events
        stdin.write_eof()
        assert await asyncio.wait_for(p.lost, TIMEOUT) is None
        assert t.get_returncode() == 0
        flow = [e for e in p.events if e in ("pause_writing", "resume_writing")]
        assert flow == ["pause_writing", "resume_writing"]
        t.close()

    run(loop, main())


# -- resources ---------------------------------------------------------------------------------


def test_1000_spawns_leave_no_fds_or_zombies(loop):
    count = 1000
    pids = []

    async def main():
        # Warm up (thread pools, watchers, a loop's once-only descriptors
        # such as libuv's EMFILE reserve) before counting fds.
        proc = await asyncio.create_subprocess_exec(TRUE, stdout=asyncio.subprocess.PIPE)
        await proc.communicate()
        before = fd_count()
        sem = asyncio.Semaphore(16)

        async def one():
            async with sem:
                proc = await asyncio.create_subprocess_exec(TRUE)
                pids.append(proc.pid)
                return await asyncio.wait_for(proc.wait(), TIMEOUT)

        started = time.monotonic()
        codes = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(count))), 30)
        elapsed = time.monotonic() - started
        assert codes == [0] * count
        await asyncio.sleep(0.05)
        return before, fd_count(), elapsed

    before, after, elapsed = run(loop, main(), 40)
    print(f"{count} spawns of {TRUE} in {elapsed:.2f}s")
    assert after == before
    assert zombie_children(pids) == []
    assert elapsed < 10, f"{count} spawns took {elapsed:.1f}s"


def test_100_spawns_with_pipes_leave_no_fds(loop):
    async def main():
        proc = await sh("cat", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        await proc.communicate(b"warm-up")
        before = fd_count()
        pids = []
        for i in range(100):
            proc = await sh("cat; echo e >&2", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            pids.append(proc.pid)
            out, err = await asyncio.wait_for(proc.communicate(b"%d" % i), TIMEOUT)
            assert (out, err) == (b"%d" % i, b"e\n")
        await asyncio.sleep(0.05)
        assert fd_count() == before
        assert zombie_children(pids) == []

    run(loop, main(), 20)


def test_spawn_from_loop_in_other_thread(loop_factory):
    result = {}

    def thread_main():
        lp = loop_factory()
        try:
            async def main():
                proc = await sh(
                    "read x; echo thread:$x; exit 6", stdin=subprocess.PIPE, stdout=subprocess.PIPE
                )
                out, _ = await asyncio.wait_for(proc.communicate(b"ok\n"), TIMEOUT)
                procs = [await asyncio.create_subprocess_exec(TRUE) for _ in range(10)]
                codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), TIMEOUT)
                return out, proc.returncode, codes

            result["value"] = run(lp, main())
        except BaseException as exc:  # reported by the main thread
            result["error"] = exc
        finally:
            lp.close()

    t = threading.Thread(target=thread_main)
    t.start()
    t.join(20)
    assert not t.is_alive()
    if "error" in result:
        raise result["error"]
    assert result["value"] == (b"thread:ok\n", 6, [0] * 10)


def test_closing_loop_with_running_child_leaves_no_zombie(loop_factory):
    if loop_factory.name == "asyncio" and sys.version_info >= (3, 12) and hasattr(os, "pidfd_open"):
        # asyncio's pidfd child watcher (its default from 3.12) only reaps
        # from the loop: children of a closed loop stay zombies.
        pytest.skip("asyncio's pidfd child watcher leaves a closed loop's children unreaped")
    lp = loop_factory()
    try:
        async def main():
            proc = await asyncio.create_subprocess_exec("sleep", "0.3")
            piped = await sh("sleep 0.3; echo late", stdout=subprocess.PIPE)
            return proc, piped

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            proc, piped = run(lp, main())
    finally:
        lp.close()
    pids = [proc.pid, piped.pid]
    assert all(proc_stat(pid) is not None for pid in pids)  # still running
    deadline = time.monotonic() + 5
    while any(proc_stat(pid) is not None for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert zombie_children(pids) == []
    assert [proc_stat(pid) for pid in pids] == [None, None]  # reaped
    # Clean up the transports left behind by the closed loop.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        # (Polls the reaped Popen: marks it done, kills nothing.)
        proc._transport.close()
        with pytest.raises(RuntimeError, match="closed"):
            piped._transport.close()  # its stdout transport needs the loop
        piped._transport.get_pipe_transport(1).get_extra_info("pipe").close()
        del proc, piped
        gc.collect()


def test_process_exited_before_pipes_close(loop):
    async def main():
        # The child exits at once; a grandchild keeps its stdout open a while.
        t, p = await loop.subprocess_exec(
            SubprocessRecorder, SH, "-c", "(sleep 0.3; echo late) & echo early", stdin=None,
        )
        await asyncio.wait_for(p.exited, TIMEOUT)
        assert t.get_returncode() == 0
        assert not p.lost.done()
        assert ("pipe_lost", 1, None) not in p.events
        assert await asyncio.wait_for(p.lost, TIMEOUT) is None
        assert bytes(p.data[1]) == b"early\nlate\n"
        assert_documented_order(p.events, fds=(1, 2))
        assert p.events.index("exited") < p.events.index(("pipe_lost", 1, None))
        t.close()

    run(loop, main())


def test_child_closes_stdin_with_data_buffered(loop):
    async def main():
        t, p = await loop.subprocess_exec(
            SubprocessRecorder, SH, "-c", "sleep 0.1; exec 0<&-; sleep 0.2", stdout=None, stderr=None,
        )
        stdin = t.get_pipe_transport(0)
        stdin.write(b"x" * (4 * MiB))  # more than the pipe holds (zuvrs widens pipes to 1 MiB)
        assert stdin.get_write_buffer_size() > 0
        assert await asyncio.wait_for(p.lost, TIMEOUT) is None
        lost = [e for e in p.events if e[0] == "pipe_lost"]
        assert len(lost) == 1 and lost[0][1] == 0
        assert isinstance(lost[0][2], BrokenPipeError), lost
        assert t.get_returncode() == 0
        assert_documented_order(p.events, fds=(0,))
        t.close()

    run(loop, main())


def test_cancelled_while_connecting_pipes(loop):
    async def main():
        before = child_pids()
        task = asyncio.ensure_future(
            asyncio.create_subprocess_exec("sleep", "30", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        )
        await asyncio.sleep(0)  # the child is started, the pipes not yet connected
        new = child_pids() - before
        assert len(new) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, TIMEOUT)
        # The child was killed and reaped before the cancellation came through.
        pid = new.pop()
        await asyncio.sleep(0.05)
        assert proc_stat(pid) is None

    run(loop, main())


def test_many_concurrent_children_with_pipes(loop):
    async def main():
        async def one(i):
            data = payload(100 * 1024, seed=i)
            proc = await asyncio.create_subprocess_exec(
                "cat", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            out, err = await proc.communicate(data)
            return out == data and err == b"" and proc.returncode == 0

        results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(50))), 15)
        assert results == [True] * 50

    run(loop, main(), 20)


def test_loop_fds_are_not_inherited(loop, tmp_path):
    async def main():
        # Leave some of the loop's own descriptors open: a child being
        # watched, a pipe transport, a datagram endpoint.
        sleeper = await asyncio.create_subprocess_exec("sleep", "30", stdout=subprocess.PIPE)
        t, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0))
        try:
            inheritable = set()
            for name in os.listdir("/proc/self/fd"):
                try:
                    if os.get_inheritable(int(name)):
                        inheritable.add(int(name))
                except OSError:
                    pass  # the listing's own descriptor
            out = await output_of(SH, "-c", "ls /proc/$$/fd", close_fds=False)
            child_fds = {int(n) for n in out.split()}
            assert child_fds == inheritable | {0, 1, 2}
        finally:
            t.close()
            sleeper.kill()
            await asyncio.wait_for(sleeper.wait(), TIMEOUT)

    run(loop, main())


def test_path_like_program_and_bytes_arguments(loop, tmp_path):
    import pathlib

    async def main():
        out = await output_of(pathlib.Path(SH), b"-c", b"echo bytes $0", "zero")
        assert out == b"bytes zero\n"

    run(loop, main())


@pytest.fixture
def no_pidfd(monkeypatch):
    """Run without os.pidfd_open: both loops fall back to other means."""
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    # 3.12-3.13: asyncio's policy keeps the child watcher it made first (a
    # PidfdChildWatcher where pidfds work); let it choose again. (3.14 picks
    # a watcher per loop when the loop is made, hence no_pidfd before loop.)
    policy = asyncio.events._event_loop_policy
    if getattr(policy, "_watcher", None) is not None:
        monkeypatch.setattr(policy, "_watcher", None)


def test_without_pidfd(no_pidfd, loop):
    async def main():
        proc = await sh("read x; echo $x; exit 4", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert await asyncio.wait_for(proc.communicate(b"no pidfd\n"), TIMEOUT) == (b"no pidfd\n", None)
        assert proc.returncode == 4
        proc = await asyncio.create_subprocess_exec("sleep", "30")
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), TIMEOUT) == -signal.SIGTERM
        before = fd_count()
        pids = []
        for _ in range(50):
            proc = await asyncio.create_subprocess_exec(TRUE)
            pids.append(proc.pid)
            assert await asyncio.wait_for(proc.wait(), TIMEOUT) == 0
        await asyncio.sleep(0.05)
        assert fd_count() == before
        assert zombie_children(pids) == []

    run(loop, main(), 15)


def test_without_pidfd_closing_loop_with_running_child(loop_factory, no_pidfd):
    lp = loop_factory()
    try:
        proc = run(lp, asyncio.create_subprocess_exec("sleep", "0.2"))
    finally:
        lp.close()
    deadline = time.monotonic() + 5
    while proc_stat(proc.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert zombie_children([proc.pid]) == []
    assert proc_stat(proc.pid) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        proc._transport.close()
        del proc
        gc.collect()


def test_child_exits_while_loop_is_not_running(loop):
    proc = run(loop, sh("sleep 0.1; exit 8"))
    # The loop is stopped while the child exits (it may be reaped by a
    # watcher thread meanwhile, or wait as a zombie for the loop).
    deadline = time.monotonic() + 5
    while (proc_stat(proc.pid) or ("Z",))[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (proc_stat(proc.pid) or ("Z",))[0] == "Z"
    assert proc.returncode is None
    assert run(loop, asyncio.wait_for(proc.wait(), TIMEOUT)) == 8
    assert zombie_children([proc.pid]) == []


def test_pipesize(loop):
    import fcntl

    async def main():
        proc = await asyncio.create_subprocess_exec(
            "cat", stdin=subprocess.PIPE, stdout=subprocess.PIPE, pipesize=1024 * 1024
        )
        t = proc._transport
        for fd in (0, 1):
            pipe = t.get_pipe_transport(fd).get_extra_info("pipe")
            assert fcntl.fcntl(pipe.fileno(), fcntl.F_GETPIPE_SZ) == 1024 * 1024
        data = payload(3 * MiB, seed=3)
        out, _ = await asyncio.wait_for(proc.communicate(data), 15)
        assert out == data

    run(loop, main(), 20)


def test_fast_child_output_stays_bounded_in_memory(loop):
    """A child writing faster than the reader consumes: the stream reader
    pauses its pipe, and what it buffers stays near its limit (reads are not
    piled up ahead of the protocol's pause)."""
    total = 32 * MiB
    child = (
        "import os\n"
        "c = b'z' * (256 * 1024)\n"
        f"for _ in range({total} // len(c)):\n"
        "    v = memoryview(c)\n"
        "    while v:\n"
        "        v = v[os.write(1, v):]\n"
    )

    async def main():
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", "-c", child, stdout=asyncio.subprocess.PIPE)
        received = most = 0
        while True:
            most = max(most, len(proc.stdout._buffer))
            chunk = await proc.stdout.read(64 * 1024)
            if not chunk:
                break
            received += len(chunk)
            await asyncio.sleep(0)
        assert await proc.wait() == 0
        return received, most

    received, most = run(loop, main(), 60)
    assert received == total
    assert most <= 1 * MiB, most
