"""zuvrs.run(): asyncio.run() on a zuvrs loop, on every supported Python."""

import asyncio
import sys

__all__ = ("run",)


def run(main, *, debug=None):
    """Run coroutine ``main`` on a new zuvrs loop and return its result,
    with the semantics of asyncio.run() (Ctrl-C cancels the main task,
    async generators and the default executor are shut down, the loop is
    closed)."""
    from . import new_event_loop

    if asyncio.events._get_running_loop() is not None:
        raise RuntimeError("zuvrs.run() cannot be called from a running event loop")
    if sys.version_info >= (3, 11):
        with asyncio.Runner(debug=debug, loop_factory=new_event_loop) as runner:
            return runner.run(main)
    return _run_310(main, debug, new_event_loop)


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
