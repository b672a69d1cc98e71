#!/usr/bin/env python3
"""aiohttp server (loaded by wrk) and aiohttp client, on each event loop.

Usage (from the repository root)::

    python3 benchmarks/aiohttp_bench.py                        # server and client
    python3 benchmarks/aiohttp_bench.py --mode server --samples 3 --duration 3
    python3 benchmarks/aiohttp_bench.py --mode client --client-server-loop uvloop
    python3 benchmarks/aiohttp_bench.py --mode client-uvicorn   # 8,000 GETs vs uvicorn
    python3 benchmarks/aiohttp_bench.py --mode client-uvicorn --requests 800 --samples 1

Needs aiohttp (``pip install aiohttp``), ``wrk`` (``apt-get install -y
wrk``) and ``taskset``.

Server benchmark: each sample is a fresh ``aiohttp.web`` server process
(``AppRunner`` + ``TCPSite``, no access log) on a loop made by the loop's
own ``new_event_loop``, pinned to CPU 0, with the same two routes as
uvicorn_bench.py: ``/`` (13-byte plaintext) and ``/10k`` (10 KiB body);
``wrk -t1 -c64`` pinned to CPU 1 loads one route for ``--duration``
seconds. The checks that make a sample count are described in
``benchmarks/_httpbench.py``. Which HTTP request parser the server uses is
printed: aiohttp's C parser (``aiohttp.http_parser.HttpRequestParser is
HttpRequestParserC``) or the pure-Python one.

Client benchmark: each sample is a fresh aiohttp server process on a fixed
loop (``--client-server-loop``, default uvloop; the same for every
contender) pinned to CPU 0, and a fresh client process on the loop under
test pinned to CPU 1: one ``aiohttp.ClientSession`` (``TCPConnector(limit=
concurrency)``), ``--concurrency`` tasks (default 32) each doing GET + read
in a loop for ``--duration`` seconds after a 1 s warm-up, every body
compared with the expected bytes; requests/s counted on the client. The
server's request count must equal the client's (warm-up included).

Client benchmark against uvicorn (``--mode client-uvicorn``): each sample
is a fresh uvicorn + httptools server (uvicorn_bench.py's, on
``--client-server-loop``, default uvloop, the same for every contender)
pinned with os.sched_setaffinity to CPU 0, and a fresh client process on
the loop under test pinned the same way to CPU 1: after an untimed warm-up
(16 GETs in a session of their own), one ``aiohttp.ClientSession``
(``TCPConnector(limit=16)``, keep-alive) makes ``--requests`` GETs
(default 8,000), 16 at a time (``--concurrency``), every status and body
checked; the time runs from the session's creation to its close. The
server's request count must equal the client's, and the timed session may
open at most 16 connections (keep-alive kept). Route ``plaintext`` by
default (``--routes`` for others).

Loops are interleaved, their order rotated every round; one warm-up sample
per loop and cell is not counted. Output (stdout, markdown): median
requests/s, ratios zuvrs/uvloop, zuvrs/asyncio, zuvrs/rloop, per cell
median / min / max / CV, errors, the parser each server reported,
provenance. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from typing import Any, Dict, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _httpbench as hb  # noqa: E402
import workloads  # noqa: E402

CLIENT = "@@HTTPBENCH-CLIENT@@ "
CLIENT_WARMUP_S = 1.0


def parser_info() -> Dict[str, Any]:
    import aiohttp.http_parser as hp
    cls = hp.HttpRequestParser
    c_cls = getattr(hp, "HttpRequestParserC", None)
    is_c = c_cls is not None and cls is c_cls
    return {
        "http_parser": f"{cls.__module__}.{cls.__qualname__}",
        "parser": "C extension (HttpRequestParserC)" if is_c else "pure Python",
        "no_extensions_env": os.environ.get("AIOHTTP_NO_EXTENSIONS"),
    }


# ---- the server process -----------------------------------------------------


def serve(loop_name: str) -> int:
    import aiohttp
    from aiohttp import web

    served = {path: 0 for path in hb.PATH_BODY}

    def handler(path: str, body: bytes):  # type: ignore[no-untyped-def]
        async def h(request: Any) -> Any:
            served[path] += 1
            return web.Response(body=body, content_type="text/plain")
        return h

    app = web.Application()
    for path, body in hb.PATH_BODY.items():
        app.router.add_get(path, handler(path, body))

    factory = workloads.get_loop_factory(loop_name)
    loop = factory()
    asyncio.set_event_loop(loop)

    async def main() -> None:
        stop = asyncio.Event()
        hb.watch_stdin(lambda: loop.call_soon_threadsafe(stop.set))
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, hb.HOST, 0)
        await site.start()
        port = runner.addresses[0][1]
        info = {"port": port, "pid": os.getpid(),
                "loop_type": workloads._loop_type(loop),
                "aiohttp": aiohttp.__version__, "affinity": hb.pin_self(None),
                "loop": loop_name, "build_id": hb.build_id(loop_name)}
        info.update(parser_info())
        hb.emit(hb.READY, info)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    try:
        loop.run_until_complete(main())
    finally:
        hb.emit(hb.STOPPED, {"served": served})
        loop.close()
    return 0


# ---- the client process -------------------------------------------------------


def client_run(loop_name: str, port: int, path: str, duration: float,
               concurrency: int) -> int:
    import aiohttp

    expected = hb.PATH_BODY[path]
    url = f"http://{hb.HOST}:{port}{path}"
    out: Dict[str, Any] = {"loop": loop_name, "pid": os.getpid(),
                           "affinity": hb.pin_self(None)}
    try:
        factory = workloads.get_loop_factory(loop_name)
    except workloads.LoopUnavailable as exc:
        out["error"] = str(exc)
        hb.emit(CLIENT, out)
        return 2
    loop = factory()
    asyncio.set_event_loop(loop)
    out["loop_type"] = workloads._loop_type(loop)
    out["build_id"] = hb.build_id(loop_name)
    counts = {"ok": 0, "bad": 0, "errors": 0}
    totals = {"requests": 0}

    async def worker(session: Any, deadline: float) -> None:
        t = loop.time
        while t() < deadline:
            totals["requests"] += 1
            try:
                async with session.get(url) as r:
                    body = await r.read()
                    status = r.status
                if status == 200 and body == expected:
                    counts["ok"] += 1
                else:
                    counts["bad"] += 1
                    out.setdefault("first_bad", f"status {status}, {len(body)} bytes")
            except Exception as exc:
                counts["errors"] += 1
                out.setdefault("first_error", repr(exc)[:300])

    async def main() -> None:
        conn = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=conn) as session:
            d = loop.time() + CLIENT_WARMUP_S
            await asyncio.gather(*[worker(session, d) for _ in range(concurrency)])
            out["warmup"] = dict(counts)
            for k in counts:
                counts[k] = 0
            t0 = time.perf_counter()
            d = loop.time() + duration
            await asyncio.gather(*[worker(session, d) for _ in range(concurrency)])
            out["elapsed"] = time.perf_counter() - t0

    try:
        loop.run_until_complete(main())
    except BaseException as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        loop.close()
    out.update(counts)
    out["total_requests"] = totals["requests"]
    hb.emit(CLIENT, out)
    return 0


def client_count_run(loop_name: str, port: int, path: str, requests: int,
                     concurrency: int, cpu: Optional[str]) -> int:
    """The client of ``--mode client-uvicorn``: pinned with
    os.sched_setaffinity, one untimed warm-up round (``concurrency`` GETs
    through a session of its own), then the timed part: one ClientSession
    (TCPConnector(limit=concurrency), keep-alive), ``requests`` GETs made
    by ``concurrency`` tasks, every status and body checked; the time runs
    from the session's creation to its close. Connections opened by the
    timed session are counted (a TraceConfig): with keep-alive, at most
    ``concurrency``."""
    import aiohttp

    out: Dict[str, Any] = {"loop": loop_name, "pid": os.getpid(),
                           "affinity": hb.pin_self(cpu)}
    expected = hb.PATH_BODY[path]
    url = f"http://{hb.HOST}:{port}{path}"
    try:
        factory = workloads.get_loop_factory(loop_name)
    except workloads.LoopUnavailable as exc:
        out["error"] = str(exc)
        hb.emit(CLIENT, out)
        return 2
    loop = factory()
    asyncio.set_event_loop(loop)
    out["loop_type"] = workloads._loop_type(loop)
    out["build_id"] = hb.build_id(loop_name)
    counts = {"ok": 0, "bad": 0, "errors": 0, "requests": 0}
    created = [0]

    async def on_created(session: Any, ctx: Any, params: Any) -> None:
        created[0] += 1

    async def run(session: Any, n: int) -> None:
        left = [n]

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                counts["requests"] += 1
                try:
                    async with session.get(url) as r:
                        body = await r.read()
                        status = r.status
                    if status == 200 and body == expected:
                        counts["ok"] += 1
                    else:
                        counts["bad"] += 1
                        out.setdefault("first_bad", f"status {status}, {len(body)} bytes")
                except Exception as exc:
                    counts["errors"] += 1
                    out.setdefault("first_error", repr(exc)[:300])

        await asyncio.gather(*[worker() for _ in range(concurrency)])

    async def main() -> None:
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=concurrency)) as session:
            await run(session, concurrency)  # warm-up, untimed
        out["warmup"] = dict(counts)
        for k in counts:
            counts[k] = 0
        trace = aiohttp.TraceConfig()
        trace.on_connection_create_end.append(on_created)
        t0 = time.perf_counter()
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=concurrency),
                trace_configs=[trace]) as session:
            await run(session, requests)
        out["elapsed"] = time.perf_counter() - t0

    try:
        loop.run_until_complete(main())
    except BaseException as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        loop.close()
    out.update({k: counts[k] for k in ("ok", "bad", "errors")})
    out["total_requests"] = counts["requests"] + out.get("warmup", {}).get("requests", 0)
    out["connections"] = created[0]
    hb.emit(CLIENT, out)
    return 0


def uvicorn_client_sample(a: Any, loop_name: str, route: str) -> Dict[str, Any]:
    """One sample of ``--mode client-uvicorn``: a fresh uvicorn + httptools
    server on uvloop (uvicorn_bench.py's server) pinned with
    os.sched_setaffinity to --server-cpu, checked with one request, and a
    fresh client process (client_count_run) on the loop under test pinned
    to --client-cpu; the server's request count must equal the client's."""
    path, _ = hb.ROUTES[route]
    s: Dict[str, Any] = {"ok": False, "route": route}
    server = hb.Proc([a.python, os.path.join(HERE, "uvicorn_bench.py"), "--serve",
                      a.client_server_loop, "--pin", a.server_cpu], None)
    try:
        ready = server.wait_marker(hb.READY, a.start_timeout)
        if ready is None:
            s["error"], s["error_short"] = (f"server (uvicorn on {a.client_server_loop}) did "
                                            f"not start: {server.stderr_tail(300)}"), "no server"
            return s
        s["server"] = ready
        port = int(ready["port"])
        size, why = hb.check_route(port, path)
        if size is None:
            s["error"], s["error_short"] = why, "wrong response"
            return s
        cmd = [a.python, os.path.abspath(__file__), "--client-count", loop_name,
               "--port", str(port), "--path", path, "--requests", str(a.requests),
               "--concurrency", str(a.concurrency), "--pin", a.client_cpu]
        client = hb.Proc(cmd, None)
        res = client.wait_marker(CLIENT, a.client_timeout)
        if res is None:
            client.kill()
            rc = client.proc.poll()
            s["error"] = (f"client gave no result ({hb.rc_text(rc)}): "
                          f"{client.stderr_tail(300)}")
            s["error_short"] = ("timeout" if rc is None or rc == -9
                                else "crash " + hb.rc_text(rc))
            return s
        try:
            client.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            client.kill()
        s["client"] = res
        if res.get("error"):
            s["error"] = f"client: {res['error']}"
            s["error_short"] = "exception " + res["error"].split(":")[0]
            return s
        if client.proc.returncode not in (0, None):
            s["error"] = f"client exited with {hb.rc_text(client.proc.returncode)}"
            s["error_short"] = "crash"
            return s
        problems = []
        if res["ok"] != a.requests or res["bad"] or res["errors"]:
            problems.append(f"{res['ok']} of {a.requests} responses right, {res['bad']} wrong, "
                            f"{res['errors']} errors ({res.get('first_bad') or res.get('first_error')})")
        if res["connections"] > a.concurrency:
            problems.append(f"the session opened {res['connections']} connections for "
                            f"{a.concurrency} concurrent requests (keep-alive lost)")
        st = server.stop(a.stop_timeout)
        served = ((st.get("stopped") or {}).get("served") or {}).get(path)
        if served is None:
            problems.append("server reported no request count")
        elif served - 1 != res["total_requests"]:  # 1 = check_route
            problems.append(f"server served {served - 1} client requests, "
                            f"the client made {res['total_requests']}")
        s["rps"] = res["ok"] / res["elapsed"] if res.get("elapsed") else 0.0
        s["lat_p99_us"] = None
        if problems:
            s["error"] = "; ".join(problems)
            s["error_short"] = "parity mismatch"
            return s
        s["ok"] = True
        return s
    finally:
        if server.proc.poll() is None:
            server.kill()


def client_sample(a: Any, loop_name: str, route: str) -> Dict[str, Any]:
    path, _ = hb.ROUTES[route]
    s: Dict[str, Any] = {"ok": False, "route": route}
    server = hb.Proc([a.python, os.path.abspath(__file__), "--serve",
                      a.client_server_loop], a.server_cpu)
    try:
        ready = server.wait_marker(hb.READY, a.start_timeout)
        if ready is None:
            s["error"], s["error_short"] = (f"server ({a.client_server_loop}) did not start: "
                                            f"{server.stderr_tail(300)}"), "no server"
            return s
        s["server"] = ready
        port = int(ready["port"])
        size, why = hb.check_route(port, path)
        if size is None:
            s["error"], s["error_short"] = why, "wrong response"
            return s
        cmd = [a.python, os.path.abspath(__file__), "--client-run", loop_name,
               "--port", str(port), "--path", path, "--duration", str(a.duration),
               "--concurrency", str(a.concurrency)]
        client = hb.Proc(cmd, a.client_cpu)
        res = client.wait_marker(CLIENT, a.duration + CLIENT_WARMUP_S + 60)
        if res is None:
            client.kill()
            rc = client.proc.poll()
            s["error"] = (f"client gave no result ({hb.rc_text(rc)}): "
                          f"{client.stderr_tail(300)}")
            s["error_short"] = ("timeout" if rc is None or rc == -9
                                else "crash " + hb.rc_text(rc))
            return s
        try:
            client.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            client.kill()
        s["client"] = res
        if res.get("error"):
            s["error"] = f"client: {res['error']}"
            s["error_short"] = "exception " + res["error"].split(":")[0]
            return s
        if client.proc.returncode not in (0, None):
            s["error"] = f"client exited with {hb.rc_text(client.proc.returncode)}"
            s["error_short"] = "crash"
            return s
        problems = []
        if res["bad"] or res["errors"]:
            problems.append(f"{res['bad']} wrong responses, {res['errors']} errors "
                            f"({res.get('first_bad') or res.get('first_error')})")
        if not res["ok"]:
            problems.append("no request completed")
        st = server.stop(a.stop_timeout)
        served = ((st.get("stopped") or {}).get("served") or {}).get(path)
        if served is None:
            problems.append("server reported no request count")
        elif served - 1 != res["total_requests"]:  # 1 = check_route
            problems.append(f"server served {served - 1} client requests, "
                            f"the client made {res['total_requests']}")
        s["rps"] = res["ok"] / res["elapsed"] if res.get("elapsed") else 0.0
        s["lat_p99_us"] = None
        if problems:
            s["error"] = "; ".join(problems)
            s["error_short"] = "parity mismatch"
            return s
        s["ok"] = True
        return s
    finally:
        if server.proc.poll() is None:
            server.kill()


# ---- the driver ------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="aiohttp server (wrk) and client on each loop "
                    "(fresh processes per sample).",
        epilog="See the module docstring for details.")
    ap.add_argument("--serve", metavar="LOOP", help=argparse.SUPPRESS)
    ap.add_argument("--client-run", metavar="LOOP", help=argparse.SUPPRESS)
    ap.add_argument("--client-count", metavar="LOOP", help=argparse.SUPPRESS)
    ap.add_argument("--pin", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="server,client",
                    help="comma-separated: server, client, client-uvicorn "
                         "(default: %(default)s)")
    ap.add_argument("--routes", default=None,
                    help="comma-separated (default: plaintext,body10k; "
                         "client-uvicorn alone: plaintext)")
    ap.add_argument("--concurrency", type=int, default=None,
                    help="client benchmarks: concurrent requests (default 32; "
                         "client-uvicorn: 16)")
    ap.add_argument("--requests", type=int, default=8000,
                    help="client-uvicorn: GETs per sample (default 8000)")
    ap.add_argument("--client-timeout", type=float, default=120.0,
                    help="client-uvicorn: seconds before a client is killed (default 120)")
    ap.add_argument("--client-server-loop", default="uvloop",
                    help="client benchmark: the loop of the server being hammered, "
                         "the same for every contender (default uvloop)")
    hb.add_common_args(ap)
    a = ap.parse_args(argv)
    if a.serve:
        return serve(a.serve)
    if a.client_run:
        return client_run(a.client_run, a.port, a.path, a.duration, a.concurrency or 32)
    if a.client_count:
        return client_count_run(a.client_count, a.port, a.path, a.requests,
                                a.concurrency or 16, a.pin)

    loops = [x.strip() for x in a.loops.split(",") if x.strip()]
    modes = [x.strip() for x in a.mode.split(",") if x.strip()]
    if a.routes is None:
        a.routes = "plaintext" if modes == ["client-uvicorn"] else ",".join(hb.ROUTES)
    routes = [x.strip() for x in a.routes.split(",") if x.strip()]
    for r in routes:
        if r not in hb.ROUTES:
            ap.error(f"unknown route {r!r}; known: {', '.join(hb.ROUTES)}")
    if not modes or not set(modes) <= {"server", "client", "client-uvicorn"}:
        ap.error("--mode: comma-separated server, client, client-uvicorn")
    if hb.dist_version("aiohttp") is None:
        ap.error("aiohttp not installed (pip install aiohttp)")
    if "client-uvicorn" in modes:
        missing = [m for m in ("uvicorn", "httptools") if hb.dist_version(m) is None]
        if missing:
            ap.error(f"client-uvicorn: not installed: {', '.join(missing)}")
    conc_default = a.concurrency
    if "server" in modes and not hb.wrk_path():
        ap.error("wrk not found (apt-get install -y wrk)")

    started = hb.now_utc()
    t0 = time.perf_counter()
    prov, unavailable = hb.provenance(a.python, loops, ["aiohttp"])
    avail = [l for l in loops if l not in unavailable]
    if "client" in modes or "client-uvicorn" in modes:
        try:
            workloads.get_loop_factory(a.client_server_loop)
        except workloads.LoopUnavailable:
            hb.progress(f"{a.client_server_loop} not available: the client "
                        f"benchmarks' server runs on asyncio")
            a.client_server_loop = "asyncio"
    sections = []
    seen = set()

    def note_servers(res: Dict[str, Any], what: str) -> None:
        for cr in res.values():
            for l, samples in cr["samples"].items():
                for s in samples + cr["warmups"][l]:
                    srv = s.get("server")
                    if srv:
                        seen.add(f"{what} ({'loop under test ' + l if what == 'server' else 'fixed'}): "
                                 f"loop {srv.get('loop_type')}, aiohttp {srv.get('aiohttp')}, "
                                 f"request parser {srv.get('http_parser')} = **{srv.get('parser')}**"
                                 f", server affinity {srv.get('affinity')}")
                    cl = s.get("client")
                    if cl and cl.get("loop_type"):
                        seen.add(f"client: loop {cl['loop_type']}, affinity {cl.get('affinity')}")

    if "server" in modes:
        hb.progress(f"aiohttp server: loops {avail}, routes {routes}, {a.samples} samples "
                    f"x {a.duration:g} s, wrk -t{a.threads} -c{a.connections}")

        def srv_sample(loop_name: str, route: str):  # type: ignore[no-untyped-def]
            return hb.server_sample([a.python, os.path.abspath(__file__), "--serve",
                                     loop_name], route, a)

        res = hb.run_matrix("aiohttp-server", avail, routes, srv_sample, a)
        note_servers(res, "server")
        sections.append({
            "heading": "aiohttp server, loaded by wrk: median requests/s",
            "cell_name": "route",
            "text": (f"The server runs on the loop under test (CPU {a.server_cpu}); "
                     f"`wrk -t{a.threads} -c{a.connections}` on CPU {a.client_cpu}. "
                     f"Routes: `plaintext` = GET / (13 bytes), `body10k` = GET /10k "
                     f"(10,240 bytes)."),
            "results": res})
    if "client" in modes:
        a.concurrency = conc_default or 32
        hb.progress(f"aiohttp client: loops {avail}, routes {routes}, server on "
                    f"{a.client_server_loop}, concurrency {a.concurrency}")
        res = hb.run_matrix("aiohttp-client", avail, routes,
                            lambda l, r: client_sample(a, l, r), a)
        note_servers(res, "client benchmark server")
        sections.append({
            "heading": "aiohttp client (ClientSession): median requests/s",
            "cell_name": "route",
            "text": (f"The client runs on the loop under test (CPU {a.client_cpu}), "
                     f"{a.concurrency} concurrent GETs through one ClientSession, every "
                     f"body checked; the server is aiohttp on **{a.client_server_loop}** "
                     f"for every contender (CPU {a.server_cpu}). p99 latency is not "
                     f"measured here."),
            "results": res})
    if "client-uvicorn" in modes:
        a.concurrency = conc_default or 16
        hb.progress(f"aiohttp client vs uvicorn: loops {avail}, routes {routes}, uvicorn + "
                    f"httptools on {a.client_server_loop} (CPU {a.server_cpu}), "
                    f"{a.requests} GETs, concurrency {a.concurrency} (CPU {a.client_cpu})")
        res = hb.run_matrix("aiohttp-client-uvicorn", avail, routes,
                            lambda l, r: uvicorn_client_sample(a, l, r), a)
        for cr in res.values():
            for l, samples in cr["samples"].items():
                for smp in samples + cr["warmups"][l]:
                    srv = smp.get("server")
                    if srv:
                        seen.add(f"client-uvicorn server (fixed): uvicorn {srv.get('uvicorn')} on "
                                 f"loop {srv.get('loop_type')}, parser **{srv.get('parser')}**, "
                                 f"affinity {srv.get('affinity')}")
                    cl = smp.get("client")
                    if cl and cl.get("loop_type"):
                        seen.add(f"client-uvicorn client: loop {cl['loop_type']}, affinity "
                                 f"{cl.get('affinity')}, connections opened "
                                 f"{cl.get('connections')}")
        sections.append({
            "heading": "aiohttp client (ClientSession) against uvicorn: median requests/s",
            "cell_name": "route",
            "text": (f"The client runs on the loop under test in its own process (pinned "
                     f"with os.sched_setaffinity to CPU {a.client_cpu}): one ClientSession, "
                     f"keep-alive (TCPConnector(limit={a.concurrency})), {a.requests:,} GETs "
                     f"made by {a.concurrency} tasks, every status and body checked, after an "
                     f"untimed warm-up of {a.concurrency} GETs in a session of its own; the "
                     f"time runs from the session's creation to its close. The server is "
                     f"uvicorn + httptools on **{a.client_server_loop}** for every contender "
                     f"(uvicorn_bench.py's server, its own process pinned to CPU "
                     f"{a.server_cpu}); its request count must equal the client's, and the "
                     f"timed session may open at most {a.concurrency} connections. p99 "
                     f"latency is not measured here."),
            "results": res})

    report = {
        "title": "aiohttp benchmark",
        "intro": (f"aiohttp {prov['packages'].get('aiohttp')}; every sample uses fresh "
                  f"server (and client) processes pinned with taskset; {a.samples} samples "
                  f"per loop and cell, {a.warmups} warm-up sample(s) not counted, loop "
                  f"order rotated every round, {a.duration:g} s of load per sample, GC on. "
                  f"Requests per second, higher is better."),
        "notes": [],
        "started": started,
        "argv": [os.path.relpath(sys.argv[0], os.path.dirname(HERE))]
        + (argv if argv is not None else sys.argv[1:]),
        "loops": loops,
        "unavailable": unavailable,
        "sections": sections,
        "servers_seen": sorted(seen),
        "provenance": prov,
        "config": {"samples": a.samples, "warmups": a.warmups,
                   "duration": f"{a.duration:g} s", "wrk": f"-t{a.threads} -c{a.connections}",
                   "server cpu": a.server_cpu, "client cpu": a.client_cpu,
                   "client conc.": (f"{conc_default or 32} (client)"
                                    + (f", {conc_default or 16} (client-uvicorn)"
                                       if "client-uvicorn" in modes else "")),
                   "requests": (f"{a.requests} per client-uvicorn sample"
                                if "client-uvicorn" in modes else "n/a"),
                   "client server": a.client_server_loop, "routes": ", ".join(routes),
                   "modes": ", ".join(modes)},
    }
    report["duration_s"] = time.perf_counter() - t0
    return hb.finish(report, a)


if __name__ == "__main__":
    sys.exit(main())
