"""Shared machinery of the HTTP benchmarks (uvicorn_bench.py, aiohttp_bench.py).

A sample is: a fresh server process on the loop under test, pinned with
``taskset`` to one CPU; its routes checked with a real request (status,
headers' size, exact body); ``wrk`` pinned to another CPU for a few seconds;
the routes checked again; the server stopped through its stdin (not a
signal, so that every loop stops the same way) and asked how many requests
it served. Parity of a sample:

* wrk saw no socket error (connect, read, write, timeout) and no non-2xx
  response;
* the bytes wrk read match its request count: every response has the size
  measured before (0 <= bytes - requests * size < connections * size, the
  slack being the responses in flight when wrk stopped);
* the server's own request count matches wrk's (it may have served up to
  one more per connection, whose responses wrk did not wait for);
* the routes answer correctly after the load, and the server stops cleanly.

The first route check also means the server has served and seen the
close of one connection before the load starts (the state compare.py's
network workloads reach with their untimed prelude connection).

A failed check, a server that does not start, crashes or hangs is recorded
as that sample's error and shown in the table; nothing is retried.

Server processes print one line ``@@HTTPBENCH-READY@@ {json}`` once they
listen (port, loop class, HTTP parser, versions) and, after reading
``stop`` on stdin (or EOF), ``@@HTTPBENCH-STOPPED@@ {json}`` with their
request counts.
"""

from __future__ import annotations

import datetime
import json
import os
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare  # noqa: E402  (provenance, ratio and formatting helpers)
import workloads  # noqa: E402

READY = "@@HTTPBENCH-READY@@ "
STOPPED = "@@HTTPBENCH-STOPPED@@ "
HOST = "127.0.0.1"

# ---- the routes (the same bytes for every server) -------------------------

PLAINTEXT = b"Hello, World!"
BODY_10K = (b"0123456789abcdef" * 640)  # 10,240 bytes
ROUTES: Dict[str, Tuple[str, bytes]] = {
    "plaintext": ("/", PLAINTEXT),
    "body10k": ("/10k", BODY_10K),
}
PATH_BODY = {path: body for path, body in ROUTES.values()}


# ---- server side helpers ----------------------------------------------------


def emit(marker: str, obj: Dict[str, Any]) -> None:
    sys.stdout.flush()
    sys.stdout.write(marker + json.dumps(obj, default=repr) + "\n")
    sys.stdout.flush()


def watch_stdin(on_stop: Callable[[], None]) -> threading.Thread:
    """Call on_stop() (from a daemon thread) when stdin says ``stop`` or
    closes."""

    def run() -> None:
        try:
            for line in sys.stdin:
                if line.strip() == "stop":
                    break
        except Exception:
            pass
        on_stop()

    t = threading.Thread(target=run, name="stdin-stop", daemon=True)
    t.start()
    return t


def pin_self(cpu: Optional[str]) -> Optional[List[int]]:
    if cpu:
        try:
            os.sched_setaffinity(0, {int(c) for c in cpu.split(",")})
        except Exception:
            pass
    try:
        return sorted(os.sched_getaffinity(0))
    except Exception:
        return None


def build_id(loop_name: str) -> Optional[str]:
    """Which build of the loop this process runs (extension file, size,
    mtime), as _sample.py records it; None for asyncio."""
    if loop_name == "asyncio":
        return None
    try:
        import _sample
        mod = sys.modules.get(workloads._LOOP_MODULES[loop_name][0])
        if mod is None:
            return None
        bid = ";".join(f"{os.path.basename(e['file'])}:{e['bytes']}:{e['mtime']}"
                       for e in _sample._extensions(mod))
        for k, v in _sample._build_info(mod).items():
            if "profile" in k.lower() and isinstance(v, str):
                bid += f";profile={v}"
                break
        return bid
    except Exception as exc:
        return f"unknown ({exc!r})"


def dist_version(name: str) -> Optional[str]:
    try:
        from importlib import metadata
        return metadata.version(name)
    except Exception:
        return None


# ---- client side: processes ------------------------------------------------


