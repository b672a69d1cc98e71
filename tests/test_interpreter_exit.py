"""What a program leaves to the interpreter's exit: handles, transports,
servers, streams and loops still referenced when Python finalizes.

CPython frees them during ``Py_FinalizeEx`` (module teardown, the last
collections), after ``Py_IsInitialized()`` has turned false, with the GIL
held by the exiting thread. The stdlib loop's objects are plain Python
objects and simply go; zuvrs's release native state then, and must neither
crash the process nor change its exit status. Each program runs in a child
interpreter, on the stdlib loop and on zuvrs with the same body; the exit
status must be the one the program chose, and stderr must show no crash.
(What else stderr holds, ResourceWarnings and "Exception ignored" lines,
differs between the loops and is not compared.)
"""

import pytest
from _support import run_child

pytest.importorskip("cryptography")
from _tls_certs import make_pki  # noqa: E402

CRASH_MARKS = ("panicked", "Fatal Python error", "Segmentation fault", "Aborted", "core dumped")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def exits_cleanly(proc, status=0):
    crash = [line for line in proc.stderr.splitlines() if any(m in line for m in CRASH_MARKS)]
    assert proc.returncode == status and not crash, (proc.returncode, proc.stderr[-3000:])


@pytest.mark.parametrize("debug", [True, False], ids=["debug", "no-debug"])
def test_handles_kept_until_exit(loop_name, debug):
    """Handles and timer handles referenced from a module global: pending,
    cancelled and already run (in debug mode each carries the traceback of
    where it was made)."""
    proc = run_child(loop_name, f"""
        KEPT = []

        async def main():
            loop = asyncio.get_running_loop()
            KEPT.append(loop.call_soon(print, "ran"))
            KEPT.append(loop.call_later(100, print))
            KEPT.append(loop.call_at(loop.time() + 100, print))
            cancelled = loop.call_later(100, print)
            cancelled.cancel()
            KEPT.append(cancelled)
            await asyncio.sleep(0)

        run(main(), debug={debug})
        print("end")
    """)
    exits_cleanly(proc)
    assert proc.stdout.split() == ["ran", "end"]


@pytest.mark.parametrize("debug", [True, False], ids=["debug", "no-debug"])
def test_system_exit_from_a_callback_while_a_task_sleeps(loop_name, debug):
    """A callback raises SystemExit while the main task sleeps: the process
    exits with its code, and the sleeping task's frame, which holds its
    timer handle, is freed during finalization."""
    proc = run_child(loop_name, f"""
        def leave():
            raise SystemExit(42)

        async def main():
            asyncio.get_running_loop().call_later(0.01, leave)
            await asyncio.sleep(30)

        run(main(), debug={debug})
    """)
    exits_cleanly(proc, 42)


@pytest.mark.parametrize("debug", [True, False], ids=["debug", "no-debug"])
def test_open_transports_and_an_unclosed_loop_at_exit(loop_name, debug, pki):
    """A loop never closed, with what it serves still open and referenced
    from module globals: a TCP server and a connection to it over streams
    (zuvrs's native streams on zuvrs), a TLS connection, a UDP endpoint, a
    pipe's read transport, a child process's pipes, and callbacks still
    queued."""
    proc = run_child(loop_name, f"""
        import os, socket, ssl

        if "zuvrs" in sys.modules:
            import zuvrs.streams as streams
        else:
            streams = asyncio
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain({str(pki.server[0])!r}, {str(pki.server[1])!r})
        client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client_ctx.load_verify_locations({str(pki.ca)!r})
        KEPT = []

        async def handle(reader, writer):
            KEPT.append((reader, writer))
            writer.write(await reader.readline())

        async def setup():
            loop = asyncio.get_running_loop()
            server = await streams.start_server(handle, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            reader, writer = await streams.open_connection("127.0.0.1", port)
            writer.write(b"hello\\n")
            assert await reader.readline() == b"hello\\n"
            tls_server = await streams.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
            tls_port = tls_server.sockets[0].getsockname()[1]
            tls_reader, tls_writer = await streams.open_connection(
                "127.0.0.1", tls_port, ssl=client_ctx, server_hostname="localhost")
            tls_writer.write(b"secret\\n")
            assert await tls_reader.readline() == b"secret\\n"
            udp = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0))
            rfd, wfd = os.pipe()
            pipe = await loop.connect_read_pipe(asyncio.Protocol, os.fdopen(rfd, "rb", 0))
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "import sys; sys.stdin.read()",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            KEPT.extend([server, reader, writer, tls_server, tls_reader, tls_writer, udp, pipe, wfd, child])

        loop = new_loop()
        loop.set_debug({debug})
        loop.run_until_complete(setup())
        loop.call_soon(print, "never")
        KEPT.append(loop.call_later(100, print))
        print("end")
    """)
    exits_cleanly(proc)
    assert proc.stdout.split() == ["end"]


@pytest.mark.parametrize("debug", [True, False], ids=["debug", "no-debug"])
def test_loops_of_other_threads_at_exit(loop_name, debug):
    """A loop left to a thread that has ended, and one still running in a
    daemon thread when the interpreter exits, each with a connection open
    over streams and a timer pending."""
    proc = run_child(loop_name, f"""
        import threading

        if "zuvrs" in sys.modules:
            import zuvrs.streams as streams
        else:
            streams = asyncio
        KEPT = []
        running = threading.Event()

        async def connect():
            async def handle(reader, writer):
                writer.write(await reader.read(100))
            server = await streams.start_server(handle, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            reader, writer = await streams.open_connection("127.0.0.1", port)
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"
            asyncio.get_running_loop().call_later(100, print)
            return server, reader, writer

        def worker(forever):
            loop = new_loop()
            loop.set_debug({debug})
            KEPT.append(loop.run_until_complete(connect()))
            if forever:
                loop.call_soon(running.set)
                loop.run_forever()

        ended = threading.Thread(target=worker, args=(False,))
        ended.start()
        ended.join()
        threading.Thread(target=worker, args=(True,), daemon=True).start()
        assert running.wait(10)
        print("end")
    """)
    exits_cleanly(proc)
    assert proc.stdout.split() == ["end"]
