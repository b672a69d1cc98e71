"""Servers running applications on zuvrs, started as a user would start them.

Each test starts a real server process (gunicorn with zuvrs's worker classes
and 2 workers, hypercorn, uvicorn's command line) on a listening socket this
test made (bound to port 0 and handed over as an inherited fd, so no port is
ever guessed), sends it real HTTP requests whose handler reports the type of
its running loop and its pid, and stops it with SIGTERM, expecting a clean
exit. Skipped where the server is not installed.
"""

import asyncio
import concurrent.futures
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from _support import TIMEOUT

BOOT_TIMEOUT = 60
STOP_TIMEOUT = 30

ASGI_APP = textwrap.dedent(
    """\
    import asyncio
    import json
    import os

    import zuvrs


    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        loop = asyncio.get_running_loop()
        payload = json.dumps({
            "loop": type(loop).__module__ + "." + type(loop).__qualname__,
            "zuvrs": isinstance(loop, zuvrs.Loop),
            "pid": os.getpid(),
            "path": scope["path"],
            "echo": body.decode(),
        }).encode()
        await send({
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"),
                        (b"content-length", str(len(payload)).encode())],
        })
        await send({"type": "http.response.body", "body": payload})
    """
)

AIOHTTP_APP = textwrap.dedent(
    """\
    import asyncio
    import os

    from aiohttp import web

    import zuvrs


    async def handler(request):
        loop = asyncio.get_running_loop()
        # A loop made by the application itself comes from the policy.
        made = asyncio.new_event_loop()
        made.close()
        return web.json_response({
            "loop": type(loop).__module__ + "." + type(loop).__qualname__,
            "zuvrs": isinstance(loop, zuvrs.Loop),
            "new_event_loop": isinstance(made, zuvrs.Loop),
            "pid": os.getpid(),
            "path": request.path,
            "echo": (await request.read()).decode(),
        })


    async def make_app():
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        return app
    """
)


def _listening_socket():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _default_signals():
    # Children start with default dispositions whatever this process inherited.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


