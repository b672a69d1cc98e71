"""Ratios of two loops paired within rounds, with a bootstrap interval.

The benchmark tools run every loop once per round, in an order that
changes from round to round. What the machine does meanwhile (other
guests on the host, the kernel's state) moves every loop of a round
together, so one loop's samples spread by 10-20% while the ratio of two
loops within a round spreads much less. The median of those ratios, with a
95% bootstrap interval, tells differences of a few per cent apart where a
ratio of medians (whose min/max spread compare.py also prints) cannot.
"""

from __future__ import annotations

import random
import statistics
from typing import List, Optional, Sequence, Tuple

#: Bootstrap resamples (the interval's ends move by well under 0.5% between
#: seeds at this count).
RESAMPLES = 2000


def paired_ratio(a: Sequence[Optional[float]], b: Sequence[Optional[float]]) -> Optional[Tuple[float, float, float]]:
    """(median, low, high) of a[i] / b[i] over the rounds where both have a
    figure; None with fewer than two such rounds. The interval is the
    95% bootstrap one of the median (seeded: the same samples give the same
    interval)."""
    ratios = [x / y for x, y in zip(a, b) if x is not None and y]
    if len(ratios) < 2:
        return None
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(RESAMPLES))
    return statistics.median(ratios), boot[len(boot) // 40], boot[-1 - len(boot) // 40]


def fmt_paired(p: Optional[Tuple[float, float, float]], digits: int = 3) -> str:
    """``1.234 [1.200-1.260]``, or "" for no pairs."""
    if p is None:
        return ""
    m, lo, hi = p
    return f"{m:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"


def rounds_figures(rounds: List[dict], key: object) -> List[Optional[float]]:
    """One key's figure per round (None where its sample failed)."""
    return [r.get(key) for r in rounds]
