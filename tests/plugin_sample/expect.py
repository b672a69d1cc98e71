"""What the sample tests expect: SAMPLE_EXPECT=zuvrs (the plugin on) or
asyncio (the plugin off, or --no-zuvrs)."""

import asyncio
import os


def check_loop(loop=None):
    import zuvrs

    loop = loop or asyncio.get_running_loop()
    expected = os.environ["SAMPLE_EXPECT"]
    if expected == "zuvrs":
        assert isinstance(loop, zuvrs.Loop), type(loop)
    else:
        assert isinstance(loop, asyncio.SelectorEventLoop), type(loop)
        assert not isinstance(loop, zuvrs.Loop), type(loop)
    return loop
