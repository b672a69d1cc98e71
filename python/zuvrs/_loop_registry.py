"""What zuvrs.stats needs to know of the loops, kept apart from both.

Whether new loops time their turns by default (zuvrs.stats.enable() sets
it, ZUVRS_STATS=1 at import), and the live loops with their numbers. The
loop module registers each loop here; zuvrs.stats reads and sets these
without importing the loop module, and importing zuvrs does not import
zuvrs.stats (its dataclasses cost milliseconds of start-up).
"""

import itertools
import os
import weakref
from typing import Any


def _stats_from_environment() -> bool:
    value = os.environ.get("ZUVRS_STATS", "").strip().lower()
    return value not in ("", "0", "no", "off", "false")


class _Registry:
    stats_default: bool = _stats_from_environment()


registry = _Registry()
live_loops: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
_numbers = itertools.count(1)


def register(loop: Any) -> None:
    """Numbers `loop` (1, 2, ... in order of creation) among the live loops."""
    live_loops[loop] = next(_numbers)
