"""Child processes: subprocess_exec / subprocess_shell.

Processes are started with ``subprocess.Popen`` (so every Popen option works,
preexec_fn included) under asyncio's own subprocess transport; their pipes
are real pipes served by zuvrs's pipe transports. Exits are noticed through
a pidfd watched by the loop (a blocking ``waitpid`` thread where pidfds are
not available), and every child is reaped, also when the loop closes first.
"""

import fcntl
import os
import subprocess
import threading
from asyncio import base_subprocess
from asyncio.log import logger

__all__ = ("SubprocessTransport", "ChildReaper")


class SubprocessTransport(base_subprocess.BaseSubprocessTransport):
    def _start(self, args, shell, stdin, stdout, stderr, bufsize, **kwargs):
        self._proc = subprocess.Popen(
            args, shell=shell, stdin=stdin, stdout=stdout, stderr=stderr,
            universal_newlines=False, bufsize=bufsize, **kwargs,
        )
        if kwargs.get("pipesize", -1) <= 0:
            _widen_pipes(self._proc)


# A child's bulk output then arrives in reads of up to the loop's read size
# instead of the kernel's default 64 KiB pipe (a quarter of the system calls
# and wake-ups). 1 MiB is Linux's default limit for unprivileged processes.
_PIPE_SIZE = 1024 * 1024


def _widen_pipes(proc):
    """Grow the pipes Popen made (the caller did not choose a pipesize)."""
    if not hasattr(fcntl, "F_SETPIPE_SZ"):
        return
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            try:
                fcntl.fcntl(f.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
            except OSError:
                pass  # over the user's pipe quota, or a lower limit: keep it


def _exit_code(pid):
    """Reap `pid` (which has exited) and return its returncode."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        # Reaped by someone else: the status is lost, as in asyncio.
        logger.warning("child process pid %d was already reaped; reporting returncode 255", pid)
        return 255
    return os.waitstatus_to_exitcode(status)


def _reap_in_background(pid):
    threading.Thread(target=_exit_code, args=(pid,), name=f"zuvrs-reap-{pid}", daemon=True).start()


class ChildReaper:
    """Watches a loop's children and reports their exit codes."""

    def __init__(self, loop):
        self._loop = loop
        self._children = {}  # pid -> (pidfd or None, callback)

    def watch(self, pid, callback):
        """Call callback(returncode) on the loop when child `pid` exits."""
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        self._children[pid] = (pidfd, callback)
        if pidfd is not None:
            self._loop._set_fd_handler(pidfd, False, self._on_pidfd, (pid,))
        else:
            threading.Thread(target=self._wait_blocking, args=(pid,), name=f"zuvrs-wait-{pid}", daemon=True).start()

    def _on_pidfd(self, pid):
        entry = self._children.pop(pid, None)
        if entry is None:
            return
        pidfd, callback = entry
        self._loop._clear_fd_handler(pidfd, False)
        os.close(pidfd)
        callback(_exit_code(pid))

    def _wait_blocking(self, pid):
        code = _exit_code(pid)
        loop = self._loop
        if loop is None:
            return  # the loop is closed: the child is reaped, nobody to tell
        try:
            loop.call_soon_threadsafe(self._on_thread_exit, pid, code)
        except RuntimeError:
            pass  # the loop is closed: the child is reaped, nobody to tell

    def _on_thread_exit(self, pid, code):
        entry = self._children.pop(pid, None)
        if entry is not None:
            entry[1](code)

    def close(self):
        """The loop is closing: reap the children still running in threads."""
        children, self._children = self._children, {}
        for pid, (pidfd, _callback) in children.items():
            if pidfd is not None:
                self._loop._clear_fd_handler(pidfd, False)
                os.close(pidfd)
                _reap_in_background(pid)
            # Children watched by a thread are reaped by that thread.
        # Let go of the loop, so that a closed loop is freed as soon as its
        # last reference goes (as asyncio's), not by the cyclic GC.
        self._loop = None


