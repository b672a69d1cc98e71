"""TCP echo server and client on asyncio streams, run by zuvrs.

    python examples/tcp_echo.py

The server listens on a free port of 127.0.0.1; the client sends three
lines, reads each one back and closes; the server sees the end of the
stream, closes its side, and the program stops. Nothing here is specific to
zuvrs except `zuvrs.run`: the same code runs on any asyncio loop.
"""

import asyncio

import zuvrs


async def main() -> None:
    served = asyncio.Event()

    async def handle_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            # Echo every line until the client closes its side.
            while line := await reader.readline():
                writer.write(line)
                await writer.drain()
            writer.close()
            await writer.wait_closed()
        finally:
            served.set()

    server = await asyncio.start_server(handle_client, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    loop = asyncio.get_running_loop()
    print(f"listening on {host}:{port}; running on zuvrs: {isinstance(loop, zuvrs.Loop)}")

    async with server:
        reader, writer = await asyncio.open_connection(host, port)
        for text in ("hello", "from", "zuvrs"):
            writer.write(f"{text}\n".encode())
            await writer.drain()
            echoed = await reader.readline()
            print(f"sent {text!r}, got back {echoed.decode().rstrip()!r}")
        writer.close()
        await writer.wait_closed()
        await served.wait()  # the handler has seen the end and closed its side
    print("server closed")


if __name__ == "__main__":
    zuvrs.run(main())
