"""The load generator of ``readline_echo_load`` (workloads.py), run in its
own process, the same for every loop under test.

    python3 benchmarks/_loadgen.py --port P [--connections 100] [--lines 1000] [--cpu 1]
    python3 benchmarks/_loadgen.py --capacity [--connections 100] [--lines 1000]
    python3 benchmarks/_loadgen.py --python ...     # the plain-Python client

Client mode: opens ``--connections`` TCP connections to 127.0.0.1:P and on
each sends ``--lines`` lines one at a time (ping-pong: a line, then wait for
its whole echo, then the next). Every echo is compared with the line sent
and CRC-32 checksummed. The client is ``_loadgen.c`` (built on first use
with the system's C compiler into a cache directory, see ``build()``): no
event loop, non-blocking sockets on one epoll, one ``recv`` and one
``send`` per line, so that it costs every loop under test the same and
as little as it can. Without a C compiler the same client in plain Python
(``run_client``) is used, and the result says so (``client``). The clock
runs from before the first connect to the last echo; the client's CPU time
(user + system) over the same window is reported as its share of its core:
a share near 1.0 would mean the client was the limit. At the end it closes
every connection (the server must see each EOF). Prints one MARKER line of
JSON.

``--capacity``: the client against a minimal echo server in C (the same
file: one ``recv`` and one ``send`` per read, no event loop, no streams) in
a second process on another CPU: what the client can drive, to compare with
the loops' figures.

Lines: 64 distinct lines of 16 to 142 bytes (no newline but the last byte);
connection c sends lines (7 c + t) % 64 for t = 0, 1, ...
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import resource
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
C_SOURCE = os.path.join(HERE, "_loadgen.c")

MARKER = "@@ZUVRS-LOADGEN@@ "
HOST = "127.0.0.1"
N_LINES = 64


def lines() -> List[bytes]:
    """The 64 lines: line k is 16 + 2 k bytes, its last byte the only
    newline."""
    out = []
    for k in range(N_LINES):
        size = 16 + 2 * k
        body = bytes(97 + (k * 5 + j * 3) % 26 for j in range(size - 1))
        out.append(body + b"\n")
    return out


def line_index(c: int, t: int) -> int:
    return (7 * c + t) % N_LINES


def expected(connections: int, per_conn: int) -> Dict[str, int]:
    """The sum over connections of each connection's CRC-32 of its echoes,
    and the bytes echoed in all."""
    ls = lines()
    crc_sum = 0
    nbytes = 0
    for c in range(connections):
        crc = 0
        for t in range(per_conn):
            b = ls[line_index(c, t)]
            crc = zlib.crc32(b, crc)
            nbytes += len(b)
        crc_sum += crc
    return {"checksum": crc_sum, "bytes": nbytes}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pin(cpu: Optional[str]) -> Optional[List[int]]:
    if cpu:
        try:
            os.sched_setaffinity(0, {int(x) for x in cpu.split(",")})
        except OSError:
            pass
    try:
        return sorted(os.sched_getaffinity(0))
    except OSError:
        return None


def run_client(port: int, connections: int, per_conn: int,
               timeout: float = 60.0) -> Dict[str, Any]:
    ls = lines()
    ep = select.epoll()
    t0 = time.perf_counter()
    cpu0 = _cpu()
    socks: Dict[int, socket.socket] = {}
    conn_of: Dict[int, int] = {}
    sent_at: Dict[int, int] = {}       # fd -> t (the line in flight)
    bufs: Dict[int, bytes] = {}
    crcs: Dict[int, int] = {}
    matches = 0
    overruns = 0
    eofs = 0
    received = 0
    errors: List[str] = []
    for c in range(connections):
        s = socket.create_connection((HOST, port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        fd = s.fileno()
        socks[fd] = s
        conn_of[fd] = c
        sent_at[fd] = 0
        bufs[fd] = b""
        crcs[fd] = 0
        ep.register(fd, select.EPOLLIN)
    t_connected = time.perf_counter()
    for fd, s in socks.items():
        s.send(ls[line_index(conn_of[fd], 0)])
    active = len(socks) if per_conn > 0 else 0
    deadline = time.monotonic() + timeout
    crc32 = zlib.crc32
    poll = ep.poll
    while active:
        events = poll(1.0)
        if not events and time.monotonic() > deadline:
            errors.append(f"timeout: {active} connections unfinished")
            break
        for fd, _ in events:
            s = socks[fd]
            try:
                data = s.recv(65536)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    continue
                errors.append(f"recv: {exc!r}")
                ep.unregister(fd)
                active -= 1
                continue
            if not data:
                eofs += 1
                errors.append(f"connection {conn_of[fd]}: EOF at line {sent_at[fd]}")
                ep.unregister(fd)
                active -= 1
                continue
            t = sent_at[fd]
            c = conn_of[fd]
            line = ls[(7 * c + t) % N_LINES]
            buf = bufs[fd] + data if bufs[fd] else data
            need = len(line)
            if len(buf) < need:
                bufs[fd] = buf
                continue
            if len(buf) > need:
                overruns += 1
                buf = buf[:need]
            bufs[fd] = b""
            if buf == line:
                matches += 1
            crcs[fd] = crc32(buf, crcs[fd])
            received += 1
            t += 1
            sent_at[fd] = t
            if t < per_conn:
                s.send(ls[(7 * c + t) % N_LINES])
            else:
                ep.unregister(fd)
                active -= 1
    t_end = time.perf_counter()
    cpu = _cpu() - cpu0
    for s in socks.values():
        s.close()
    ep.close()
    elapsed = t_end - t0
    return {
        "lines": received, "matches": matches, "overruns": overruns,
        "checksum": sum(crcs.values()), "eofs": eofs,
        "completed_connections": sum(1 for fd in socks if sent_at[fd] == per_conn),
        "elapsed": elapsed, "connect_s": t_connected - t0,
        "cpu_s": cpu, "cpu_share": cpu / elapsed if elapsed > 0 else None,
        "errors": errors[:5],
    }


def build() -> Optional[str]:
    """The path of the C client built from _loadgen.c (cached by the
    source's hash in the temp directory), or None without a C compiler."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        return None
    with open(C_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"zuvrs-bench-loadgen-{digest}")
    if os.access(path, os.X_OK):
        return path
    tmp = f"{path}.{os.getpid()}"
    r = subprocess.run([cc, "-O2", "-o", tmp, C_SOURCE], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(f"_loadgen: building {C_SOURCE} failed:\n{r.stderr[-2000:]}\n")
        return None
    os.replace(tmp, path)  # atomic: concurrent samples may build it too
    return path


def run_c_client(binary: str, port: int, connections: int, per_conn: int,
                 timeout: float) -> Dict[str, Any]:
    r = subprocess.run([binary, "client", str(port), str(connections),
                        str(per_conn), str(timeout)],
                       capture_output=True, text=True, timeout=timeout + 30)
    try:
        res = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"errors": [f"C client: exit {r.returncode}, {r.stderr[-300:]!r}"]}
    res["client"] = "C (_loadgen.c)"
    return res


def capacity(connections: int, per_conn: int, server_cpu: Optional[str],
             client_cpu: Optional[str], python_client: bool) -> Dict[str, Any]:
    binary = build()
    if binary is None:
        raise SystemExit("--capacity needs a C compiler (cc) for its echo server")
    cmd = [binary, "server", str(connections)]
    if server_cpu and shutil.which("taskset"):
        cmd = ["taskset", "-c", server_cpu] + cmd
    srv = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        port = int((srv.stdout.readline() if srv.stdout else "port 0").split()[1])
        affinity = pin(client_cpu)
        if python_client:
            res = run_client(port, connections, per_conn)
            res["client"] = "plain Python (_loadgen.run_client)"
        else:
            res = run_c_client(binary, port, connections, per_conn, 60.0)
    finally:
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
    res["affinity"] = affinity
    res["server"] = "C echo server (_loadgen.c), one recv + one send per read"
    res["expected"] = expected(connections, per_conn)
    res["lines_per_s"] = res["lines"] / res["elapsed"]
    return res


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int)
    ap.add_argument("--connections", type=int, default=100)
    ap.add_argument("--lines", type=int, default=1000, help="lines per connection")
    ap.add_argument("--cpu", help="pin the client to these CPUs, e.g. 1")
    ap.add_argument("--server-cpu", default="0", help="--capacity: the server's CPU")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--python", action="store_true",
                    help="use the plain-Python client instead of the C one")
    ap.add_argument("--capacity", action="store_true",
                    help="measure the client against the C echo server")
    a = ap.parse_args(argv)
    if a.capacity:
        res = capacity(a.connections, a.lines, a.server_cpu, a.cpu or "1", a.python)
        exp = res["expected"]
        ok = (res["lines"] == res["matches"] == a.connections * a.lines
              and res["checksum"] == exp["checksum"])
        print(f"capacity ({res['client']} client, {res['server']}): "
              f"{res['lines_per_s']:,.0f} lines/s ({res['lines']:,} lines in "
              f"{res['elapsed']:.3f} s, client CPU share {res['cpu_share']:.2f}, "
              f"echoes {'all verified' if ok else 'WRONG'})")
        print(MARKER + json.dumps(res))
        return 0 if ok else 3
    if a.port is None:
        ap.error("--port (or --capacity) is required")
    affinity = pin(a.cpu)
    binary = None if a.python else build()
    try:
        if binary is not None:
            res = run_c_client(binary, a.port, a.connections, a.lines, a.timeout)
        else:
            res = run_client(a.port, a.connections, a.lines, a.timeout)
            res["client"] = "plain Python (_loadgen.run_client)" + (
                "" if a.python else ": no C compiler")
    except Exception as exc:
        res = {"errors": [f"{type(exc).__name__}: {exc}"[:300]]}
    res["affinity"] = affinity
    sys.stdout.write(MARKER + json.dumps(res) + "\n")
    sys.stdout.flush()
    return 0


