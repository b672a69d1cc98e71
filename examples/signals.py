"""Graceful shutdown on SIGTERM or SIGINT (Ctrl-C).

    python examples/signals.py              # sends itself SIGTERM
    python examples/signals.py INT          # sends itself SIGINT, as Ctrl-C would

A small service (a TCP server and a client of its own that keeps asking it
for work) runs until a signal arrives. `loop.add_signal_handler` turns the
signal into an event; the service then stops accepting connections, lets
the request in progress finish, closes the connection and exits with code 0.
To stop by itself, the program sends itself the signal once it is serving.

`add_signal_handler` sets the signal's disposition itself, so this works
also where the program starts with SIGINT ignored (a shell's background
job, `nohup`). Without a handler of its own, a program run by `zuvrs.run`
gets asyncio.run's Ctrl-C handling: the main task is cancelled.
"""

import asyncio
import os
import signal
import sys

import zuvrs


async def main(signal_to_send: signal.Signals) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        print(f"got {sig.name}: shutting down")
        stopping.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)

    handlers_done = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            # Answer requests until the client leaves or the service is stopping.
            while not stopping.is_set() and (request := await reader.readline()):
                await asyncio.sleep(0.01)  # the work a request takes
                writer.write(b"done " + request)
                await writer.drain()
            writer.close()
            await writer.wait_closed()
        finally:
            handlers_done.set()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def client() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answers = 0
        try:
            while True:
                writer.write(b"job\n")
                if not await reader.readline():  # the server closed the connection
                    break
                answers += 1
                if answers == 5:
                    print(f"serving; sending {signal_to_send.name} to myself")
                    os.kill(os.getpid(), signal_to_send)
            writer.close()
            await writer.wait_closed()
        except ConnectionError:  # a request sent as the server closed can meet a reset
            writer.close()
        return answers

    client_task = asyncio.create_task(client())
    await stopping.wait()
    server.close()  # no new connections
    await handlers_done.wait()  # the request in progress is answered, then the connection closes
    await server.wait_closed()
    answers = await client_task
    print(f"the client got {answers} answers, then the server closed the connection")
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)
    print("stopped cleanly")


if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "TERM"
    zuvrs.run(main(signal.Signals[f"SIG{name}"]))