class Proc:
    """A child process in its own session whose stdout lines are collected
    by a thread (so that markers can be awaited with a timeout)."""

    def __init__(self, cmd: List[str], cpu: Optional[str], env: Optional[Dict[str, str]] = None) -> None:
        if cpu is not None and shutil.which("taskset"):
            cmd = ["taskset", "-c", cpu] + cmd
        self.cmd = cmd
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
            cwd=os.path.dirname(HERE), env=env,
        )
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.stdout: List[str] = []
        self.stderr: List[str] = []
        self._t_out = threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True)
        self._t_err = threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True)
        self._t_out.start()
        self._t_err.start()

    def _pump(self, stream: Any, is_out: bool) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if is_out:
                self.stdout.append(line)
                self.lines.put(line)
            else:
                self.stderr.append(line)
                if len(self.stderr) > 400:
                    del self.stderr[:200]
        if is_out:
            self.lines.put(None)

    def wait_marker(self, marker: str, timeout: float) -> Optional[Dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith(marker):
                try:
                    return json.loads(line[len(marker):])
                except ValueError:
                    return None

    def stderr_tail(self, n: int = 1500) -> str:
        return "\n".join(self.stderr)[-n:]

    def stop(self, timeout: float = 10.0) -> Dict[str, Any]:
        """Ask the server to stop (``stop`` on stdin), wait for it; kill the
        process group if it does not exit in time."""
        out: Dict[str, Any] = {"killed": False}
        try:
            if self.proc.stdin:
                self.proc.stdin.write(b"stop\n")
                self.proc.stdin.flush()
                self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        stopped = self.wait_marker(STOPPED, timeout)
        try:
            self.proc.wait(timeout=max(1.0, timeout / 2) if stopped else 1.0)
        except subprocess.TimeoutExpired:
            self.kill()
            out["killed"] = True
        out["stopped"] = stopped
        out["rc"] = self.proc.returncode
        return out

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def rc_text(rc: Optional[int]) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit {rc}"


# ---- checking a route --------------------------------------------------------


def http_get(port: int, path: str, timeout: float = 5.0,
             tls: Any = None) -> Dict[str, Any]:
    """One GET with exactly wrk's request line and headers; returns status,
    the response's total size, the body and whether it could be parsed.
    With ``tls`` (a client SSLContext), over TLS to host name
    workloads.TLS_HOSTNAME (verified), and the TLS version and cipher
    negotiated."""
    req = f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode()
    tls_info = None
    with socket.create_connection((HOST, port), timeout=timeout) as raw:
        s = (tls.wrap_socket(raw, server_hostname=workloads.TLS_HOSTNAME)
             if tls is not None else raw)
        if tls is not None:
            c = s.cipher()
            tls_info = f"{s.version()} {c[0] if c else None}"
        s.sendall(req)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed before the headers ({buf[:80]!r})")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(b":")
            headers[k.strip().lower()] = v.strip()
        if b"content-length" not in headers:
            raise ValueError(f"no content-length: {head[:200]!r}")
        clen = int(headers[b"content-length"])
        while len(rest) < clen:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed in the body")
            rest += chunk
    return {"status": status, "size": len(head) + 4 + clen, "body": rest[:clen],
            "headers": {k.decode(): v.decode("latin-1") for k, v in headers.items()},
            "tls": tls_info}


def check_route(port: int, path: str, tls: Any = None,
                note: Optional[Dict[str, Any]] = None) -> Tuple[Optional[int], Optional[str]]:
    """(response size, None) if the route answers 200 with the exact body;
    (None, why) otherwise. ``tls``: see http_get; ``note`` gets the TLS
    version and cipher."""
    try:
        r = http_get(port, path, tls=tls)
        if note is not None and r.get("tls"):
            note["tls"] = r["tls"]
    except Exception as exc:
        return None, f"GET {path}: {exc!r}"
    if r["status"] != 200:
        return None, f"GET {path}: status {r['status']}"
    if r["body"] != PATH_BODY[path]:
        return None, (f"GET {path}: wrong body ({len(r['body'])} bytes, "
                      f"{r['body'][:40]!r})")
    return r["size"], None


# ---- wrk ------------------------------------------------------------------------

WRK_MARKER = "@@WRK@@ "
WRK_LUA = r"""
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '@@WRK@@ {"requests": %d, "bytes": %d, "duration_us": %d, ' ..
    '"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d, ' ..
    '"lat_mean_us": %.1f, "lat_p50_us": %d, "lat_p99_us": %d, "lat_max_us": %d}\n',
    summary.requests, summary.bytes, summary.duration,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def wrk_path() -> Optional[str]:
    return shutil.which("wrk")


def wrk_version() -> Optional[str]:
    w = wrk_path()
    if not w:
        return None
    r = subprocess.run([w, "--version"], capture_output=True, text=True)
    return (r.stdout or r.stderr).splitlines()[0].strip() if (r.stdout or r.stderr) else None


_LUA_FILE: List[str] = []


def _lua_file() -> str:
    if not _LUA_FILE:
        fd, p = tempfile.mkstemp(prefix="httpbench-", suffix=".lua")
        with os.fdopen(fd, "w") as f:
            f.write(WRK_LUA)
        _LUA_FILE.append(p)
    return _LUA_FILE[0]


def cleanup() -> None:
    for p in _LUA_FILE:
        try:
            os.unlink(p)
        except OSError:
            pass


def run_wrk(port: int, path: str, duration: float, connections: int,
            threads: int, cpu: Optional[str], scheme: str = "http") -> Dict[str, Any]:
    """wrk against scheme://127.0.0.1:port/path (with https, wrk's own
    OpenSSL client: it does not verify the certificate)."""
    cmd = [wrk_path() or "wrk", "-t", str(threads), "-c", str(connections),
           "-d", f"{max(1, int(round(duration)))}s", "--timeout", "5s",
           "-s", _lua_file(), f"{scheme}://{HOST}:{port}{path}"]
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", cpu] + cmd
    try:
        r = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=duration + 30)
    except subprocess.TimeoutExpired:
        return {"error": "wrk did not finish"}
    for line in r.stdout.splitlines():
        if line.startswith(WRK_MARKER):
            d = json.loads(line[len(WRK_MARKER):])
            d["rps"] = d["requests"] / (d["duration_us"] / 1e6) if d["duration_us"] else 0.0
            return d
    return {"error": f"wrk: no summary (rc {r.returncode}): {(r.stderr or r.stdout)[-300:]}"}


# ---- one server sample ----------------------------------------------------------


def server_sample(cmd: List[str], route: str, a: Any,
                  env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Start a server (cmd), check the route, run wrk, check again, stop.

    Returns {"ok", "rps", "lat_p99_us", "error", "server": READY info,
    "wrk": summary, "served": ...}.
    """
    path, _ = ROUTES[route]
    s: Dict[str, Any] = {"ok": False, "route": route}
    tls = getattr(a, "tls_client_context", None)  # https (uvicorn_bench --ssl)
    proc = Proc(cmd, a.server_cpu, env=env)
    try:
        ready = proc.wait_marker(READY, a.start_timeout)
        if ready is None:
            proc.kill()
            # a loop without TLS (rloop raises NotImplementedError for ssl=)
            if proc.stderr_tail().rstrip().endswith("NotImplementedError"):
                s["error"] = ("unsupported: the server's loop raised NotImplementedError "
                              f"starting to listen ({rc_text(proc.proc.poll())})")
                s["error_short"] = "unsupported"
                return s
            s["error"] = (f"server did not start ({rc_text(proc.proc.poll())}): "
                          f"{proc.stderr_tail(300)}")
            s["error_short"] = "no start"
            return s
        s["server"] = ready
        port = int(ready["port"])
        verify = 0
        size, why = check_route(port, path, tls, s)
        verify += 1
        if size is None:
            s["error"], s["error_short"] = why, "wrong response"
            return s
        s["response_size"] = size
        w = run_wrk(port, path, a.duration, a.connections, a.threads, a.client_cpu,
                    "https" if tls is not None else "http")
        s["wrk"] = w
        alive = proc.proc.poll()
        size2, why2 = check_route(port, path, tls) if alive is None else (None, "server gone")
        verify += 1
        if "error" in w:
            s["error"], s["error_short"] = w["error"], "wrk error"
            return s
        if alive is not None:
            s["error"] = f"server died under load ({rc_text(alive)}): {proc.stderr_tail(300)}"
            s["error_short"] = "crash " + rc_text(alive)
            return s
        problems = []
        errs = {k: w[k] for k in ("connect", "read", "write", "timeout", "status") if w[k]}
        if errs:
            problems.append(f"wrk errors {errs}")
        slack = w["bytes"] - w["requests"] * size
        if not (0 <= slack < a.connections * size):
            problems.append(f"wrk read {w['bytes']} bytes for {w['requests']} "
                            f"responses of {size} bytes")
        if w["requests"] == 0:
            problems.append("no requests completed")
        if size2 != size:
            problems.append(f"after the load: {why2 or f'response size {size2} != {size}'}")
        st = proc.stop(a.stop_timeout)
        s["stop"] = {k: st[k] for k in ("killed", "rc")}
        stopped = st.get("stopped") or {}
        served = stopped.get("served", {}).get(path)
        s["served"] = served
        if stopped.get("tls_paths") is not None:
            s["tls_paths"] = stopped["tls_paths"]
        if st["killed"] or not stopped:
            problems.append(f"server did not stop cleanly ({rc_text(st['rc'])}"
                            f"{', killed' if st['killed'] else ''})")
        elif served is None:
            problems.append("server reported no request count")
        else:
            by_wrk = served - verify
            if not (w["requests"] <= by_wrk <= w["requests"] + a.connections):
                problems.append(f"server served {by_wrk} wrk requests, wrk "
                                f"counted {w['requests']}")
        s["rps"] = w["rps"]
        s["lat_p99_us"] = w["lat_p99_us"]
        if problems:
            s["error"] = "; ".join(problems)
            s["error_short"] = ("wrk errors" if errs else
                                "unclean stop" if "stop cleanly" in s["error"] else
                                "parity mismatch")
            return s
        s["ok"] = True
        return s
    finally:
        if proc.proc.poll() is None:
            proc.kill()
        s["stderr_tail"] = proc.stderr_tail(600)


