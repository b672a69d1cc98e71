#!/usr/bin/env python3
"""Compare event loops on the scheduling, network, datagram, pipe and
process workloads, one fresh process per sample.

Usage (from the repository root)::

    python3 benchmarks/compare.py                 # all loops, all workloads, 5 samples
    python3 benchmarks/compare.py --quick         # 3 samples, half sizes (minutes; see below)
    python3 benchmarks/compare.py --loops uvloop,zuvrs --workloads call_soon,timers_fire
    python3 benchmarks/compare.py --samples 9 --json run.json --markdown run.md
    python3 benchmarks/compare.py --size call_soon=200000 --timeout 60
    python3 benchmarks/compare.py --quick --workloads tcp_echo_streams,tcp_echo_protocol,tcp_bulk,\
        unix_echo_streams,short_connections,getaddrinfo_numeric,split_writes_one,split_writes_two
    python3 benchmarks/compare.py --quick --workloads udp_echo,unix_dgram_echo,subprocess_spawn,\
        subprocess_pipe_output,pipe_roundtrip
    python3 benchmarks/compare.py --workloads tcp_echo_streams,tls_echo_streams,tcp_bulk,tls_bulk,\
        tls_handshakes,http_keepalive,tls_http_keepalive,websocket,tls_websocket,tcp_bulk_flow
    python3 benchmarks/compare.py --quick --loops uvloop,rloop,rsloop,zuvrs,zuvrs-streams \
        --workloads readline_echo_load,redis_get_set,redis_pipeline,idle_connections

A before/after comparison of a change: build the other commit's wheel,
unzip it into a directory and name it in ZUVRS_BASE; the loop
``zuvrs-base`` is that build, and ``zuvrs-base-streams`` that build with its
native streams installed (they take part only when named)::

    git worktree add /tmp/base <commit> && (cd /tmp/base && maturin build --release -o /tmp/base-wheel)
    unzip -q /tmp/base-wheel/*.whl -d /tmp/base-pkg
    ZUVRS_BASE=/tmp/base-pkg python3 benchmarks/compare.py --loops uvloop,zuvrs-base,zuvrs

Loops (``workloads.LOOP_NAMES``): asyncio (the control), uvloop, rloop,
rsloop, zuvrs, and zuvrs-streams: zuvrs with ``zuvrs.streams.install()`` in
force, so that asyncio.open_connection, start_server, open_unix_connection
and start_unix_server give zuvrs's native streams (the zuvrs column has
asyncio's). rsloop runs as it ships: importing it replaces
asyncio.open_connection and start_server (not the Unix ones) with its own
fast streams on rsloop loops. Every stream workload records the
StreamReader class each side got, and a sample whose class is not the one
its loop claims (``workloads.STREAM_READERS``) fails its parity
(``streams_as_claimed``); the classes are listed per loop in the details.

What it does:

* Each loop is first probed in its own process: a loop whose package is not
  installed, or does not import, is reported as such and skipped.
* For every workload: one warm-up process per loop (not counted), then
  ``--samples`` rounds; each round runs every loop once, in an order rotated
  from round to round, each sample in a fresh ``benchmarks/_sample.py``
  process with the default GC settings.
* A sample counts only if its parity (callbacks counted, checksums, timer
  order, bytes and datagrams echoed and checksummed, responses verified,
  closes seen, child return codes) equals the expected value. Timeouts
  (the process group is killed), crashes, exceptions, parity mismatches and
  "unsupported" (a loop lacking what the workload needs, e.g. rloop and
  Unix sockets) are recorded and shown in the table cell of that loop;
  nothing is retried.
* Output: a summary table (median ops/s per loop; ratios from medians:
  zuvrs over uvloop, asyncio, rloop and rsloop, zuvrs-streams over uvloop,
  zuvrs and rsloop, for the loops in the run), the ratios over uvloop with
  their spread (min / max .. max / min of the two cells' samples), and per
  workload the median, min, max and CV of the throughput, the median time,
  the median peak RSS (ru_maxrss of the sample process, and its growth over
  the RSS before the workload), and the errors; then a provenance block
  (Python build, package versions, zuvrs commit and build, OS, CPU, affinity,
  GC, sizes). A ratio marked ``~`` is a tie: the two loops' min..max ranges
  of throughput overlap. Network workloads also list, per loop, the socket
  options the loop left (TCP_NODELAY, SO_SNDBUF, SO_RCVBUF) and how reads
  were split; with both split_writes workloads, a "split / single" table
  gives each loop's throughput with two writes per response over one.
  A workload in ``workloads.VALUE_WORKLOADS`` (idle_connections) reports a
  measured value instead of a throughput: its cells are that value (KiB of
  RSS per connection pair, lower is better), and its ratios are ratios of
  the value; the rows say so.
  Workloads with a peer process (readline_echo_load's load generator,
  redis-server) list it in the provenance with the CPUs each side ran on.
  With TLS workloads, a "TLS" section gives each loop's TLS / plain ratio
  for every TLS workload run with its plain counterpart
  (workloads.TLS_PAIRS), which TLS path each loop's connections took
  (zuvrs: ``native`` or ``sslproto: <why>``; others: the transport class),
  the negotiated version and cipher, and the OpenSSL version.
* Each sample records which build of its loop it ran (size and mtime of the
  extension module); if a loop was reinstalled during the run, or the load
  average says the machine was busy, the report says so at the top. A
  build whose exposed profile is not a release (``zuvrs._zuvrs.BUILD_PROFILE``)
  is flagged too.
* stdout gets the markdown; progress lines go to stderr as samples finish.

Network workloads (and udp_echo, unix_dgram_echo, pipe_roundtrip,
subprocess_pipe_output, whose transports read with the same 256 KiB buffers) first make one
untimed connection on a throwaway loop of the same kind
(``workloads._prelude``): without it, asyncio's first connection in a fresh
process runs at about half speed (glibc mmap()s, mremap()s and munmap()s
its 256 KiB read buffers on every read until the first EOF read frees one
whole), which no long-running server sees. For the TLS workloads that
connection is a TLS one, which also puts OpenSSL past the algorithm
fetches of a process's first handshake.
``--no-prelude`` turns it off (diagnostic).

Options: ``--loops``, ``--workloads``, ``--samples K`` (default 5),
``--warmups`` (default 1), ``--quick`` (3 samples, half sizes: about 1-2
minutes for the scheduling workloads and 2-3 for the network ones with four
loops; rloop's network failures cost 2-5 s each; the TLS, HTTP keep-alive,
WebSocket and flow-controlled bulk workloads add some more, not yet timed
on a quiet machine; readline_echo_load, the redis rows and idle_connections
took 8 minutes with six loops on a busy machine, redis_get_set most of
it), ``--scale F`` / ``--size NAME=N``
(sizes), ``--timeout S`` (per sample), ``--cpus 0`` (pin every sample),
``--python PATH`` (interpreter for samples), ``--peer-cpu other|same|none``
(where the peer processes of readline_echo_load and the redis rows run:
another CPU than the loop, the default; the loop's own, which takes the
cross-CPU wake-up per round trip out; or unpinned), ``--no-gc`` (diagnostic only,
never a headline), ``--no-prelude`` (diagnostic), ``--gc-time`` (time the
cyclic GC's pauses per sample with ``gc.callbacks`` and report each loop's
median GC time, its share of the run and the collections per generation),
``--json out.json``, ``--markdown out.md``.

Workloads (default sizes; ``benchmarks/workloads.py``, shared with the
pytest-codspeed suite ``benchmarks/test_benchmarks.py``)::

    call_soon        1,000,000 call_soon(cb) in one batch from one callback
    call_soon_args   the same with 3 arguments (checksummed)
    timers_cancel    200,000 call_later scheduled then cancelled, one more turn
    timers_fire      100,000 call_later with delays 1 + i % 100 ms, all fire,
                     order checked (includes >= 101 ms of waiting: a floor
                     that compresses the ratios)
    sleep0_tasks     200,000 tasks doing one sleep(0), gathered 5,000 at a time
    sleep0_one_task  one task doing 200,000 sleep(0)
    threadsafe       200,000 call_soon_threadsafe from another thread
    task_fanout      gather() of 100,000 small coroutines

    network (server and client on the loop under test, one process):
    tcp_echo_streams    20,000 round trips of 1 KiB, one TCP connection on
                        127.0.0.1, asyncio streams both ends, CRC-32 checked
    tcp_echo_protocol   the same with asyncio.Protocol on both ends
    tcp_bulk            1,024 MiB over one TCP connection (streams write +
                        drain -> Protocol), throughput in MiB/s
    unix_echo_streams   tcp_echo_streams over a Unix socket in a temp dir
    short_connections   8,000 connections, 16 concurrent, request + reply
                        + close each
    getaddrinfo_numeric 20,000 loop.getaddrinfo('127.0.0.1', 80), half
                        with type=SOCK_STREAM, answers compared with libc's
    split_writes_one    20,000 request / 1 KiB response round trips, the
                        Protocol server answers with one write()
    split_writes_two    the same with two writes (header, then body)
    tcp_bulk_flow       512 MiB over one TCP connection from a Protocol
                        writer (256 KiB writes, stops at pause_writing, goes
                        on at resume_writing; its transport's buffer must
                        stay under 16 MiB) -> Protocol, in MiB/s
    http_keepalive      8,000 HTTP/1.1 GETs over 16 keep-alive connections
                        (500 each, one at a time): a hand-parsing Protocol
                        server answering 4 KiB bodies after 8 SHA-256
                        passes over each, a streams client checking status,
                        X-Seq, X-Digest and body; every close seen
    websocket           8,000 echo round trips with the websockets library
                        (its asyncio server and client, library defaults:
                        permessage-deflate), 16 ws:// connections, binary
                        messages of 32 / 256 / 4,096 bytes in turn,
                        CRC-32 checked, every close code 1000

    TLS 1.3 (certificates made once per sample process with `cryptography`,
    EC P-256, outside the timed region; the client verifies the chain and
    the host name "localhost"; every connection's version and verified
    peer certificate checked):
    tls_echo_streams    tcp_echo_streams over TLS
    tls_bulk            512 MiB over one TLS connection (as tcp_bulk), MiB/s
    tls_handshakes      1,024 fresh connections, 16 concurrent: a full
                        handshake, one small request/reply, close
    tls_http_keepalive  http_keepalive over 16 TLS connections
    tls_websocket       websocket over wss://

    other processes (the peer pinned to another CPU than the loop under
    test where the sample may use two; see workloads.py):
    readline_echo_load     100,000 lines echoed by a start_server readline
                           echo server (readline, write, drain), loaded by
                           benchmarks/_loadgen.c in another process: 100
                           connections x 1,000 lines ping-pong, every echo
                           compared and CRC-32 checked; lines/s over the
                           client's clock; info gives the client's and the
                           server's CPU share (a client share near 1.0
                           would mean the client was the limit;
                           ``_loadgen.py --capacity`` measures it against a
                           C echo server)
    redis_get_set          20,000 SET + GET round trips with redis-py's
                           asyncio client (default pool, hiredis parser for
                           every loop) against a private redis-server (no
                           persistence) started by the sample, values
                           checked
    redis_pipeline         100,000 commands in pipelines of 100 (50 SET +
                           50 GET), the same client and server

    memory (a value, lower is better):
    idle_connections       5,000 idle stream connection pairs, both ends in
                           the sample (the server handler in readline()):
                           RSS growth per pair in KiB after gc.collect(),
                           against the RSS before the first connection;
                           every close then seen (RLIMIT_NOFILE raised for
                           the sockets and restored)

    datagrams, pipes, child processes (the loop under test does both ends):
    udp_echo               20,000 round trips of 512-byte datagrams between
                           two create_datagram_endpoint endpoints on
                           127.0.0.1, one outstanding, CRC-32 checked (a
                           lost datagram: parity mismatch after the stall
                           timeout, not a hang)
    unix_dgram_echo        udp_echo over two Unix datagram endpoints bound
                           to paths in a temp dir (the client connected to
                           the server's path)
    subprocess_spawn       500 create_subprocess_exec('/bin/true') + wait(),
                           one after the other, return codes checked
    subprocess_pipe_output 256 MiB written by a child (python -I -S -c) to
                           its stdout, read with stdout.read(256 KiB) through
                           asyncio.subprocess.PIPE, counted and its pattern
                           sampled, throughput in MiB/s
    pipe_roundtrip         20,000 round trips of 512 bytes over two os.pipe()
                           pairs, connect_read_pipe / connect_write_pipe at
                           every end, CRC-32 checked

Time = loop creation + work + loop.close(), measured inside the sample;
parity checks run after the clock stops. The plain test run
``python3 -m pytest benchmarks -q`` checks every body on every installed
loop at small sizes in a few seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SAMPLE = os.path.join(HERE, "_sample.py")
sys.path.insert(0, HERE)

import pairing  # noqa: E402
import workloads  # noqa: E402
from _sample import MARKER  # noqa: E402

QUICK_SCALE = 0.5
QUICK_SAMPLES = 3
# How zuvrs is compared; the first of these that exist get ratio columns.
RATIO_BASES = ("uvloop", "asyncio", "rloop", "rsloop")
#: the summary's ratio columns: (subject, bases); a column appears when
#: both loops take part in the run
SUMMARY_RATIOS = (("zuvrs", RATIO_BASES + ("zuvrs-base",)),
                  ("zuvrs-streams", ("uvloop", "zuvrs", "rsloop", "zuvrs-base-streams")))


# --------------------------------------------------------------------------
# Running processes
# --------------------------------------------------------------------------


def _run_child(cmd: List[str], timeout: float) -> Dict[str, Any]:
    """Run cmd in its own process group; kill the group on timeout.

    Returns {"json": parsed marker line or None, "rc", "timed_out",
    "stderr_tail", "wall"}.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO,
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
    except BaseException:
        # Ctrl-C in the harness: do not leave the sample running.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    wall = time.perf_counter() - t0
    data = None
    for line in out.decode("utf-8", "replace").splitlines():
        if line.startswith(MARKER):
            try:
                data = json.loads(line[len(MARKER):])
            except ValueError:
                data = None
    err_s = err.decode("utf-8", "replace").strip()
    return {
        "json": data, "rc": proc.returncode, "timed_out": timed_out,
        "stderr_tail": err_s[-1500:], "wall": wall,
    }


