"""zuvrs.run(): asyncio.run() on a zuvrs loop, on every supported Python."""

import asyncio
import sys

__all__ = ("run",)


def run(main, *, loop_factory=None, debug=None):
    """Run coroutine ``main`` on a new zuvrs loop and return its result,
    with the semantics of asyncio.run() (Ctrl-C cancels the main task,
    async generators and the default executor are shut down, the loop is
    closed).

    ``loop_factory`` makes the loop instead of ``zuvrs.new_event_loop`` (a
    subclass of zuvrs.Loop, say), as with ``uvloop.run``; a loop that is not
    a zuvrs loop is refused with TypeError, as uvloop refuses one that is
    not its own.
    """
    from . import Loop, new_event_loop

    if asyncio.events._get_running_loop() is not None:
        raise RuntimeError("zuvrs.run() cannot be called from a running event loop")
    if loop_factory is None:
        loop_factory = new_event_loop
    elif asyncio.iscoroutine(main):
        main = _checked(main, Loop)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(debug=debug, loop_factory=loop_factory) as runner:
            return runner.run(main)
    return _run_310(main, debug, loop_factory)


async def _checked(main, loop_class):
    """``main`` awaited once the loop is known to be a zuvrs loop."""
    if not isinstance(asyncio.get_running_loop(), loop_class):
        main.close()
        raise TypeError("zuvrs.run() uses a non-zuvrs event loop")
    return await main


def _run_310(main, debug, new_event_loop):
    # Python 3.10 has no asyncio.Runner: mirror its asyncio.run().
    from asyncio import coroutines, events, tasks

    if not coroutines.iscoroutine(main):
        raise ValueError(f"a coroutine was expected, got {main!r}")
    loop = new_event_loop()
    try:
        events.set_event_loop(loop)
        if debug is not None:
            loop.set_debug(debug)
        return loop.run_until_complete(main)
    finally:
        try:
            pending = tasks.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(tasks.gather(*pending, return_exceptions=True))
                for task in pending:
                    if task.cancelled():
                        continue
                    if task.exception() is not None:
                        loop.call_exception_handler(
                            {
                                "message": "unhandled exception during asyncio.run() shutdown",
                                "exception": task.exception(),
                                "task": task,
                            }
                        )
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            events.set_event_loop(None)
            loop.close()
