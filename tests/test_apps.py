"""Smoke tests with real applications: uvicorn (httptools) and aiohttp.web
servers, queried by httpx and aiohttp clients running on the same loop.

Skipped when the packages are not installed.
"""

import asyncio
import socket

import pytest
from _support import TIMEOUT, payload, run

BIG = payload(10 * 1024, seed=7)


def _bound_socket():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


# -- uvicorn ---------------------------------------------------------------------


async def asgi_app(scope, receive, send):
    assert scope["type"] == "http"
    path = scope["path"]
    if path == "/":
        body = b"hello from asgi"
    elif path == "/big":
        body = BIG
    elif path == "/echo":
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
    else:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"not found"})
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/octet-stream"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _uvicorn_server():
    """A started uvicorn.Server on a fresh port: (server, serve task, url)."""
    import uvicorn

    sock = _bound_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        asgi_app,
        loop="none",
        http="httptools",
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,
    )
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while not server.started:
        assert not task.done(), task.exception() if task.done() else None
        assert asyncio.get_running_loop().time() < deadline, "uvicorn did not start"
        await asyncio.sleep(0.01)
    return server, task, sock, f"http://127.0.0.1:{port}"


async def _stop_uvicorn(server, task, sock):
    server.should_exit = True
    await asyncio.wait_for(task, 10)
    sock.close()


def test_uvicorn_httptools_with_httpx(loop):
    pytest.importorskip("uvicorn")
    pytest.importorskip("httptools")
    httpx = pytest.importorskip("httpx")

    async def main():
        server, task, sock, url = await _uvicorn_server()
        try:
            async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
                r = await client.get("/")
                assert r.status_code == 200
                assert r.content == b"hello from asgi"
                r = await client.get("/big")
                assert r.status_code == 200
                assert r.content == BIG
                assert r.headers["content-length"] == str(len(BIG))
                r = await client.post("/echo", content=BIG)
                assert r.content == BIG
                r = await client.get("/missing")
                assert r.status_code == 404
                # Several requests at once (several connections).
                rs = await asyncio.gather(*(client.get("/big") for _ in range(10)))
                assert all(r.content == BIG for r in rs)
        finally:
            await _stop_uvicorn(server, task, sock)

    run(loop, main(), 30)


def test_uvicorn_httptools_with_aiohttp_client(loop):
    pytest.importorskip("uvicorn")
    pytest.importorskip("httptools")
    aiohttp = pytest.importorskip("aiohttp")

    async def main():
        server, task, sock, url = await _uvicorn_server()
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(url + "/") as r:
                    assert r.status == 200
                    assert await r.read() == b"hello from asgi"
                async with session.post(url + "/echo", data=BIG) as r:
                    assert r.status == 200
                    assert await r.read() == BIG
        finally:
            await _stop_uvicorn(server, task, sock)

    run(loop, main(), 30)


# -- aiohttp.web ------------------------------------------------------------------


def _aiohttp_app():
    from aiohttp import WSMsgType, web

    async def hello(request):
        return web.Response(text="hello from aiohttp")

    async def big(request):
        return web.Response(body=BIG, content_type="application/octet-stream")

    async def echo(request):
        return web.Response(body=await request.read(), content_type="application/octet-stream")

    async def ws_echo(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                if msg.data == "close":
                    await ws.close()
                else:
                    await ws.send_str("echo:" + msg.data)
            elif msg.type == WSMsgType.BINARY:
                await ws.send_bytes(msg.data)
        return ws

    app = web.Application()
    app.router.add_get("/", hello)
    app.router.add_get("/big", big)
    app.router.add_post("/echo", echo)
    app.router.add_get("/ws", ws_echo)
    return app


async def _aiohttp_server():
    from aiohttp import web

    runner = web.AppRunner(_aiohttp_app(), access_log=None)
    await runner.setup()
    sock = _bound_socket()
    site = web.SockSite(runner, sock)
    await site.start()
    return runner, sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_aiohttp_web_with_aiohttp_client(loop):
    aiohttp = pytest.importorskip("aiohttp")

    async def main():
        runner, sock, url = await _aiohttp_server()
        try:
            timeout = aiohttp.ClientTimeout(total=TIMEOUT)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.get(url + "/") as r:
                    assert r.status == 200
                    assert await r.text() == "hello from aiohttp"
                async with session.get(url + "/big") as r:
                    assert r.status == 200
                    assert await r.read() == BIG
                async with session.post(url + "/echo", data=BIG) as r:
                    assert await r.read() == BIG
                rs = await asyncio.gather(*(session.get(url + "/big") for _ in range(10)))
                for r in rs:
                    assert await r.read() == BIG
                    r.release()
        finally:
            await runner.cleanup()
            sock.close()

    run(loop, main(), 30)


def test_aiohttp_web_with_httpx(loop):
    pytest.importorskip("aiohttp")
    httpx = pytest.importorskip("httpx")

    async def main():
        runner, sock, url = await _aiohttp_server()
        try:
            async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
                r = await client.get("/")
                assert r.text == "hello from aiohttp"
                r = await client.get("/big")
                assert r.content == BIG
        finally:
            await runner.cleanup()
            sock.close()

    run(loop, main(), 30)


def test_aiohttp_websocket_echo(loop):
    aiohttp = pytest.importorskip("aiohttp")

    async def main():
        runner, sock, url = await _aiohttp_server()
        try:
            async with aiohttp.ClientSession() as session:
                async with session.ws_connect(url + "/ws", timeout=aiohttp.ClientWSTimeout(ws_close=TIMEOUT)) as ws:
                    for i in range(50):
                        await ws.send_str(f"message {i}")
                        assert await asyncio.wait_for(ws.receive_str(), TIMEOUT) == f"echo:message {i}"
                    await ws.send_bytes(BIG)
                    assert await asyncio.wait_for(ws.receive_bytes(), TIMEOUT) == BIG
                    large = payload(1024 * 1024, seed=8)
                    await ws.send_bytes(large)
                    assert await asyncio.wait_for(ws.receive_bytes(), TIMEOUT) == large
                    await ws.send_str("close")
                    msg = await asyncio.wait_for(ws.receive(), TIMEOUT)
                    assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
                assert ws.closed
        finally:
            await runner.cleanup()
            sock.close()

    run(loop, main(), 30)