def spawn(port: int, connections: int, per_conn: int, cpu: Optional[str],
          timeout: float = 60.0) -> "subprocess.Popen[bytes]":
    """Start the client process for workloads.readline_echo_load: the C
    client itself (no Python start-up), or this file's Python client where
    there is no C compiler; pinned to ``cpu``. parse() reads its output."""
    binary = build()
    if binary is not None:
        cmd = [binary, "client", str(port), str(connections), str(per_conn), str(timeout)]
    else:
        cmd = [sys.executable, "-I", os.path.abspath(__file__), "--python",
               "--port", str(port), "--connections", str(connections),
               "--lines", str(per_conn), "--timeout", str(timeout)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    if cpu:
        try:  # before it has connected: exec and start-up take longer
            os.sched_setaffinity(proc.pid, {int(x) for x in cpu.split(",")})
        except OSError:
            pass
    return proc


def parse(out: bytes) -> Optional[Dict[str, Any]]:
    """The client's result: the C client's JSON line or the Python one's
    MARKER line; None if there is neither."""
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        try:
            if line.startswith(MARKER):
                res = json.loads(line[len(MARKER):])
            elif line.startswith("{"):
                res = json.loads(line)
                res["client"] = "C (_loadgen.c)"
            else:
                continue
        except ValueError:
            return None
        return res if isinstance(res, dict) else None
    return None


if __name__ == "__main__":
    sys.exit(main())
