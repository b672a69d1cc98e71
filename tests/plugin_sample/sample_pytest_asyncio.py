"""pytest-asyncio: tests and fixtures of several loop scopes."""

import asyncio

import pytest
import pytest_asyncio
from expect import check_loop


@pytest_asyncio.fixture
async def fixture_loop():
    yield check_loop()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def module_fixture_loop():
    return check_loop()


@pytest.mark.asyncio
async def test_function_scope(fixture_loop):
    loop = check_loop()
    assert loop is fixture_loop
    await asyncio.sleep(0.001)


@pytest.mark.asyncio(loop_scope="module")
async def test_module_scope(module_fixture_loop):
    assert check_loop() is module_fixture_loop


@pytest.mark.asyncio(loop_scope="module")
async def test_module_scope_again(module_fixture_loop):
    assert check_loop() is module_fixture_loop


@pytest.mark.asyncio(loop_scope="class")
class TestClassScope:
    loops = []

    async def test_one(self):
        self.loops.append(check_loop())

    async def test_two(self):
        self.loops.append(check_loop())
        assert self.loops[0] is self.loops[1]


@pytest.mark.asyncio
async def test_streams_and_subprocess():
    check_loop()

    async def handle(reader, writer):
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"ping\n")
    assert await reader.readline() == b"ping\n"
    writer.close()
    server.close()
    await server.wait_closed()
    proc = await asyncio.create_subprocess_exec("true")
    assert await proc.wait() == 0


def test_sync_test_sees_no_running_loop():
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()
