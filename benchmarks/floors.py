"""What the kernel allows: process workloads measured with no event loop.

    python3 benchmarks/floors.py                       # spawn and pipe output, 5 samples
    python3 benchmarks/floors.py --workloads spawn --samples 7 --loops uvloop,zuvrs

For ``subprocess_spawn`` and ``subprocess_pipe_output`` (benchmarks/workloads.py)
this runs the same work with plain blocking system calls, in fresh processes
interleaved with samples of the loops, and prints per contender the median,
min and max time, and the ratio a loop could reach against uvloop if it cost
nothing at all (uvloop's median / the floor's median). A speed target above
that ceiling cannot be met on this machine by any loop.

Floors (each sample is a fresh process, as for the loops):

* ``spawn/posix_spawn``: ``os.posix_spawn('/bin/true')`` + ``os.waitpid``,
  sequential: the kernel's spawn-and-exit cost plus a thin Python call.
* ``spawn/Popen``: ``subprocess.Popen(['/bin/true']).wait()``.
* ``pipe_output/pipe``: the workload's child writes the same bytes to a real
  pipe (1 MiB, as zuvrs widens it) that is read with blocking
  ``os.read(fd, 256 KiB)`` until EOF, child start included as in the workload.
* ``pipe_output/pipe_default``: the same with the pipe at the kernel's
  default size (64 KiB on Linux).
* ``pipe_output/socketpair``: the same through a Unix socketpair (what uvloop
  gives a child; the spec asks for real pipes).
* ``tls_bulk/memory_bios``: the TLS part of ``tls_bulk`` alone, in one
  thread as the loops run it: a client and a server ``ssl.SSLObject`` (the
  workload's contexts, TLS 1.3, verified) joined by memory BIOs, the
  handshake, then the same 512 MiB written in the same 251 KiB chunks and
  read by the server, then close_notify. No sockets, no loop: encryption
  and decryption of every byte, which the loop's run adds to the plain
  transfer.
* ``tls_bulk/tcp``: the same, with the ciphertext carried over a loopback
  TCP connection by plain non-blocking ``send`` / ``recv_into`` calls (256
  KiB reads, as the loops read), still in one thread: crypto plus the
  kernel's transfer, what any loop must do at least.
* ``bulk_flow/tcp_chunk`` and ``bulk_flow/tcp_fill``: ``tcp_bulk_flow``
  with no loop: the same 512 MiB, the same 256 KiB chunk object, written by
  non-blocking ``send`` on one end of a loopback TCP connection (TCP_NODELAY
  on both, as every loop sets it) and read by ``recv_into`` a 256 KiB
  buffer on the other, in one thread, each piece sampled at three bytes as
  the workload's receiving Protocol samples it. ``tcp_chunk`` reads after
  every chunk; ``tcp_fill`` sends until the socket says EAGAIN and then
  reads until it says EAGAIN, which is what the workload's writer (it
  writes until pause_writing) makes of a loop that writes straight to its
  socket. The kernel's cost differs by 3-4x between the two on this
  machine: the fill leaves megabytes in flight, more than a core's L2
  cache, so both copies of every byte miss it.
* ``tls_echo/memory_bios``: the TLS part of ``tls_echo_streams``: 20,000
  round trips of 1 KiB (client writes, server reads and writes back, client
  reads) between the same two SSLObjects.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare  # noqa: E402
import workloads  # noqa: E402

MARKER = compare.MARKER

#: workload -> (loop workload name, size, floor variants)
WORKLOADS = {
    "spawn": ("subprocess_spawn", 500, ("posix_spawn", "Popen")),
    "pipe_output": ("subprocess_pipe_output", 256, ("pipe", "pipe_default", "socketpair")),
    "tls_bulk": ("tls_bulk", 512, ("memory_bios", "tcp")),
    "tls_echo": ("tls_echo_streams", 20_000, ("memory_bios",)),
    "bulk_flow": ("tcp_bulk_flow", 512, ("tcp_chunk", "tcp_fill")),
}


def floor_spawn(variant: str, n: int) -> float:
    path = workloads.TRUE_PATH
    t0 = time.perf_counter()
    if variant == "posix_spawn":
        env = os.environ
        for _ in range(n):
            pid = os.posix_spawn(path, [path], env)
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise RuntimeError("child failed")
    else:
        for _ in range(n):
            if subprocess.Popen([path]).wait() != 0:
                raise RuntimeError("child failed")
    return time.perf_counter() - t0


def floor_pipe_output(variant: str, mib: int) -> float:
    total = mib * workloads.MIB
    t0 = time.perf_counter()
    if variant in ("pipe", "pipe_default"):
        rfd, wfd = os.pipe()
        if variant == "pipe" and hasattr(fcntl, "F_SETPIPE_SZ"):
            fcntl.fcntl(rfd, fcntl.F_SETPIPE_SZ, 1024 * 1024)
    else:
        a, b = socket.socketpair()
        rfd, wfd = a.detach(), b.detach()
    child = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", workloads.PIPE_OUTPUT_CHILD, str(total)],
        stdout=wfd)
    os.close(wfd)
    got = 0
    size = workloads.PIPE_OUTPUT_READ
    while True:
        data = os.read(rfd, size)
        if not data:
            break
        got += len(data)
    os.close(rfd)
    if child.wait() != 0 or got != total:
        raise RuntimeError(f"child failed or short read ({got} of {total})")
    return time.perf_counter() - t0


def _tls_pair(contexts: Any) -> Any:
    """A handshaken client and server SSLObject over memory BIOs, a
    function that moves what each has written to the other, and the client's
    outgoing and the server's incoming BIO."""
    import ssl

    server_ctx, client_ctx = contexts
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=workloads.TLS_HOSTNAME)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)

    def shuttle() -> None:
        if c_out.pending:
            s_in.write(c_out.read())
        if s_out.pending:
            c_in.write(s_out.read())

    for _ in range(10):
        done = 0
        for side in (client, server):
            try:
                side.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
        shuttle()
        if done == 2:
            break
    else:
        raise RuntimeError("TLS handshake did not finish")
    return client, server, shuttle, (c_out, s_in)


