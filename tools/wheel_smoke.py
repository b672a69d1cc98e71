"""Smoke tests for an installed zuvrs wheel (run by tools/wheels.sh in a
fresh virtualenv, from a directory outside the checkout).

Checks: the import (and that it is the installed copy), a coroutine under
zuvrs.run, a TCP echo, a subprocess, a stock asyncio loop spawning a child
under zuvrs.install() (child watchers, up to 3.13), `python -m zuvrs --info`
and a script under `python -m zuvrs`. Prints one line per check and exits
non-zero on the first failure.
"""

import asyncio
import os
import subprocess
import sys
import tempfile


def check(name, fn):
    try:
        detail = fn()
    except BaseException as exc:
        print(f"FAIL {name}: {type(exc).__name__}: {exc}")
        raise SystemExit(1)
    print(f"ok   {name}" + (f": {detail}" if detail else ""))


def import_zuvrs():
    import zuvrs

    here = os.path.dirname(os.path.abspath(zuvrs.__file__))
    assert "site-packages" in here, here
    stubs = [f for f in ("__init__.pyi", "py.typed") if os.path.exists(os.path.join(here, f))]
    assert stubs == ["__init__.pyi", "py.typed"], stubs
    return f"zuvrs {zuvrs.__version__}, libuv {zuvrs.libuv_version()}, {here}"


def coroutine():
    import zuvrs

    async def main():
        await asyncio.sleep(0.01)
        return type(asyncio.get_running_loop()).__module__

    module = zuvrs.run(main())
    assert module.startswith("zuvrs"), module
    return module


def tcp_echo():
    import zuvrs

    async def main():
        async def handle(reader, writer):
            writer.write(await reader.read(1024))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"echo me")
        data = await asyncio.wait_for(reader.read(1024), 5)
        writer.close()
        server.close()
        await server.wait_closed()
        return data

    data = zuvrs.run(main())
    assert data == b"echo me", data


def child_process():
    import zuvrs

    async def main():
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; print(sys.argv[1]); sys.exit(7)", "hello",
            stdout=subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 10)
        return out, proc.returncode

    result = zuvrs.run(main())
    assert result == (b"hello\n", 7), result


def stock_loop_child():
    import zuvrs

    zuvrs.install()
    loop = asyncio.SelectorEventLoop()
    try:
        proc = loop.run_until_complete(asyncio.create_subprocess_exec("true"))
        code = loop.run_until_complete(asyncio.wait_for(proc.wait(), 10))
    finally:
        loop.close()
    assert code == 0, code


def cli_info():
    out = subprocess.run(
        [sys.executable, "-m", "zuvrs", "--info"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    labels = [line.split(":", 1)[0] for line in out.stdout.splitlines()]
    for label in ("zuvrs", "libuv", "OpenSSL", "Python", "build profile", "context sharing", "platform"):
        assert label in labels, (label, out.stdout)
    return " | ".join(line.split(None, 1)[-1] for line in out.stdout.splitlines()[:4])


def cli_script():
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "app.py")
        with open(script, "w") as f:
            f.write(
                "import asyncio, sys\n"
                "async def main():\n"
                "    return type(asyncio.get_running_loop()).__module__\n"
                "print(asyncio.run(main()), sys.argv[1:])\n"
            )
        out = subprocess.run(
            [sys.executable, "-m", "zuvrs", script, "a", "b"],
            capture_output=True, text=True, timeout=60,
        )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("zuvrs") and "['a', 'b']" in out.stdout, out.stdout


if __name__ == "__main__":
    print(f"== {sys.executable} ({sys.version.split()[0]})")
    check("import", import_zuvrs)
    check("coroutine", coroutine)
    check("tcp echo", tcp_echo)
    check("subprocess", child_process)
    check("stock loop subprocess under install()", stock_loop_child)
    check("python -m zuvrs --info", cli_info)
    check("python -m zuvrs script.py", cli_script)
    print("all smoke tests passed")
