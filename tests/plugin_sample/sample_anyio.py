"""AnyIO's pytest plugin on its asyncio backend."""

import anyio
import pytest
from expect import check_loop


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
async def anyio_fixture_loop(anyio_backend):
    return check_loop()


@pytest.mark.anyio
async def test_anyio(anyio_fixture_loop):
    assert check_loop() is anyio_fixture_loop
    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.sleep, 0.001)


@pytest.mark.anyio
async def test_anyio_to_thread():
    check_loop()
    assert await anyio.to_thread.run_sync(lambda: 42) == 42