def _read_all(side: Any, want: int) -> int:
    import ssl

    got = 0
    while got < want:
        try:
            got += len(side.read(workloads.BULK_CHUNK))
        except ssl.SSLWantReadError:
            break
    return got


#: Linux's TCP_CONGESTION (the socket module names it from 3.6 on Linux).
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)


def host_congestion_control() -> str:
    """The TCP congestion control new connections get on this machine."""
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def set_congestion_control(sock: Any, name: str) -> None:
    """Gives `sock` the congestion control `name` (TCP_CONGESTION; any of
    net.ipv4.tcp_allowed_congestion_control, no privilege needed). Set it
    before connecting (on a listener, for the sockets it accepts): a
    connection that started on bbr keeps pacing after a switch."""
    sock.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, name.encode())


def _tcp_pair(nodelay: bool = False, rcvbuf: int = 0, cc: str = "") -> Any:
    """A connected, non-blocking loopback TCP pair (TCP_NODELAY on both
    ends if asked; the second end's SO_RCVBUF pinned if `rcvbuf`; both on
    congestion control `cc` from the start if given)."""
    listener = socket.create_server((workloads.HOST, 0))
    a = socket.socket()
    if cc:
        for s in (listener, a):
            set_congestion_control(s, cc)
    a.connect(listener.getsockname())
    b, _ = listener.accept()
    listener.close()
    for s in (a, b):
        s.setblocking(False)
        if nodelay:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if rcvbuf:
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    return a, b


def _tcp_carrier() -> Any:
    """A connected loopback TCP pair (non-blocking) and a function that
    moves bytes from one end to the other, reading 256 KiB at a time."""
    a, b = _tcp_pair()
    buf = bytearray(workloads.PIPE_OUTPUT_READ)
    view = memoryview(buf)

    def carry(data: bytes, deliver: Any) -> None:
        out = memoryview(data)
        while out:
            try:
                out = out[a.send(out):]
            except BlockingIOError:
                pass
            while True:
                try:
                    n = b.recv_into(view)
                except BlockingIOError:
                    break
                deliver(view[:n])
        while True:  # what is still in flight
            try:
                n = b.recv_into(view)
            except BlockingIOError:
                break
            deliver(view[:n])

    return carry, (a, b)


def floor_tls_bulk(variant: str, mib: int) -> float:
    total = mib * workloads.MIB
    chunk = bytes(range(workloads.BULK_PERIOD)) * 1024
    contexts = workloads.tls_contexts()  # made before the loops' timing starts too
    t0 = time.perf_counter()
    client, server, shuttle, (c_out, s_in) = _tls_pair(contexts)
    carry = socks = None
    if variant == "tcp":
        carry, socks = _tcp_carrier()
    sent = got = 0
    while sent < total:
        piece = chunk if total - sent >= len(chunk) else chunk[:total - sent]
        client.write(piece)
        sent += len(piece)
        if carry is None:
            shuttle()
        else:
            carry(c_out.read(), s_in.write)
        got += _read_all(server, total - got)
    if got != total:
        raise RuntimeError(f"short read ({got} of {total})")
    try:
        client.unwrap()
    except Exception:  # the peer's close_notify is not needed to count
        pass
    shuttle()
    elapsed = time.perf_counter() - t0
    for sock in socks or ():
        sock.close()
    return elapsed


