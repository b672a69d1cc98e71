"""A small program for tests/test_stats.py's run of `python -m zuvrs --stats`:
an echo server and a client on one loop for about `seconds` (argv[1]),
with a callback that blocks for 60 ms every 0.3 s (the slowest callback
the summary lines should name). Prints what it echoed and which loop ran
it, and exits with status 3 (the CLI must pass it on)."""

import asyncio
import sys
import time


def hold_the_loop():
    time.sleep(0.06)


async def main(seconds):
    loop = asyncio.get_running_loop()

    async def echo(reader, writer):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    echoed = 0
    deadline = loop.time() + seconds
    next_hold = loop.time()
    while loop.time() < deadline:
        if loop.time() >= next_hold:
            loop.call_soon(hold_the_loop)
            next_hold += 0.3
        writer.write(b"x" * 1024)
        await writer.drain()
        echoed += len(await reader.readexactly(1024))
        await asyncio.sleep(0.001)
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()
    return echoed, type(loop).__module__.split(".")[0]


if __name__ == "__main__":
    echoed, loop_kind = asyncio.run(main(float(sys.argv[1])))
    print(f"echoed {echoed} on {loop_kind}")
    sys.exit(3)
