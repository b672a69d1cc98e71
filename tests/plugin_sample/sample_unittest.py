"""unittest's IsolatedAsyncioTestCase (and a plain asyncio.run)."""

import asyncio
import unittest

from expect import check_loop


class SampleAsyncTests(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.setup_loop = check_loop()

    async def test_loop(self):
        self.assertIs(check_loop(), self.setup_loop)
        await asyncio.sleep(0.001)


def test_asyncio_run():
    async def main():
        return check_loop()

    asyncio.run(main())


def test_new_event_loop():
    loop = asyncio.new_event_loop()
    try:
        check_loop(loop)
    finally:
        loop.close()