# ---- statistics and report ---------------------------------------------------


def cell_stats(samples: List[Dict[str, Any]], key: str = "rps") -> Dict[str, Any]:
    good = [s for s in samples if s.get("ok")]
    st: Dict[str, Any] = {"n": len(samples), "n_ok": len(good),
                          "errors_short": [s.get("error_short", "error")
                                           for s in samples if not s.get("ok")]}
    if good:
        v = [s[key] for s in good]
        st["median"] = statistics.median(v)
        st["min"], st["max"] = min(v), max(v)
        st["cv"] = statistics.stdev(v) / statistics.mean(v) if len(v) > 1 else 0.0
        p99 = [s["lat_p99_us"] for s in good if s.get("lat_p99_us") is not None]
        st["p99_ms"] = statistics.median(p99) / 1000 if p99 else None
    return st


def rotated(items: List[str], k: int) -> List[str]:
    if not items:
        return []
    k %= len(items)
    return items[k:] + items[:k]


def progress(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def run_matrix(title: str, loops: List[str], cells: List[str],
               sample_fn: Callable[[str, str], Dict[str, Any]],
               a: Any) -> Dict[str, Any]:
    """For every cell (route or client scenario): warm-ups then rounds, each
    round running every loop once in a rotated order. Returns
    {cell: {"samples": {loop: [...]}, "warmups": {...}, "stats": {...}}}."""
    res: Dict[str, Any] = {}
    rot = 0
    total = len(cells) * len(loops) * (a.samples + a.warmups)
    done = 0
    for c in cells:
        cr = {"samples": {l: [] for l in loops}, "warmups": {l: [] for l in loops}}
        res[c] = cr
        rounds = [("warm-up", i) for i in range(a.warmups)] + \
                 [("round", i) for i in range(a.samples)]
        for kind, i in rounds:
            order = rotated(loops, rot)
            rot += 1
            for l in order:
                s = sample_fn(l, c)
                s["loop"] = l
                done += 1
                if kind == "warm-up":
                    cr["warmups"][l].append(s)
                    label = "warm-up"
                else:
                    cr["samples"][l].append(s)
                    label = f"round {i + 1}/{a.samples}"
                what = (f"{s['rps']:,.0f} req/s" if s.get("ok")
                        else f"ERROR {s.get('error')}")
                progress(f"[{done}/{total}] {title} {c:<10} {l:<8} {label:<11} {what}")
        cr["stats"] = {l: cell_stats(cr["samples"][l]) for l in loops}
    return res


def _cell(st: Optional[Dict[str, Any]]) -> str:
    if st is None:
        return "-"
    if st["n_ok"] == 0:
        return "**" + (compare.error_text({"errors_short": st["errors_short"]})
                       or "no samples") + "**"
    c = compare.fmt_rate(st["median"])
    if st["n_ok"] < st["n"]:
        c += f" ({st['n_ok']}/{st['n']} ok)"
    return c


def render(report: Dict[str, Any]) -> str:
    loops = report["loops"]
    unavailable = report["unavailable"]
    avail = [l for l in loops if l not in unavailable]
    bases = [b for b in compare.RATIO_BASES if b in loops]
    L: List[str] = [f"# {report['title']} ({report['started']})", ""]
    L.append(report["intro"])
    L.append("")
    for l, why in unavailable.items():
        L.append(f"- **{l}**: {why}")
    notes = list(report.get("notes", []))
    builds: Dict[str, List[str]] = {}
    for section in report["sections"]:
        for cr in section["results"].values():
            for l in cr["samples"]:
                for smp in cr["samples"][l] + cr["warmups"][l]:
                    for who in ("server", "client"):
                        info = smp.get(who) or {}
                        b = info.get("build_id")
                        if b and info.get("loop") == l and b not in builds.setdefault(l, []):
                            builds[l].append(b)
    for l, ids in builds.items():
        odd = sorted({b.split("profile=")[1] for b in ids if "profile=" in b}
                     - {"release", "release-lto", "lto", "bench"})
        if odd:
            notes.append(f"**{l} ran a `{'`, `'.join(odd)}` build**: its numbers say "
                         f"little about a release build.")
        if len(ids) > 1:
            notes.append(f"**{l} was rebuilt during this run**: samples ran {len(ids)} "
                         f"different builds ({'; '.join(ids)}); its numbers mix them, rerun.")
    m = report["provenance"]["machine"]
    ncpu = m.get("cpu_count") or 1
    busy = [x for x in (m.get("loadavg_start"), m.get("loadavg_end")) if x]
    if any(x[0] >= ncpu / 2 for x in busy):
        notes.append(f"load average {busy[0][0]:.2f} at start, {busy[-1][0]:.2f} at end "
                     f"on {ncpu} cores: the machine may have been busy with other work.")
    for note in notes:
        L.append(f"- {note}")
    if unavailable or notes:
        L.append("")
    for section in report["sections"]:
        res = section["results"]
        L.append(f"## {section['heading']}")
        L.append("")
        if section.get("text"):
            L.append(section["text"])
            L.append("")
        head = [section["cell_name"]] + loops + [f"zuvrs/{b}" for b in bases]
        L.append("| " + " | ".join(head) + " |")
        L.append("|---|" + "|".join(["---:"] * (len(head) - 1)) + "|")
        for c, cr in res.items():
            cells = [c]
            for l in loops:
                cells.append("not installed" if l in unavailable else _cell(cr["stats"].get(l)))
            for b in bases:
                cells.append(compare.ratio(cr["stats"].get("zuvrs"), cr["stats"].get(b))
                             if "zuvrs" in avail and b in avail else "n/a")
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
        for c, cr in res.items():
            L.append(f"### {section['cell_name']} {c}")
            L.append("")
            L.append("| loop | median req/s | min | max | CV | p99 latency (ms, median) | samples ok | errors |")
            L.append("|---|---:|---:|---:|---:|---:|---:|---|")
            for l in loops:
                if l in unavailable:
                    L.append(f"| {l} | not installed | | | | | | |")
                    continue
                st = cr["stats"][l]
                err = compare.error_text({"errors_short": st["errors_short"]})
                if st["n_ok"] == 0:
                    L.append(f"| {l} | **{err or 'no samples'}** | | | | | 0/{st['n']} | {err} |")
                    continue
                p99 = "-" if st.get("p99_ms") is None else f"{st['p99_ms']:.2f}"
                L.append(f"| {l} | {compare.fmt_rate(st['median'])} | {compare.fmt_rate(st['min'])} | "
                         f"{compare.fmt_rate(st['max'])} | {st['cv'] * 100:.1f}% | {p99} | "
                         f"{st['n_ok']}/{st['n']} | {err} |")
            L.append("")
    # which server / parser each loop ran
    L.append("## Servers and parsers seen")
    L.append("")
    for line in report.get("servers_seen", []):
        L.append(f"- {line}")
    L.append("")
    errs = []
    for section in report["sections"]:
        for c, cr in section["results"].items():
            for l, samples in cr["samples"].items():
                for i, s in enumerate(samples):
                    if not s.get("ok"):
                        errs.append(f"- {section['cell_name']} {c} / {l} / sample {i + 1}: {s.get('error')}")
            for l, samples in cr["warmups"].items():
                for s in samples:
                    if not s.get("ok"):
                        errs.append(f"- {section['cell_name']} {c} / {l} / warm-up: {s.get('error')}")
    if errs:
        L.append("## Errors")
        L.append("")
        L.extend(errs)
        L.append("")
    L.append("## Provenance")
    L.append("")
    L.append("```")
    p = report["provenance"]
    py = p["python"]
    m = p["machine"]
    L.append(f"date (UTC)     {report['started']}  ({report['duration_s']:.0f} s)")
    L.append(f"command        {' '.join(report['argv'])}")
    L.append(f"python         {py.get('executable')}")
    L.append(f"               {py.get('implementation')} "
             f"{py.get('version', '').splitlines()[0] if py.get('version') else ''}")
    L.append(f"build          debug={py.get('debug_build')} free_threaded={py.get('free_threaded')} "
             f"gil_enabled={py.get('gil_enabled')} dev_mode={py.get('dev_mode')} "
             f"optimize={py.get('optimize')}")
    L.append(f"GC             enabled={py.get('gc_enabled')} threshold={py.get('gc_threshold')} "
             f"(servers and clients run with the defaults)")
    for l in loops:
        pr = p["loops"].get(l, {})
        if not pr.get("available"):
            L.append(f"{l:<14} {pr.get('error', 'not available')}")
            continue
        L.append(f"{l:<14} {pr.get('version')}  ({pr.get('file')})")
        for e in pr.get("extensions", []):
            L.append(f"{'':<14} {os.path.basename(e['file'])}: {e['bytes']:,} bytes, mtime {e['mtime']}")
        if l == "zuvrs":
            L.append(f"{'':<14} build profile: {compare.build_profile(pr) or 'not exposed (unknown)'}")
    for k, v in p["packages"].items():
        L.append(f"{k:<14} {v}")
    r = p["repo"]
    L.append(f"zuvrs repo     {r['path']} commit {r['commit']}, {r['dirty_paths']} changed path(s) "
             f"under src/ python/ Cargo.* pyproject.toml")
    L.append(f"OS             {m.get('os')}; kernel {m.get('kernel')}")
    L.append(f"CPU            {m.get('cpu_model')}; {m.get('cpu_count')} cores; affinity "
             f"{m.get('affinity')}; governor {m.get('governor')}")
    L.append(f"load average   start {m.get('loadavg_start')} end {m.get('loadavg_end')}")
    for k, v in report["config"].items():
        L.append(f"{k:<14} {v}")
    L.append("```")
    L.append("")
    L.append("Stock asyncio is the control: if its numbers are far from their usual "
             "values on this machine, distrust the whole run. `~` marks a ratio whose "
             "two min..max ranges overlap (a tie); `*` a ratio over a cell with failed "
             "samples.")
    return "\n".join(L) + "\n"


def provenance(python: str, loops: List[str], packages: List[str]) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """(provenance dict, {loop: why unavailable})."""
    loop_info: Dict[str, Any] = {}
    unavailable: Dict[str, str] = {}
    for l in loops:
        info = compare.probe_loop(python, l)
        loop_info[l] = info
        if not info.get("available"):
            why = info.get("error", "not available")
            unavailable[l] = "not installed" if why.endswith("not installed") else why
    pk = {name: dist_version(name) or "not installed" for name in packages}
    pk["wrk"] = wrk_version() or "not installed"
    pk["taskset"] = shutil.which("taskset") or "not found (CPUs not pinned)"
    prov = {"python": compare.probe_env(python), "loops": loop_info,
            "repo": compare.repo_info(), "machine": compare.machine_info(),
            "packages": pk}
    return prov, unavailable


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def add_common_args(ap: Any) -> None:
    ap.add_argument("--loops", default=",".join(workloads.HTTP_LOOP_NAMES),
                    help="comma-separated (default: %(default)s)")
    ap.add_argument("--samples", type=int, default=5,
                    help="measured samples per loop and cell (default 5)")
    ap.add_argument("--warmups", type=int, default=1,
                    help="warm-up samples per loop and cell, not counted (default 1)")
    ap.add_argument("--duration", type=float, default=5.0,
                    help="seconds of load per sample (default 5; wrk rounds to whole seconds)")
    ap.add_argument("--connections", type=int, default=64,
                    help="wrk connections (default 64)")
    ap.add_argument("--threads", type=int, default=1, help="wrk threads (default 1)")
    ap.add_argument("--server-cpu", default="0", help="CPU for the server (default 0)")
    ap.add_argument("--client-cpu", default="1",
                    help="CPU for wrk / the client (default 1)")
    ap.add_argument("--start-timeout", type=float, default=30.0)
    ap.add_argument("--stop-timeout", type=float, default=10.0)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--markdown", metavar="PATH")


def finish(report: Dict[str, Any], a: Any) -> int:
    try:
        report["provenance"]["machine"]["loadavg_end"] = list(os.getloadavg())
    except OSError:
        pass
    md = render(report)
    sys.stdout.write(md)
    sys.stdout.flush()
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, default=repr)
    cleanup()
    return 0
