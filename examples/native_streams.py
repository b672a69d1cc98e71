"""asyncio streams done natively: zuvrs.streams.

    python examples/native_streams.py

A line echo server and its client, first through zuvrs.streams' own
functions, then through asyncio's after zuvrs.streams.install() (which
makes asyncio.open_connection and start_server use the native classes on
zuvrs loops only). The readers and writers are asyncio's classes as far as
any code can tell: isinstance() holds, and the methods and their errors
are asyncio's.
"""

import asyncio

import zuvrs
import zuvrs.streams


async def talk(open_connection, start_server, label: str) -> None:
    served = asyncio.Event()

    async def echo_lines(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(line)
            await writer.drain()
        writer.close()
        served.set()

    server = await start_server(echo_lines, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await open_connection("127.0.0.1", port)
        print(f"{label}: {type(reader).__module__}.{type(reader).__name__},"
              f" an asyncio.StreamReader: {isinstance(reader, asyncio.StreamReader)}")
        for n in range(3):
            writer.write(b"line %d\n" % n)
        await writer.drain()
        echoed = [await reader.readline() for _ in range(3)]
        print(f"{label}: echoed {b''.join(echoed)!r}")
        writer.close()
        await writer.wait_closed()
        await served.wait()  # the handler has seen the end and closed its side


async def limits() -> None:
    # The errors are asyncio's: a line longer than the reader's limit is a
    # ValueError, and what the buffer keeps afterwards is what asyncio keeps.
    reader = zuvrs.streams.StreamReader(limit=8)
    reader.feed_data(b"far too long a line\nshort\n")
    try:
        await reader.readline()
    except ValueError as exc:
        print(f"limit 8: {type(exc).__name__}: {exc}; left {bytes(reader._buffer)!r}")


async def main() -> None:
    await limits()
    await talk(zuvrs.streams.open_connection, zuvrs.streams.start_server, "zuvrs.streams")
    zuvrs.streams.install()
    try:
        await talk(asyncio.open_connection, asyncio.start_server, "asyncio after install()")
    finally:
        zuvrs.streams.uninstall()


if __name__ == "__main__":
    zuvrs.run(main())