def floor_tls_echo(variant: str, n: int) -> float:
    payload = bytes(range(256)) * 4  # 1 KiB
    contexts = workloads.tls_contexts()
    t0 = time.perf_counter()
    client, server, shuttle, _ = _tls_pair(contexts)
    for _ in range(n):
        client.write(payload)
        shuttle()
        data = server.read(65536)
        server.write(data)
        shuttle()
        if len(client.read(65536)) != len(payload):
            raise RuntimeError("short echo")
    return time.perf_counter() - t0


def floor_bulk_flow(variant: str, mib: int, rcvbuf: int = 0, cc: str = "") -> float:
    total = mib * workloads.MIB
    c = workloads.FLOW_CHUNK
    period = workloads.BULK_PERIOD
    chunk = memoryview(bytes(i % period for i in range(c)))
    t0 = time.perf_counter()
    a, b = _tcp_pair(nodelay=True, rcvbuf=rcvbuf, cc=cc)
    view = memoryview(bytearray(workloads.PIPE_OUTPUT_READ))
    sent = got = mismatches = 0
    out = chunk[:0]
    while got < total:
        chunks = 0
        while (out or sent < total) and (variant == "tcp_fill" or chunks < 1):
            if not out:
                out = chunk if total - sent >= c else chunk[:total - sent]
                sent += len(out)
                chunks += 1
            try:
                out = out[a.send(out):]
            except BlockingIOError:
                break
        while True:
            try:
                n = b.recv_into(view)
            except BlockingIOError:
                break
            m = n >> 1  # FlowBulkReceiverProtocol's check
            if (view[0] != (got % c) % period or view[m] != ((got + m) % c) % period
                    or view[n - 1] != ((got + n - 1) % c) % period):
                mismatches += 1
            got += n
    a.close()
    b.close()
    elapsed = time.perf_counter() - t0
    if got != total or mismatches:
        raise RuntimeError(f"received {got} of {total}, {mismatches} mismatches")
    return elapsed


FLOORS = {"spawn": floor_spawn, "bulk_flow": floor_bulk_flow, "pipe_output": floor_pipe_output,
          "tls_bulk": floor_tls_bulk, "tls_echo": floor_tls_echo}


def run_floor(workload: str, variant: str, size: int) -> Dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--floor", workload,
           "--variant", variant, "--size", str(size)]
    r = compare._run_child(cmd, 600)
    data = r["json"] or {}
    if not data.get("ok"):
        return {"ok": False, "error": r["stderr_tail"][-300:] or "failed"}
    return data


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="spawn,pipe_output")
    ap.add_argument("--loops", default="uvloop,zuvrs")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--floor", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.floor:  # one floor sample, in this fresh process
        elapsed = FLOORS[args.floor](args.variant, args.size)
        print(MARKER + json.dumps({"ok": True, "elapsed": elapsed}))
        return 0

    loops = compare._csv(args.loops)
    print(f"# floors: {time.strftime('%Y-%m-%d %H:%M:%S')}, python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cores, commit {compare.repo_info()['commit'][:12]}")
    for name in compare._csv(args.workloads):
        workload, size, variants = WORKLOADS[name]
        contenders = [("floor", v) for v in variants] + [("loop", l) for l in loops]
        times: Dict[str, List[float]] = {f"{k}:{v}": [] for k, v in contenders}
        errors: Dict[str, str] = {}
        for rnd in range(args.samples):
            k = rnd % len(contenders)
            for kind, what in contenders[k:] + contenders[:k]:  # rotate the order
                if kind == "floor":
                    s = run_floor(name, what, size)
                else:
                    s = compare.run_sample(sys.executable, what, workload, size,
                                           600, None, False)
                key = f"{kind}:{what}"
                if s.get("ok"):
                    times[key].append(s["elapsed"])
                else:
                    errors[key] = s.get("error", "failed")
        print(f"\n## {name} ({workload}, size {size}, {args.samples} samples)\n")
        print("| contender | median s | min | max | uvloop / this |")
        print("|---|---:|---:|---:|---:|")
        uv = times.get("loop:uvloop")
        uv_med = statistics.median(uv) if uv else None
        for key, ts in times.items():
            if not ts:
                print(f"| {key} | {errors.get(key, 'no samples')} | | | |")
                continue
            med = statistics.median(ts)
            r = f"{uv_med / med:.2f}x" if uv_med else "n/a"
            print(f"| {key} | {med:.4f} | {min(ts):.4f} | {max(ts):.4f} | {r} |")
        print("\nFor a floor row, `uvloop / this` is the highest zuvrs/uvloop ratio "
              "any loop could reach on this machine.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
