"""pytest-aiohttp (built on pytest-asyncio): a server and its test client."""

import pytest
from aiohttp import web
from expect import check_loop


async def hello(request):
    loop = check_loop()
    return web.Response(text=type(loop).__name__)


@pytest.mark.asyncio
async def test_client(aiohttp_client):
    app = web.Application()
    app.router.add_get("/", hello)
    client = await aiohttp_client(app)
    resp = await client.get("/")
    assert resp.status == 200
    assert await resp.text() == type(check_loop()).__name__