class ServerProcess:
    """A server command serving on an inherited listening socket."""

    def __init__(self, argv, cwd, sock, log_path):
        self.sock = sock
        self.port = sock.getsockname()[1]
        self.log_path = log_path
        self.log = open(log_path, "wb")
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            pass_fds=(sock.fileno(),),
            preexec_fn=_default_signals,
            start_new_session=True,
        )

    def output(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def request(self, path="/", body=None, timeout=TIMEOUT):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            method = "POST" if body is not None else "GET"
            conn.request(method, path, body=body, headers={"Connection": "close"})
            resp = conn.getresponse()
            data = resp.read()
            assert resp.status == 200, (resp.status, data)
            return json.loads(data)
        finally:
            conn.close()

    def wait_ready(self):
        deadline = time.monotonic() + BOOT_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                return self.request("/ready", timeout=2)
            except (OSError, http.client.HTTPException):
                if time.monotonic() > deadline:
                    raise AssertionError(f"server did not answer in {BOOT_TIMEOUT}s:\n{self.output()}")
                time.sleep(0.1)

    def stop(self, sig=signal.SIGTERM):
        """Signal the server and wait for it; returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"server did not stop in {STOP_TIMEOUT}s:\n{self.output()}")
        finally:
            self.log.close()
            self.sock.close()

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if not self.log.closed:
            self.log.close()
        self.sock.close()


@pytest.fixture
def serve(tmp_path):
    """serve(argv, files) -> a started ServerProcess; ``{fd}`` in argv is the
    inherited listening socket's fd; files are written to the server's cwd."""
    started = []

    def start(argv, files):
        for name, text in files.items():
            (tmp_path / name).write_text(text)
        sock = _listening_socket()
        argv = [a.replace("{fd}", str(sock.fileno())) for a in argv]
        server = ServerProcess(argv, str(tmp_path), sock, str(tmp_path / "server.log"))
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in started:
        server.kill()


def _requests_from_all_workers(server, workers, rounds=20, per_round=32):
    """Send batches of concurrent requests until ``workers`` processes have
    answered; returns the answers."""
    answers = []
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for i in range(rounds):
            batch = list(pool.map(lambda n, i=i: server.request(f"/req/{i}/{n}", body=f"body {n}"), range(per_round)))
            for n, answer in enumerate(batch):
                assert answer["path"] == f"/req/{i}/{n}"
                assert answer["echo"] == f"body {n}"
            answers += batch
            if len({a["pid"] for a in answers}) >= workers:
                break
    return answers


def _check_gunicorn(server, workers=2):
    answers = _requests_from_all_workers(server, workers)
    assert {a["loop"] for a in answers} == {"zuvrs._loop.Loop"}
    assert all(a["zuvrs"] for a in answers)
    pids = {a["pid"] for a in answers}
    assert len(pids) == workers, (pids, server.output())
    assert server.proc.pid not in pids
    code = server.stop()
    log = server.output()
    assert code == 0, log
    assert "Traceback" not in log, log
    assert "Shutting down: Master" in log, log
    for pid in pids:
        assert f"Booting worker with pid: {pid}" in log, log
    return answers, log


def _gunicorn(worker, app, *extra):
    return [
        sys.executable, "-m", "gunicorn", "-k", worker, "-w", "2", "-b", "fd://{fd}",
        "--graceful-timeout", "5", "--timeout", "60", "--log-level", "info", *extra, app,
    ]


# -- gunicorn ----------------------------------------------------------------


def test_gunicorn_uvicorn_worker(serve):
    pytest.importorskip("gunicorn")
    pytest.importorskip("uvicorn")
    server = serve(_gunicorn("zuvrs.workers.UvicornWorker", "asgi_app:app"), {"asgi_app.py": ASGI_APP})
    _check_gunicorn(server)


def test_gunicorn_uvicorn_h11_worker(serve):
    pytest.importorskip("gunicorn")
    pytest.importorskip("uvicorn")
    pytest.importorskip("h11")
    server = serve(_gunicorn("zuvrs.workers.UvicornH11Worker", "asgi_app:app"), {"asgi_app.py": ASGI_APP})
    _check_gunicorn(server)


def test_gunicorn_aiohttp_worker(serve):
    pytest.importorskip("gunicorn")
    pytest.importorskip("aiohttp")
    server = serve(
        _gunicorn("zuvrs.workers.GunicornWebWorker", "aiohttp_app:make_app"),
        {"aiohttp_app.py": AIOHTTP_APP},
    )
    answers, _ = _check_gunicorn(server)
    assert all(a["new_event_loop"] for a in answers)


def test_gunicorn_asgi_worker(serve):
    pytest.importorskip("gunicorn")
    try:
        from gunicorn.workers import gasgi  # noqa: F401
    except ImportError:
        pytest.skip("this gunicorn has no ASGI worker (gunicorn 24+)")
    server = serve(_gunicorn("zuvrs.workers.ASGIWorker", "asgi_app:app"), {"asgi_app.py": ASGI_APP})
    _check_gunicorn(server)


def test_workers_module_imports_no_server():
    # `import zuvrs` and `import zuvrs.workers` import no server; a worker
    # class needs only its own server.
    code = textwrap.dedent(
        """\
        import sys
        import zuvrs, zuvrs.workers, zuvrs.pytest_plugin
        heavy = ("gunicorn", "aiohttp", "uvicorn", "uvicorn_worker", "hypercorn")
        print(sorted(m for m in heavy if m in sys.modules))
        sorted(dir(zuvrs.workers))
        try:
            zuvrs.workers.UvicornWorker
        except ImportError:  # uvicorn-worker is not installed
            pass
        print(sorted(m for m in ("aiohttp",) if m in sys.modules))
        try:
            zuvrs.workers.NoSuchWorker
        except AttributeError as exc:
            print(exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[]"
    # Making the uvicorn worker imports no aiohttp.
    assert lines[1] == "[]"
    assert lines[2] == "module 'zuvrs.workers' has no attribute 'NoSuchWorker'"


def test_uvicorn_worker_config():
    pytest.importorskip("gunicorn")
    pytest.importorskip("uvicorn")
    import zuvrs.workers

    worker = zuvrs.workers.UvicornWorker
    assert worker.CONFIG_KWARGS["loop"] == "zuvrs:new_event_loop"
    assert zuvrs.workers.UvicornH11Worker.CONFIG_KWARGS == {"loop": "zuvrs:new_event_loop", "http": "h11"}
    assert worker.__module__ == "zuvrs.workers" and worker.__qualname__ == "UvicornWorker"
    from uvicorn.config import Config

    factory = Config(app=None, loop=worker.CONFIG_KWARGS["loop"]).get_loop_factory()
    import zuvrs

    assert factory is zuvrs.new_event_loop


# -- uvicorn's command line --------------------------------------------------------


def test_uvicorn_cli_loop_factory(serve):
    pytest.importorskip("uvicorn")
    server = serve(
        [sys.executable, "-m", "uvicorn", "--loop", "zuvrs:new_event_loop", "--fd", "{fd}",
         "--log-level", "info", "asgi_app:app"],
        {"asgi_app.py": ASGI_APP},
    )
    answer = server.request("/x", body="y")
    assert answer["loop"] == "zuvrs._loop.Loop" and answer["echo"] == "y"
    code = server.stop()
    log = server.output()
    # After its graceful shutdown uvicorn re-raises the signal it caught (on
    # any loop), so it exits by SIGTERM.
    assert code == -signal.SIGTERM, log
    assert "Traceback" not in log, log
    assert "Application shutdown complete" in log and "Finished server process" in log, log


# -- hypercorn -----------------------------------------------------------------------

# Hypercorn's workers are fresh interpreters (multiprocessing's spawn) that
# import the application before they make their loop: zuvrs.install() at the
# top of the application module (or of a two-line module that imports it)
# gives every worker zuvrs loops.
HYPERCORN_WRAPPER = "import zuvrs\nzuvrs.install()\nfrom asgi_app import app  # noqa: E402\n"


def test_hypercorn_workers_with_install_in_app_module(serve):
    pytest.importorskip("hypercorn")
    server = serve(
        [sys.executable, "-m", "hypercorn", "-k", "asyncio", "-w", "2", "-b", "fd://{fd}",
         "--graceful-timeout", "5", "zuvrs_app:app"],
        {"asgi_app.py": ASGI_APP, "zuvrs_app.py": HYPERCORN_WRAPPER},
    )
    answers = _requests_from_all_workers(server, 2)
    assert {a["loop"] for a in answers} == {"zuvrs._loop.Loop"}
    assert len({a["pid"] for a in answers}) == 2
    code = server.stop()
    log = server.output()
    assert code == 0, log
    assert "Traceback" not in log, log


def test_hypercorn_single_process_under_python_m_zuvrs(serve):
    # --workers 0: hypercorn serves in its own process, which python -m zuvrs
    # set up; the application is unchanged.
    pytest.importorskip("hypercorn")
    server = serve(
        [sys.executable, "-m", "zuvrs", "-m", "hypercorn", "-k", "asyncio", "--workers", "0",
         "-b", "fd://{fd}", "--graceful-timeout", "5", "asgi_app:app"],
        {"asgi_app.py": ASGI_APP},
    )
    answers = [server.request(f"/{n}", body=str(n)) for n in range(5)]
    assert {a["loop"] for a in answers} == {"zuvrs._loop.Loop"}
    assert {a["pid"] for a in answers} == {server.proc.pid}
    code = server.stop()
    log = server.output()
    assert code == 0, log
    assert "Traceback" not in log, log


def test_hypercorn_serve_under_zuvrs_run():
    # Programmatic: hypercorn.asyncio.serve() in zuvrs.run().
    pytest.importorskip("hypercorn")
    httpx = pytest.importorskip("httpx")
    import importlib.util

    import zuvrs
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    spec = importlib.util.spec_from_loader("asgi_app_for_hypercorn", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(ASGI_APP, module.__dict__)

    async def main():
        sock = _listening_socket()
        config = Config()
        config.bind = [f"fd://{sock.fileno()}"]
        config.graceful_timeout = 5
        config.accesslog = None
        config.errorlog = None
        stop = asyncio.Event()
        task = asyncio.ensure_future(hypercorn_serve(module.app, config, shutdown_trigger=stop.wait))
        port = sock.getsockname()[1]
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client:
                for _ in range(100):
                    try:
                        r = await client.post("/p", content=b"q")
                        break
                    except httpx.ConnectError:
                        await asyncio.sleep(0.05)
                rs = await asyncio.gather(*(client.get(f"/{n}") for n in range(10)))
        finally:
            stop.set()
            await asyncio.wait_for(task, STOP_TIMEOUT)
        return r.json(), [x.json() for x in rs], type(asyncio.get_running_loop())

    first, many, loop_type = zuvrs.run(main())
    assert loop_type is zuvrs.Loop
    assert first["zuvrs"] and first["echo"] == "q" and first["pid"] == os.getpid()
    assert [a["path"] for a in many] == [f"/{n}" for n in range(10)]


# -- AnyIO ---------------------------------------------------------------------------


def test_anyio_run_with_loop_factory():
    anyio = pytest.importorskip("anyio")
    import zuvrs

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.sleep, 0.01)
        return type(asyncio.get_running_loop())

    assert anyio.run(main, backend="asyncio", backend_options={"loop_factory": zuvrs.new_event_loop}) is zuvrs.Loop


# -- aiohttp's own runner --------------------------------------------------------------

AIOHTTP_RUN_APP = textwrap.dedent(
    """\
    import socket
    import sys

    from aiohttp import web

    import zuvrs
    from aiohttp_app import make_app

    sock = socket.socket(fileno=int(sys.argv[1]))
    web.run_app(make_app(), sock=sock, loop=zuvrs.new_event_loop(), print=None)
    """
)


def test_aiohttp_run_app_with_zuvrs_loop(serve):
    pytest.importorskip("aiohttp")
    server = serve(
        [sys.executable, "serve_aiohttp.py", "{fd}"],
        {"aiohttp_app.py": AIOHTTP_APP, "serve_aiohttp.py": AIOHTTP_RUN_APP},
    )
    answers = [server.request(f"/{n}", body=str(n)) for n in range(5)]
    assert all(a["zuvrs"] for a in answers)
    assert {a["pid"] for a in answers} == {server.proc.pid}
    code = server.stop(signal.SIGINT)
    log = server.output()
    assert code == 0, log
    assert "Traceback" not in log, log
