"""An aiohttp web server on a zuvrs loop, with aiohttp's client asking it.

    python examples/aiohttp_server.py       # needs aiohttp (pip install aiohttp)

The server runs through aiohttp's AppRunner on a free port; the client
makes a GET and a POST, then the runner shuts the server down. A long-running
application would use `web.run_app(make_app(), loop=zuvrs.new_event_loop())`
instead (see the README's Integrations).
"""

import asyncio

import zuvrs
from aiohttp import ClientSession, web


async def hello(request: web.Request) -> web.Response:
    loop = "zuvrs" if isinstance(asyncio.get_running_loop(), zuvrs.Loop) else "another loop"
    return web.Response(text=f"hello from aiohttp on {loop}")


async def reverse(request: web.Request) -> web.Response:
    data = await request.json()
    return web.json_response({"reversed": data["text"][::-1]})


def make_app() -> web.Application:
    app = web.Application()
    app.add_routes([web.get("/", hello), web.post("/reverse", reverse)])
    return app


async def main() -> None:
    runner = web.AppRunner(make_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with ClientSession(f"http://127.0.0.1:{port}") as session:
            async with session.get("/") as response:
                print(response.status, await response.text())
            async with session.post("/reverse", json={"text": "zuvrs"}) as response:
                print(response.status, await response.json())
    finally:
        await runner.cleanup()
    print("server stopped")


if __name__ == "__main__":
    zuvrs.run(main())
