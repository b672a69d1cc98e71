"""``uvloop.loop`` of the stand-in: only the loop class (suites check
``uvloop.loop.Loop`` for methods)."""

from zuvrs import Loop

__all__ = ("Loop",)
