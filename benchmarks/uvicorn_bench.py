#!/usr/bin/env python3
"""uvicorn (httptools) on each event loop, loaded by wrk.

Usage (from the repository root)::

    python3 benchmarks/uvicorn_bench.py                      # 5 samples x 5 s
    python3 benchmarks/uvicorn_bench.py --samples 3 --duration 3
    python3 benchmarks/uvicorn_bench.py --loops uvloop,zuvrs --routes plaintext
    python3 benchmarks/uvicorn_bench.py --http h11           # diagnostic only
    python3 benchmarks/uvicorn_bench.py --ssl                # https, wrk https://

Needs uvicorn and httptools (``pip install uvicorn httptools``), ``wrk``
(``apt-get install -y wrk``) and ``taskset``.

Each sample is a fresh server process: a plain ASGI app (no framework)
with two routes, ``/`` (13-byte plaintext) and ``/10k`` (10 KiB body),
served by ``uvicorn.Server(uvicorn.Config(app, loop="none",
http="httptools", lifespan="off", access_log=False))`` whose ``serve()``
runs on a loop made by the loop's own ``new_event_loop`` (so every loop is
created the same way, whatever uvicorn's --loop knows), pinned to CPU 0;
``wrk -t1 -c64`` pinned to CPU 1 loads one route for ``--duration``
seconds. Loops are interleaved, their order rotated every round, one
warm-up sample per loop and route is not counted. The checks that make a
sample count (wrk errors, bytes per response, the server's own request
count, the route after the load, a clean stop) are described in
``benchmarks/_httpbench.py``.

Output (stdout, markdown): median requests/s per loop and route, ratios
zuvrs/uvloop, zuvrs/asyncio, zuvrs/rloop from medians, per route median /
min / max / CV and median p99 latency, the HTTP parser every server
reported (httptools or h11), errors, provenance. Progress goes to stderr.

``--ssl``: the same over https. The driver makes one certificate (EC P-256,
a CA and a server certificate for localhost / 127.0.0.1, with
``cryptography``; workloads.tls_material) and every server gets it through
uvicorn's ``ssl_certfile`` / ``ssl_keyfile`` (uvicorn's default TLS
context); wrk loads ``https://127.0.0.1:<port>/...`` (Debian's wrk is built
with OpenSSL; it does not verify the certificate). The route checks before
and after the load are TLS 1.3 connections that verify the chain and the
host name. Each server counts its connections by TLS path (zuvrs:
``native`` or ``sslproto: <why>``; others: the transport class) and TLS
version, reported under "Servers and parsers seen".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _httpbench as hb  # noqa: E402
import workloads  # noqa: E402

# ---- the server process ---------------------------------------------------


def serve(loop_name: str, http: str, certfile: Optional[str] = None,
          keyfile: Optional[str] = None, cpu: Optional[str] = None) -> int:
    import uvicorn

    affinity = hb.pin_self(cpu)  # os.sched_setaffinity (aiohttp_bench's client mode)

    served = {path: 0 for path in hb.PATH_BODY}
    responses = {}
    for path, body in hb.PATH_BODY.items():
        responses[path] = (
            {"type": "http.response.start", "status": 200,
             "headers": [(b"content-type", b"text/plain"),
                         (b"content-length", str(len(body)).encode())]},
            {"type": "http.response.body", "body": body},
        )
    not_found = (
        {"type": "http.response.start", "status": 404,
         "headers": [(b"content-length", b"0")]},
        {"type": "http.response.body", "body": b""},
    )

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        path = scope["path"]
        r = responses.get(path)
        if r is None:
            r = not_found
        else:
            served[path] += 1
        await send(r[0])
        await send(r[1])

    factory = workloads.get_loop_factory(loop_name)
    config = uvicorn.Config(app, host=hb.HOST, port=0, loop="none", http=http,
                            lifespan="off", access_log=False,
                            log_level="warning", interface="asgi3",
                            ssl_certfile=certfile, ssl_keyfile=keyfile)
    server = uvicorn.Server(config)
    tls_paths: Dict[str, int] = {}
    if certfile:
        # which TLS path (zuvrs: native or sslproto) and version each
        # connection took: counted in connection_made, once per connection
        config.load()
        base = config.http_protocol_class

        class Counting(base):  # type: ignore[misc, valid-type]
            def connection_made(self, transport: Any) -> None:
                obj = transport.get_extra_info("ssl_object")
                key = (f"{workloads.tls_path(transport)} "
                       f"{obj.version() if obj is not None else 'no TLS'}")
                tls_paths[key] = tls_paths.get(key, 0) + 1
                super().connection_made(transport)

        config.http_protocol_class = Counting
    loop = factory()
    asyncio.set_event_loop(loop)

    def on_stop() -> None:
        server.should_exit = True  # uvicorn's main loop looks every 0.1 s

    hb.watch_stdin(on_stop)

    async def main() -> None:
        task = asyncio.ensure_future(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            cls = config.http_protocol_class
            if tls_paths is not None and certfile:
                cls = cls.__mro__[1]  # the counting subclass's base
            qual = f"{cls.__module__}.{cls.__qualname__}"
            parser = ("httptools" if "httptools" in cls.__module__ else
                      "h11" if "h11" in cls.__module__ else qual)
            if parser == "httptools":
                import httptools.parser.parser as hp
                parser += (" (C extension)" if hp.__file__.endswith((".so", ".pyd"))
                           else f" ({hp.__file__})")
            hb.emit(hb.READY, {
                "port": server.servers[0].sockets[0].getsockname()[1],
                "pid": os.getpid(),
                "loop_type": workloads._loop_type(loop),
                "http_protocol": qual,
                "parser": parser,
                "uvicorn": uvicorn.__version__,
                "loop": loop_name,
                "build_id": hb.build_id(loop_name),
                "affinity": affinity,
                "tls": bool(certfile),
            })
        await task

    try:
        loop.run_until_complete(main())
    finally:
        stopped: Dict[str, Any] = {"served": served}
        if certfile:
            stopped["tls_paths"] = tls_paths
        hb.emit(hb.STOPPED, stopped)
        loop.close()
    return 0


# ---- the driver -----------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="uvicorn (httptools) on each loop, loaded by wrk "
                    "(fresh server process per sample).",
        epilog="See the module docstring for details.")
    ap.add_argument("--serve", metavar="LOOP", help=argparse.SUPPRESS)
    ap.add_argument("--routes", default=",".join(hb.ROUTES),
                    help="comma-separated (default: %(default)s)")
    ap.add_argument("--http", default="httptools", choices=("httptools", "h11"),
                    help="uvicorn's HTTP implementation (default httptools; "
                         "h11 is a diagnostic, not a headline)")
    ap.add_argument("--ssl", action="store_true",
                    help="serve https (uvicorn's ssl_certfile / ssl_keyfile, a "
                         "certificate made at start) and load it with wrk https://")
    ap.add_argument("--ssl-certfile", help=argparse.SUPPRESS)
    ap.add_argument("--ssl-keyfile", help=argparse.SUPPRESS)
    ap.add_argument("--pin", help=argparse.SUPPRESS)  # serve: sched_setaffinity
    hb.add_common_args(ap)
    a = ap.parse_args(argv)
    if a.serve:
        return serve(a.serve, a.http, a.ssl_certfile, a.ssl_keyfile, a.pin)

    loops = [x.strip() for x in a.loops.split(",") if x.strip()]
    routes = [x.strip() for x in a.routes.split(",") if x.strip()]
    for r in routes:
        if r not in hb.ROUTES:
            ap.error(f"unknown route {r!r}; known: {', '.join(hb.ROUTES)}")
    missing = [m for m in ("uvicorn", "httptools") if hb.dist_version(m) is None]
    if missing:
        ap.error(f"not installed: {', '.join(missing)} (pip install {' '.join(missing)})")
    if not hb.wrk_path():
        ap.error("wrk not found (apt-get install -y wrk)")

    started = hb.now_utc()
    t0 = time.perf_counter()
    prov, unavailable = hb.provenance(a.python, loops,
                                      ["uvicorn", "httptools", "h11"])
    avail = [l for l in loops if l not in unavailable]
    hb.progress(f"uvicorn_bench: loops {avail}, routes {routes}, {a.samples} samples x "
                f"{a.duration:g} s, wrk -t{a.threads} -c{a.connections}, server CPU "
                f"{a.server_cpu}, wrk CPU {a.client_cpu}")

    ssl_args: List[str] = []
    if a.ssl:
        # one certificate for the run, made before any sample (the driver
        # removes it at exit); the route checks verify it, wrk does not
        files = workloads.tls_material()
        ssl_args = ["--ssl-certfile", files["cert"], "--ssl-keyfile", files["key"]]
        a.tls_client_context = workloads.tls_contexts()[1]

    def sample(loop_name: str, route: str):  # type: ignore[no-untyped-def]
        return hb.server_sample([a.python, os.path.abspath(__file__), "--serve",
                                 loop_name, "--http", a.http] + ssl_args, route, a)

    res = hb.run_matrix("uvicorn-https" if a.ssl else "uvicorn", avail, routes, sample, a)
    seen = set()
    for cr in res.values():
        for l, samples in cr["samples"].items():
            tls_seen: Dict[str, int] = {}
            for s in samples + cr["warmups"][l]:
                srv = s.get("server")
                if srv:
                    seen.add(f"{l}: loop {srv.get('loop_type')}, uvicorn {srv.get('uvicorn')}, "
                             f"HTTP protocol {srv.get('http_protocol')}, parser "
                             f"**{srv.get('parser')}**, server affinity {srv.get('affinity')}")
                for k, v in (s.get("tls_paths") or {}).items():
                    tls_seen[k] = tls_seen.get(k, 0) + v
                if s.get("tls"):
                    tls_seen.setdefault(f"(route check: {s['tls']})", 0)
            if a.ssl:
                seen.add(f"{l}: TLS connections by path and version (server side, all "
                         f"samples of the route): " + (", ".join(
                             f"{k} x{v}" if v else k for k, v in sorted(tls_seen.items()))
                             or "none reported"))
    notes = []
    if a.http != "httptools":
        notes.append(f"**uvicorn http={a.http}: DIAGNOSTIC run, not a headline**")
    if a.ssl:
        notes.append(f"https: uvicorn's ssl_certfile / ssl_keyfile (EC P-256 certificate for "
                     f"localhost / 127.0.0.1 made at start; uvicorn's default context), "
                     f"`wrk https://` (wrk's OpenSSL, no verification); the route checks "
                     f"verify the chain and host name. OpenSSL (ssl module): "
                     f"{prov['python'].get('openssl')}.")
    report = {
        "title": "uvicorn benchmark" + (" (https)" if a.ssl else ""),
        "intro": (f"uvicorn {prov['packages'].get('uvicorn')} (http={a.http}, "
                  f"{'https, ' if a.ssl else ''}"
                  f"lifespan off, no access log) serving a plain ASGI app; each sample a "
                  f"fresh server process pinned to CPU {a.server_cpu}, loaded by `wrk -t{a.threads} "
                  f"-c{a.connections} -d{max(1, int(round(a.duration)))}s` pinned to CPU "
                  f"{a.client_cpu}; {a.samples} samples per loop and route, {a.warmups} "
                  f"warm-up sample(s) not counted, loop order rotated every round, GC on. "
                  f"Requests per second, higher is better."),
        "notes": notes,
        "started": started,
        "duration_s": time.perf_counter() - t0,
        "argv": [os.path.relpath(sys.argv[0], os.path.dirname(HERE))]
        + (argv if argv is not None else sys.argv[1:]),
        "loops": loops,
        "unavailable": unavailable,
        "sections": [{"heading": "Median requests/s", "cell_name": "route",
                      "text": "Routes: `plaintext` = GET / (13 bytes), "
                              "`body10k` = GET /10k (10,240 bytes).",
                      "results": res}],
        "servers_seen": sorted(seen),
        "provenance": prov,
        "config": {"samples": a.samples, "warmups": a.warmups,
                   "duration": f"{a.duration:g} s", "wrk": f"-t{a.threads} -c{a.connections}",
                   "server cpu": a.server_cpu, "client cpu": a.client_cpu,
                   "uvicorn http": a.http, "routes": ", ".join(routes),
                   "tls": "https (--ssl)" if a.ssl else "off"},
    }
    report["duration_s"] = time.perf_counter() - t0
    return hb.finish(report, a)


if __name__ == "__main__":
    sys.exit(main())