def _signame(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def run_sample(python: str, loop: str, workload: str, size: int,
               timeout: float, cpus: Optional[str], no_gc: bool,
               no_prelude: bool = False, gc_time: bool = False) -> Dict[str, Any]:
    cmd = [python, SAMPLE, "--loop", loop, "--workload", workload,
           "--size", str(size)]
    if cpus:
        cmd += ["--cpus", cpus]
    if no_gc:
        cmd.append("--no-gc")
    if no_prelude:
        cmd.append("--no-prelude")
    if gc_time:
        cmd.append("--gc-time")
    r = _run_child(cmd, timeout)
    s: Dict[str, Any] = dict(r["json"] or {})
    s.setdefault("loop", loop)
    s.setdefault("workload", workload)
    s["wall"] = r["wall"]
    s["rc"] = r["rc"]
    if r["timed_out"]:
        s.update(ok=False, error_kind="timeout",
                 error=f"timeout: killed after {timeout:g} s")
    elif r["json"] is None:
        if r["rc"] is not None and r["rc"] < 0:
            kind, msg = "crash", f"crash: {_signame(r['rc'])}"
        else:
            kind, msg = "crash", f"crash: exit {r['rc']}, no result"
        last = r["stderr_tail"].splitlines()[-1:] if r["stderr_tail"] else []
        if last:
            msg += f" ({last[0][:200]})"
        s.update(ok=False, error_kind=kind, error=msg)
    elif r["rc"] != 0 and s.get("ok", False):
        s.update(ok=False, error_kind="crash",
                 error=f"exit {r['rc']} after a good result")
    s.setdefault("ok", False)
    if not s["ok"]:
        s.setdefault("error_kind", "error")
        s.setdefault("error", "failed")
        s["stderr_tail"] = r["stderr_tail"]
        kind = s["error_kind"]
        if kind == "crash":
            short = s["error"].split(" (")[0]
        elif kind == "parity":
            short = "parity mismatch"
        elif kind == "exception":
            short = "exception " + s["error"].split(":")[0]
        else:
            short = kind
        s["error_short"] = short
    return s


def probe_loop(python: str, loop: str) -> Dict[str, Any]:
    r = _run_child([python, SAMPLE, "--probe", loop], 120)
    if r["json"] is not None:
        return r["json"]
    why = "timeout" if r["timed_out"] else (
        _signame(r["rc"]) if (r["rc"] or 0) < 0 else f"exit {r['rc']}")
    return {"loop": loop, "available": False,
            "error": f"{loop}: probe failed ({why}): {r['stderr_tail'][-300:]}"}


def probe_env(python: str) -> Dict[str, Any]:
    r = _run_child([python, SAMPLE, "--probe-env"], 120)
    return r["json"] or {"error": r["stderr_tail"][-300:]}


# --------------------------------------------------------------------------
# Provenance
# --------------------------------------------------------------------------


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _git(*args: str) -> Optional[str]:
    try:
        r = subprocess.run(["git", "-C", REPO, *args], capture_output=True,
                           text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def machine_info() -> Dict[str, Any]:
    info: Dict[str, Any] = {
        "platform": platform.platform(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    osr = _read("/etc/os-release") or ""
    for line in osr.splitlines():
        if line.startswith("PRETTY_NAME="):
            info["os"] = line.split("=", 1)[1].strip('"')
    cpu = _read("/proc/cpuinfo") or ""
    for line in cpu.splitlines():
        if line.startswith("model name"):
            info["cpu_model"] = line.split(":", 1)[1].strip()
            break
    else:
        info["cpu_model"] = platform.processor() or None
    try:
        info["affinity"] = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        info["affinity"] = None
    gov = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    info["governor"] = gov.strip() if gov else "n/a"
    mem = _read("/proc/meminfo") or ""
    for line in mem.splitlines():
        if line.startswith("MemTotal:"):
            info["mem_total"] = line.split(":", 1)[1].strip()
    try:
        info["loadavg_start"] = list(os.getloadavg())
    except OSError:
        pass
    return info


def repo_info() -> Dict[str, Any]:
    head = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--", "src", "python", "Cargo.toml",
                  "Cargo.lock", "pyproject.toml")
    return {
        "path": REPO,
        "commit": head or "none (no commits yet, or not a git checkout)",
        "dirty_paths": (len(status.splitlines()) if status else 0)
        if status is not None else None,
    }


# --------------------------------------------------------------------------
# Statistics and formatting
# --------------------------------------------------------------------------


def fmt_rate(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def fmt_value(x: Optional[float]) -> str:
    """A measured value (workloads.VALUE_WORKLOADS), e.g. KiB per pair."""
    if x is None:
        return "-"
    return f"{x:.2f}" if abs(x) < 100 else f"{x:.0f}"


def fmt_cell(w: str, x: Optional[float]) -> str:
    """A cell's number: a throughput, or the value of a value workload."""
    return fmt_value(x) if w in workloads.VALUE_WORKLOADS else fmt_rate(x)


def sample_figure(s: Dict[str, Any]) -> Optional[float]:
    """What a good sample measured: its ``value`` (value workloads) or its
    throughput, ops / elapsed."""
    if s.get("value") is not None:
        return s["value"]
    return s["ops"] / s["elapsed"] if s.get("elapsed") else None


def fmt_mib(b: Optional[float]) -> str:
    return "-" if b is None else f"{b / 2**20:.0f}"


def cell_stats(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    good = [s for s in samples if s.get("ok")]
    bad = [s for s in samples if not s.get("ok")]
    st: Dict[str, Any] = {"n": len(samples), "n_ok": len(good),
                          "errors": [s.get("error") for s in bad],
                          "errors_short": [s.get("error_short", "error")
                                           for s in bad]}
    if good:
        rates = [x for x in map(sample_figure, good) if x is not None]
        times = [s["elapsed"] for s in good]
        st["median"] = statistics.median(rates)
        st["min"] = min(rates)
        st["max"] = max(rates)
        st["cv"] = (statistics.stdev(rates) / statistics.mean(rates)
                    if len(rates) > 1 else 0.0)
        st["median_time"] = statistics.median(times)
        peaks = [s["rss_peak"] for s in good if s.get("rss_peak")]
        growth = [s["rss_peak"] - s["rss_start"] for s in good
                  if s.get("rss_peak") and s.get("rss_start")]
        st["rss_peak"] = statistics.median(peaks) if peaks else None
        st["rss_growth"] = statistics.median(growth) if growth else None
        timed = [s for s in good if s.get("gc_seconds") is not None]
        if timed:
            st["gc_seconds"] = statistics.median(sum(s["gc_seconds"]) for s in timed)
            st["gc_share"] = statistics.median(sum(s["gc_seconds"]) / s["elapsed"] for s in timed)
            st["gc_collections"] = [statistics.median(s["gc_collections_during"][g] for s in timed)
                                    for g in range(3)]
    return st


def error_text(st: Dict[str, Any]) -> str:
    """Short text for the failed samples of a cell ('' if none)."""
    counts: Dict[str, int] = {}
    for e in st["errors_short"]:
        counts[e] = counts.get(e, 0) + 1
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in counts.items())


def status_text(st: Optional[Dict[str, Any]], unavailable: Optional[str]) -> str:
    """What to print instead of / next to a median."""
    if unavailable:
        return unavailable
    if st is None:
        return "-"
    if st["n_ok"] == 0:
        return "**" + (error_text(st) or "no samples") + "**"
    return ""


def ratio_spread(a: Optional[Dict[str, Any]], b: Optional[Dict[str, Any]]) -> str:
    """The range of a / b over the two cells' samples: min(a) / max(b) ..
    max(a) / min(b) ('' where it cannot be computed)."""
    if (not a or not b or a.get("min") is None or b.get("min") is None
            or not b["min"] or not b["max"]):
        return ""
    return f"{a['min'] / b['max']:.2f}-{a['max'] / b['min']:.2f}"


def ratio(a: Optional[Dict[str, Any]], b: Optional[Dict[str, Any]],
          key: str = "median") -> str:
    if not a or not b or a.get(key) is None or b.get(key) is None or not b[key]:
        return "n/a"
    r = a[key] / b[key]
    s = f"{r:.2f}x"
    if key == "median" and not (a["max"] < b["min"] or b["max"] < a["min"]):
        s += " ~"
    if a["n_ok"] < a["n"] or b["n_ok"] < b["n"]:
        s += " *"
    return s


def build_profile(probe: Dict[str, Any]) -> Optional[str]:
    """The build profile a loop exposes (e.g. zuvrs._zuvrs.BUILD_PROFILE)."""
    for k, v in (probe.get("build") or {}).items():
        if "profile" in k.lower() and isinstance(v, str):
            return v
    return None


def _fmt_sock(d: Any) -> str:
    if not isinstance(d, dict):
        return repr(d)
    if "error" in d or d.get("socket", 0) is None:
        return d.get("error") or "no socket exposed"
    parts = []
    if "nodelay" in d:
        parts.append(f"nodelay={d['nodelay']}")
    parts += [f"{k}={d[k]}" for k in ("sndbuf", "rcvbuf") if k in d]
    return " ".join(parts)


def info_lines(wr: Dict[str, Any], loops: List[str]) -> List[str]:
    """Per loop, what the network workloads report besides parity: socket
    options as the loop left them (from the first sample that has them) and
    the median of numeric notes (reads per response, ...) over good
    samples (over all of them, said so, when none was good); flags socket
    options that differ between loops."""
    lines: List[str] = []
    socks: Dict[str, str] = {}
    for l in loops:
        samples = wr["samples"].get(l, [])
        infos = [s.get("info") for s in samples if isinstance(s.get("info"), dict)]
        if not infos:
            continue
        parts = []
        for side in ("client_socket", "server_socket"):
            d = next((i[side] for i in infos if side in i), None)
            if d is not None:
                parts.append(f"{side.split('_')[0]} {_fmt_sock(d)}")
        if parts:
            socks[l] = "; ".join(parts)
        good = [s["info"] for s in samples
                if s.get("ok") and isinstance(s.get("info"), dict)]
        if not good and infos:
            # every sample failed: their notes still say what happened
            # (e.g. tcp_bulk's throughput up to the last byte)
            good = infos
            parts.append("(all samples failed; medians over them)")
        keys = sorted({k for i in good for k, v in i.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)})
        for k in keys:
            vals = [i[k] for i in good if isinstance(i.get(k), (int, float))]
            parts.append(f"{k} {statistics.median(vals):g}")
        # textual notes (a prelude that failed, a first mismatch, ...)
        texts: Dict[str, str] = {}
        for i in infos:
            for k, v in i.items():
                if isinstance(v, str) and not (k == "prelude" and v in ("ok", "off")):
                    texts.setdefault(k, v)
        prel = {i.get("prelude") for i in infos} - {None}
        if prel == {"off"}:
            parts.append("prelude off")
        parts += [f"{k}: {v[:200]}" for k, v in sorted(texts.items())]
        if parts:
            lines.append(f"- {l}: " + ", ".join(parts))
    if len(set(socks.values())) > 1:
        lines.append("- **socket options differ between loops** (see above): "
                     "the loops did not do the same work at the kernel level.")
    if lines and socks:
        lines.insert(0, "Per loop: socket options as the loop left them "
                        "(client, server), and notes (medians over good samples):")
    elif lines:
        lines.insert(0, "Per loop, notes (medians over good samples):")
    return lines


def _tls_paths(samples: List[Dict[str, Any]]) -> str:
    """The TLS paths (client, server) and the negotiated version and cipher
    that a cell's samples reported, e.g. "native / native (TLSv1.3
    TLS_AES_256_GCM_SHA384)"; several if they differ between samples."""
    seen: List[str] = []
    for s in samples:
        i = s.get("info")
        if not isinstance(i, dict) or "tls_path_client" not in i and "tls_path_server" not in i:
            continue
        t = (f"{i.get('tls_path_client', '?')} / {i.get('tls_path_server', '?')}"
             + (f" ({i['tls']})" if i.get("tls") else ""))
        if t not in seen:
            seen.append(t)
    return "; ".join(seen)


def tls_lines(report: Dict[str, Any]) -> List[str]:
    """The "TLS / plain" table (per loop, each TLS workload's throughput
    over its plain counterpart's) and which TLS path each loop's
    connections took, with the OpenSSL version."""
    res = report["results"]
    loops: List[str] = report["loops"]
    unavailable: Dict[str, str] = report["unavailable"]
    tls_names = [w for w in res if w.startswith("tls_")]
    if not tls_names:
        return []
    L: List[str] = ["## TLS", ""]
    openssl = report["provenance"]["python"].get("openssl") or "unknown"
    L.append(f"TLS 1.3 over 127.0.0.1, the client verifying the chain and the host name; "
             f"the `ssl` module's {openssl} (zuvrs' native TLS drives the same library "
             f"through `_ssl`).")
    L.append("")
    pairs = [(t, p) for t, p in workloads.TLS_PAIRS if t in res and p in res]
    if pairs:
        L.append("TLS / plain: each TLS workload's median throughput over its plain "
                 "counterpart's, per loop (1.00x means TLS costs nothing).")
        L.append("")
        head = ["loop"] + [f"{t} / {p}" for t, p in pairs]
        L.append("| " + " | ".join(head) + " |")
        L.append("|---|" + "|".join(["---:"] * len(pairs)) + "|")
        for l in loops:
            if l in unavailable:
                L.append(f"| {l} | " + " | ".join(["not installed"] * len(pairs)) + " |")
                continue
            cells = [l]
            for t, p in pairs:
                a, b = res[t]["stats"].get(l), res[p]["stats"].get(l)
                bad = status_text(a, None) or status_text(b, None)
                if bad and (not a or not b or a["n_ok"] == 0 or b["n_ok"] == 0):
                    cells.append(bad)
                else:
                    cells.append(ratio(a, b))
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
    L.append("TLS path per loop (client / server transport: zuvrs says `native` or "
             "`sslproto: <why>`, other loops their transport class) and the negotiated "
             "version and cipher:")
    L.append("")
    for w in tls_names:
        for l in loops:
            if l in unavailable:
                continue
            paths = _tls_paths(res[w]["samples"].get(l, []) + res[w]["warmups"].get(l, []))
            why = error_text(res[w]["stats"][l]) or "no samples"
            L.append(f"- {w} / {l}: {paths or f'none reported ({why})'}")
    L.append("")
    return L


#: info keys that say what a workload's peer was (another process, a
#: library): shown in the provenance
PEER_KEYS = ("client", "client_cpu_share", "cpus", "redis_server", "redis_py",
             "hiredis", "parser")


def peer_info(wr: Dict[str, Any]) -> str:
    """The peers of a workload (load generator, redis-server, redis-py and
    its parser, the CPUs), from its first sample that reports them."""
    for samples in wr["samples"].values():
        for smp in samples:
            i = smp.get("info")
            if isinstance(i, dict) and any(k in i for k in PEER_KEYS):
                return ", ".join(f"{k} {i[k]}" for k in PEER_KEYS
                                 if k in i and k != "client_cpu_share")
    return ""


def ratio_row_label(w: str) -> str:
    """A workload's name in a ratio table, marked when lower is better."""
    return w + (" (lower is better)" if workloads.VALUE_WORKLOADS.get(w, ("", False))[1] else "")


def round_figures(samples: List[Dict[str, Any]]) -> List[Optional[float]]:
    """A cell's figure per round (its samples are in round order), None
    where the sample failed."""
    return [sample_figure(s) if s.get("ok") else None for s in samples]


def paired_table(res: Dict[str, Any], others: List[str], unavailable: Dict[str, str]) -> List[str]:
    """Each loop over uvloop, paired within rounds (pairing.py)."""
    L = ["## Paired ratio over uvloop", "",
         "Each cell: the median of the ratios of the two loops' samples within a round, and its 95% "
         "bootstrap interval. The machine's drift moves both samples of a round together, so this "
         "interval is the one to read a difference of a few per cent from.", "",
         "| workload | " + " | ".join(others) + " |",
         "|---|" + "|".join(["---:"] * len(others)) + "|"]
    for w, wr in res.items():
        base = round_figures(wr["samples"].get("uvloop", []))
        cells = [ratio_row_label(w)]
        for l in others:
            p = None if l in unavailable else pairing.paired_ratio(round_figures(wr["samples"].get(l, [])), base)
            cells.append(pairing.fmt_paired(p, 2) or "n/a")
        L.append("| " + " | ".join(cells) + " |")
    L.append("")
    return L


def render_markdown(report: Dict[str, Any]) -> str:
    loops: List[str] = report["loops"]
    unavailable: Dict[str, str] = report["unavailable"]
    avail = [l for l in loops if l not in unavailable]
    res = report["results"]
    L: List[str] = []
    gc_note = ("GC **OFF**: DIAGNOSTIC run, not a headline"
               if report["config"]["no_gc"] else "GC on (default)")
    L.append(f"# zuvrs loop benchmarks ({report['started']})")
    L.append("")
    L.append(f"{report['config']['samples']} samples per loop and workload, "
             f"each in a fresh process, {report['config']['warmups']} warm-up "
             f"process(es) not counted, loop order rotated every round, "
             f"{gc_note}"
             + (", **quick mode** (reduced sizes)" if report["config"]["quick"] else "")
             + ". Throughput in operations per second, higher is better. "
             "`~` marks a ratio whose two min..max ranges overlap (a tie); "
             "`*` marks a ratio over a cell with failed samples.")
    L.append("")
    notes = [f"- **{l}**: {why}" for l, why in unavailable.items()]
    if report["config"].get("no_prelude"):
        notes.append("- **network prelude OFF: DIAGNOSTIC run** (each sample's "
                     "first connection is the timed one; asyncio then pays "
                     "allocator transients, see workloads._prelude)")
    for l, ids in report.get("builds_seen", {}).items():
        if len(ids) > 1:
            notes.append(f"- **{l} was rebuilt during this run**: samples ran "
                         f"{len(ids)} different builds ({'; '.join(ids)}); "
                         f"its numbers mix them, rerun.")
    busy = [x for x in (report["provenance"]["machine"].get("loadavg_start"),
                        report["provenance"]["machine"].get("loadavg_end")) if x]
    ncpu = report["provenance"]["machine"].get("cpu_count") or 1
    if any(x[0] >= ncpu / 2 for x in busy):
        notes.append(f"- load average {busy[0][0]:.2f} at start, "
                     f"{busy[-1][0]:.2f} at end on {ncpu} cores: the machine "
                     f"may have been busy with other work.")
    release = ("release", "release-lto", "lto", "bench")
    for l in avail:
        prof = build_profile(report["provenance"]["loops"].get(l, {}))
        if prof and prof.lower() not in release:
            notes.append(f"- **{l} is a `{prof}` build**: its numbers say little "
                         f"about a release build.")
        # the profile each sample saw (the build may change during a run)
        odd: Dict[str, List[str]] = {}
        for w, wr in report["results"].items():
            for s in wr["samples"].get(l, []):
                p = s.get("build_profile")
                if p and p.lower() not in release and w not in odd.setdefault(p, []):
                    odd[p].append(w)
        for p, ws in odd.items():
            if p != prof:
                notes.append(f"- **some {l} samples ran a `{p}` build** (workloads: "
                             f"{', '.join(ws)}): their numbers say little about a "
                             f"release build.")
    if notes:
        L.extend(notes)
        L.append("")

    # ---- summary ----
    pairs = [(subj, b) for subj, bs in SUMMARY_RATIOS if subj in loops
             for b in bs if b in loops and b != subj]
    values = [w for w in res if w in workloads.VALUE_WORKLOADS]
    L.append("## Summary: median throughput")
    L.append("")
    if values:
        L.append("Rows marked *lower is better* give a measured value, not a "
                 "throughput (" + ", ".join(
                     f"`{w}`: {workloads.VALUE_WORKLOADS[w][0]}" for w in values)
                 + "); their ratios are ratios of that value.")
        L.append("")
    head = ["workload", "size"] + loops
    head += [f"{subj}/{b}" for subj, b in pairs]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|")
    for w, wr in res.items():
        size = f"{wr['size']:,}" + (f" {workloads.UNITS[w]}" if w in workloads.UNITS else "")
        if w in workloads.VALUE_WORKLOADS:
            unit, lower = workloads.VALUE_WORKLOADS[w]
            size += f"; {unit}" + (", *lower is better*" if lower else "")
        cells = [w, size]
        for l in loops:
            st = wr["stats"].get(l)
            bad = status_text(st, unavailable.get(l) and "not installed")
            if bad and (st is None or st["n_ok"] == 0):
                cells.append(bad)
            else:
                c = fmt_cell(w, st["median"])
                if st["n_ok"] < st["n"]:
                    c += f" ({st['n_ok']}/{st['n']} ok)"
                cells.append(c)
        for subj, b in pairs:
            cells.append(ratio(wr["stats"].get(subj), wr["stats"].get(b)))
        L.append("| " + " | ".join(cells) + " |")
    L.append("")

    if "uvloop" in avail and len(avail) > 1:
        others = [l for l in loops if l != "uvloop"]
        L.append("## Ratio over uvloop (median throughput)")
        L.append("")
        L.append("Each cell: the ratio of medians, then in brackets its spread, "
                 "min / max .. max / min over the two cells' samples.")
        L.append("")
        L.append("| workload | " + " | ".join(others) + " |")
        L.append("|---|" + "|".join(["---:"] * len(others)) + "|")
        for w, wr in res.items():
            cells = [ratio_row_label(w)]
            for l in others:
                if l in unavailable:
                    cells.append("not installed")
                else:
                    a, b = wr["stats"].get(l), wr["stats"].get("uvloop")
                    r = ratio(a, b)
                    spread = ratio_spread(a, b) if r != "n/a" else ""
                    cells.append(r + (f" [{spread}]" if spread else ""))
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
        L.extend(paired_table(res, others, unavailable))

    # ---- split / single ----
    one, two = workloads.SPLIT_PAIR
    if one in res and two in res:
        L.append("## Split writes: split / single (median throughput)")
        L.append("")
        L.append(f"Each response sent as two writes (`{two}`) over one write "
                 f"(`{one}`), per loop: 1.00x means splitting costs nothing.")
        L.append("")
        L.append("| loop | one write | two writes | split / single |")
        L.append("|---|---:|---:|---:|")
        for l in loops:
            if l in unavailable:
                L.append(f"| {l} | not installed | | |")
                continue
            a, b = res[one]["stats"].get(l), res[two]["stats"].get(l)
            cells = [l]
            for st in (a, b):
                bad = status_text(st, None)
                cells.append(bad if bad else fmt_rate(st["median"]))
            cells.append(ratio(b, a))
            L.append("| " + " | ".join(cells) + " |")
        L.append("")

    # ---- TLS / plain ----
    L.extend(tls_lines(report))

    # ---- details ----
    L.append("## Details per workload")
    L.append("")
    for w, wr in res.items():
        L.append(f"### {w}: {wr['size']:,} {wr['description']}")
        L.append("")
        what = (f"median {workloads.VALUE_WORKLOADS[w][0]}" if w in workloads.VALUE_WORKLOADS
                else f"median {workloads.UNITS.get(w, 'ops')}/s")
        L.append(f"| loop | {what} | min | max | CV | median time (s) "
                 "| peak RSS (MiB) | RSS growth (MiB) | samples ok | errors |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for l in loops:
            if l in unavailable:
                L.append(f"| {l} | not installed | | | | | | | | |")
                continue
            st = wr["stats"][l]
            err = error_text(st)
            if st["n_ok"] == 0:
                L.append(f"| {l} | **{err}** | | | | | | | 0/{st['n']} | {err} |")
                continue
            L.append(
                f"| {l} | {fmt_cell(w, st['median'])} | {fmt_cell(w, st['min'])} | "
                f"{fmt_cell(w, st['max'])} | {st['cv'] * 100:.1f}% | "
                f"{st['median_time']:.3f} | {fmt_mib(st['rss_peak'])} | "
                f"{fmt_mib(st['rss_growth'])} | {st['n_ok']}/{st['n']} | {err} |")
        if wr.get("warmup_errors"):
            L.append("")
            L.append("Warm-up errors: " + "; ".join(
                f"{l}: {e}" for l, e in wr["warmup_errors"].items()))
        if wr.get("parity_disagreement"):
            L.append("")
            L.append(f"**Parity disagreement between loops**: {wr['parity_disagreement']}")
        gc_lines = [f"{l} {wr['stats'][l]['gc_seconds']:.3f} s ({wr['stats'][l]['gc_share'] * 100:.1f}%; "
                    f"collections {'/'.join(f'{c:g}' for c in wr['stats'][l]['gc_collections'])})"
                    for l in loops if l in avail and wr["stats"][l].get("gc_seconds") is not None]
        if gc_lines:
            L.append("")
            L.append("Cyclic GC pauses during the workload, medians (share of the median time; "
                     "collections of generations 0/1/2): " + ", ".join(gc_lines) + ".")
        info = info_lines(wr, [l for l in loops if l in avail])
        if info:
            L.append("")
            L.extend(info)
        parts = []
        figure = "value" if w in workloads.VALUE_WORKLOADS else "throughput"
        for subj, b in pairs:
            if subj in avail and b in avail:
                z, bs = wr["stats"].get(subj), wr["stats"].get(b)
                parts.append(f"{subj}/{b}: {figure} {ratio(z, bs)}, "
                             f"peak RSS {ratio(z, bs, 'rss_peak')}")
        if parts:
            L.append("")
            L.append("; ".join(parts) + ".")
        L.append("")

    # ---- errors ----
    errs = []
    for w, wr in res.items():
        for l, samples in wr["samples"].items():
            for i, s in enumerate(samples):
                if not s.get("ok"):
                    errs.append(f"- {w} / {l} / sample {i + 1}: {s.get('error')}")
    if errs:
        L.append("## Errors")
        L.append("")
        L.extend(errs)
        L.append("")

    # ---- provenance ----
    p = report["provenance"]
    py = p["python"]
    m = p["machine"]
    L.append("## Provenance")
    L.append("")
    L.append("```")
    L.append(f"date (UTC)     {report['started']}  ({report['duration_s']:.0f} s)")
    L.append(f"command        {' '.join(report['argv'])}")
    L.append(f"python         {py.get('executable')}")
    version = py.get("version", "").splitlines()[0] if py.get("version") else ""
    L.append(f"               {py.get('implementation')} {version}")
    L.append(f"build          debug={py.get('debug_build')} free_threaded={py.get('free_threaded')} "
             f"gil_enabled={py.get('gil_enabled')} jit={py.get('jit_enabled', 'n/a')} "
             f"dev_mode={py.get('dev_mode')} optimize={py.get('optimize')}")
    L.append(f"configure      {py.get('config_args')}")
    if py.get("env"):
        L.append(f"env            {py.get('env')}")
    L.append(f"GC             enabled={py.get('gc_enabled')} threshold={py.get('gc_threshold')}"
             f" (samples: {report['gc_in_samples']})")
    L.append(f"OpenSSL        {py.get('openssl', 'unknown')} (the ssl module's)")
    for l in loops:
        pr = p["loops"].get(l, {})
        if not pr.get("available"):
            L.append(f"{l:<14} {pr.get('error', 'not available')}")
            continue
        line = f"{l:<14} {pr.get('version')}"
        if pr.get("file"):
            line += f"  ({pr['file']})"
        L.append(line)
        for e in pr.get("extensions", []):
            L.append(f"{'':<14} {os.path.basename(e['file'])}: {e['bytes']:,} bytes, mtime {e['mtime']}")
        if workloads.LOOP_NOTES.get(l):
            L.append(f"{'':<14} {workloads.LOOP_NOTES[l]}")
        if l.startswith("zuvrs"):
            b = {k: v for k, v in pr.get("build", {}).items()
                 if not k.endswith("__version__")}
            L.append(f"{'':<14} build profile: {build_profile(pr) or 'not exposed (unknown)'}; "
                     f"build info: {b if b else 'none exposed'}")
        if pr.get("loop_type"):
            L.append(f"{'':<14} loop class: {pr['loop_type']}")
    r = p["repo"]
    dirty = "unknown" if r["dirty_paths"] is None else r["dirty_paths"]
    L.append(f"zuvrs repo     {r['path']} commit {r['commit']}, "
             f"{dirty} changed path(s) under src/ python/ Cargo.* pyproject.toml "
             f"(the installed build may differ; see the extension mtime)")
    L.append(f"OS             {m.get('os')}; {m.get('platform')}; kernel {m.get('kernel')}")
    L.append(f"CPU            {m.get('cpu_model')}; {m.get('cpu_count')} cores; "
             f"affinity {m.get('affinity')}; governor {m.get('governor')}; "
             f"mem {m.get('mem_total')}")
    L.append(f"load average   start {m.get('loadavg_start')} end {m.get('loadavg_end')}")
    L.append(f"samples        {report['config']['samples']} per cell, "
             f"warm-ups {report['config']['warmups']}, timeout {report['config']['timeout']:g} s, "
             f"cpus {report['config']['cpus'] or 'not pinned'}, network prelude "
             f"{'OFF' if report['config'].get('no_prelude') else 'on'}, peer processes on "
             f"the {report['config'].get('peer_cpu', 'other')} CPU")
    L.append("sizes          " + ", ".join(f"{w}={wr['size']:,}" for w, wr in res.items()))
    for w, wr in res.items():
        peers = peer_info(wr)
        if peers:
            L.append(f"{'peers':<14} {w}: {peers}")
    L.append("```")
    L.append("")
    L.append("Stock asyncio is the control: if its numbers are far from their "
             "usual values on this machine, distrust the whole run.")
    return "\n".join(L) + "\n"


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def _progress(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def _csv(s: str) -> List[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description="Compare event loops on scheduling, network, datagram, "
                    "pipe and process workloads "
                    "(fresh process per sample).",
        epilog="See the module docstring for details.")
    ap.add_argument("--loops", default=",".join(workloads.LOOP_NAMES),
                    help="comma-separated (default: %(default)s)")
    ap.add_argument("--workloads", default=",".join(workloads.WORKLOADS),
                    help="comma-separated (default: all: %(default)s)")
    ap.add_argument("--samples", type=int, default=None,
                    help="measured samples per loop and workload (default 5, quick 3)")
    ap.add_argument("--warmups", type=int, default=1,
                    help="warm-up processes per loop and workload, not counted")
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_SAMPLES} samples and sizes x{QUICK_SCALE} "
                         "(minutes; see the module docstring)")
    ap.add_argument("--scale", type=float, default=None,
                    help="multiply every default size by this")
    ap.add_argument("--size", action="append", default=[], metavar="NAME=N",
                    help="size of one workload (repeatable)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds before a sample is killed (default 120, quick 60)")
    ap.add_argument("--cpus", default=None,
                    help="pin every sample to these CPUs, e.g. 0 (default: not pinned)")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter that runs the samples (default: this one)")
    ap.add_argument("--peer-cpu", choices=workloads.PEER_CPU_MODES, default=None,
                    help="where readline_echo_load's load generator and the redis "
                         "workloads' redis-server run: another CPU than the loop "
                         "(other, the default), the loop's (same), or unpinned "
                         "(none); sets ZUVRS_BENCH_PEER_CPU for the samples")
    ap.add_argument("--no-gc", action="store_true",
                    help="DIAGNOSTIC: disable the GC in samples (never a headline)")
    ap.add_argument("--no-prelude", action="store_true",
                    help="DIAGNOSTIC: network workloads skip their untimed "
                         "first connection (see workloads._prelude)")
    ap.add_argument("--gc-time", action="store_true",
                    help="also time the cyclic GC's pauses in each sample "
                         "(gc.callbacks: a Python call per collection)")
    ap.add_argument("--json", metavar="PATH", help="write all data as JSON")
    ap.add_argument("--markdown", metavar="PATH", help="also write the markdown here")
    a = ap.parse_args(argv)

    loops = _csv(a.loops)
    for l in loops:
        if l not in workloads.LOOP_NAMES + workloads.EXTRA_LOOP_NAMES:
            ap.error(f"unknown loop {l!r}; known: "
                     f"{', '.join(workloads.LOOP_NAMES + workloads.EXTRA_LOOP_NAMES)}")
    wnames = _csv(a.workloads)
    for w in wnames:
        if w not in workloads.WORKLOADS:
            ap.error(f"unknown workload {w!r}; known: {', '.join(workloads.WORKLOADS)}")
    samples_k = a.samples if a.samples is not None else (QUICK_SAMPLES if a.quick else 5)
    if samples_k < 1:
        ap.error("--samples must be >= 1")
    timeout = a.timeout if a.timeout is not None else (60.0 if a.quick else 120.0)
    scale = a.scale if a.scale is not None else (QUICK_SCALE if a.quick else 1.0)
    sizes = {w: max(1, int(workloads.WORKLOADS[w][1] * scale)) for w in wnames}
    for spec in a.size:
        name, _, val = spec.partition("=")
        if name not in sizes or not val.isdigit():
            ap.error(f"bad --size {spec!r} (workload must be selected; N an integer)")
        sizes[name] = int(val)

    if a.peer_cpu:
        os.environ["ZUVRS_BENCH_PEER_CPU"] = a.peer_cpu  # the samples inherit it
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    t_start = time.perf_counter()
    _progress(f"compare.py: loops {loops}, workloads {wnames}, {samples_k} samples, "
              f"timeout {timeout:g} s, python {a.python}")

    machine = machine_info()
    repo = repo_info()
    env = probe_env(a.python)
    loop_info: Dict[str, Any] = {}
    unavailable: Dict[str, str] = {}
    for l in loops:
        info = probe_loop(a.python, l)
        loop_info[l] = info
        if info.get("available"):
            _progress(f"  {l}: {info.get('version')} ({info.get('file')})")
        else:
            why = info.get("error", "not available")
            unavailable[l] = ("not installed" if why.endswith("not installed")
                              else why)
            _progress(f"  {why}" if why.startswith(l + ":") else f"  {l}: {why}")
    avail = [l for l in loops if l not in unavailable]

    per_cell = samples_k + a.warmups
    total = len(wnames) * len(avail) * per_cell
    done = 0
    results: Dict[str, Any] = {}
    gc_seen = set()
    rot = 0
    for w in wnames:
        size = sizes[w]
        wr: Dict[str, Any] = {
            "size": size, "description": workloads.WORKLOADS[w][2],
            "samples": {l: [] for l in avail}, "warmups": {l: [] for l in avail},
            "warmup_errors": {},
        }
        results[w] = wr
        rounds = [("warm-up", i) for i in range(a.warmups)] + \
                 [("round", i) for i in range(samples_k)]
        for kind, i in rounds:
            if avail:
                k = rot % len(avail)
                order = avail[k:] + avail[:k]
                rot += 1
            else:
                order = []
            for l in order:
                s = run_sample(a.python, l, w, size, timeout, a.cpus, a.no_gc,
                               a.no_prelude, a.gc_time)
                done += 1
                if "gc_enabled" in s:
                    gc_seen.add(s["gc_enabled"])
                if kind == "warm-up":
                    wr["warmups"][l].append(s)
                    if not s.get("ok"):
                        wr["warmup_errors"][l] = s.get("error")
                    label = "warm-up"
                else:
                    wr["samples"][l].append(s)
                    label = f"round {i + 1}/{samples_k}"
                if s.get("ok") and w in workloads.VALUE_WORKLOADS:
                    what = (f"{fmt_value(s.get('value'))} {workloads.VALUE_WORKLOADS[w][0]} "
                            f"({s['elapsed']:.3f} s, peak RSS {fmt_mib(s.get('rss_peak'))} MiB)")
                elif s.get("ok"):
                    what = (f"{fmt_rate(s['ops'] / s['elapsed'])} ops/s "
                            f"({s['elapsed']:.3f} s, peak RSS {fmt_mib(s.get('rss_peak'))} MiB)")
                else:
                    what = f"ERROR {s.get('error')}"
                _progress(f"[{done}/{total}] {w:<16} {l:<8} {label:<11} {what}")
        wr["stats"] = {l: cell_stats(wr["samples"][l]) for l in avail}
        # Parity must agree across loops (each sample was already checked
        # against the expected value; this catches a wrong expectation).
        seen = {}
        for l in avail:
            for s in wr["samples"][l]:
                if s.get("ok"):
                    seen.setdefault(json.dumps(s.get("parity"), sort_keys=True), l)
        if len(seen) > 1:
            wr["parity_disagreement"] = seen
        # loop class as seen by the samples (provenance)
        for l in avail:
            for s in wr["samples"][l] + wr["warmups"][l]:
                if s.get("loop_type"):
                    loop_info[l].setdefault("loop_type", s["loop_type"])

    builds_seen: Dict[str, List[str]] = {}
    for wr in results.values():
        for l in avail:
            for s in wr["warmups"][l] + wr["samples"][l]:
                b = s.get("build_id")
                if b and b not in builds_seen.setdefault(l, []):
                    builds_seen[l].append(b)
    m = machine
    try:
        m["loadavg_end"] = list(os.getloadavg())
    except OSError:
        pass
    report = {
        "started": started,
        "duration_s": time.perf_counter() - t_start,
        "argv": [os.path.relpath(sys.argv[0], REPO) if sys.argv and sys.argv[0] else "compare.py"]
        + (argv if argv is not None else sys.argv[1:]),
        "loops": loops,
        "unavailable": unavailable,
        "config": {"samples": samples_k, "warmups": a.warmups, "quick": a.quick,
                   "scale": scale, "timeout": timeout, "cpus": a.cpus,
                   "no_gc": a.no_gc, "no_prelude": a.no_prelude, "gc_time": a.gc_time, "sizes": sizes,
                   "peer_cpu": os.environ.get("ZUVRS_BENCH_PEER_CPU", "other")},
        "gc_in_samples": ("enabled" if gc_seen == {True} else
                          "DISABLED" if gc_seen == {False} else
                          "mixed" if gc_seen else "n/a"),
        "builds_seen": builds_seen,
        "provenance": {"python": env, "loops": loop_info, "repo": repo,
                       "machine": m},
        "results": results,
    }
    md = render_markdown(report)
    sys.stdout.write(md)
    sys.stdout.flush()
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, default=repr)
    _progress(f"compare.py: done in {report['duration_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
