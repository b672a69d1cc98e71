"""aiohttp's own pytest plugin (aiohttp.pytest_plugin: the `loop` fixture,
--aiohttp-loop=pyloop); run on its own, with pytest-aiohttp disabled."""

import asyncio

from aiohttp import web
from expect import check_loop


async def hello(request):
    return web.Response(text=type(check_loop()).__name__)


async def test_loop_fixture(loop):
    assert asyncio.get_running_loop() is loop
    check_loop(loop)


async def test_client(aiohttp_client, loop):
    app = web.Application()
    app.router.add_get("/", hello)
    client = await aiohttp_client(app)
    resp = await client.get("/")
    assert resp.status == 200
    assert await resp.text() == type(loop).__name__
