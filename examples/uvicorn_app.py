"""An ASGI application served by uvicorn on a zuvrs loop.

    python examples/uvicorn_app.py          # needs uvicorn 0.36+ (pip install uvicorn)

From a shell, the same application runs with

    uvicorn --loop zuvrs:new_event_loop examples.uvicorn_app:app

This program does what that command does (uvicorn imports the loop factory
named by `loop=`), and to stop by itself it also runs a client: a thread
that waits for the server to start, makes two requests and asks the server
to exit.
"""

import asyncio
import http.client
import socket
import threading
import time

import uvicorn
import zuvrs


async def app(scope, receive, send):
    """A plain ASGI application: says which loop serves the request."""
    if scope["type"] != "http":
        return
    loop = "zuvrs" if isinstance(asyncio.get_running_loop(), zuvrs.Loop) else "another loop"
    body = f"{scope['path']} served by {loop}\n".encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


def client(server: uvicorn.Server, port: int, errors: list) -> None:
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("uvicorn did not start")
            time.sleep(0.05)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for path in ("/", "/hello"):
            connection.request("GET", path)
            response = connection.getresponse()
            print(response.status, response.read().decode().rstrip())
        connection.close()
    except Exception as exc:
        errors.append(exc)
    finally:
        server.should_exit = True


def main() -> None:
    # A socket on a free port, so that the example never collides with a running server.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]

    config = uvicorn.Config(app, loop="zuvrs:new_event_loop", log_level="warning")
    server = uvicorn.Server(config)
    errors: list = []
    thread = threading.Thread(target=client, args=(server, port, errors))
    thread.start()
    server.run(sockets=[sock])  # returns once should_exit is set and the server has shut down
    thread.join()
    if errors:
        raise errors[0]
    print("uvicorn stopped, zuvrs", zuvrs.__version__)


if __name__ == "__main__":
    main()
