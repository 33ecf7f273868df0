"""Side-by-side timing helpers shared by the benchmarks (interleaved runs, median)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def compare(
    fns: dict[str, Callable[[], object]],
    *,
    rounds: int = 7,
    inner: int = 5,
    warmup: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median seconds per call of each function, measured in interleaved rounds.

    Interleaving (A B C A B C ...) spreads machine noise evenly over the candidates, so
    their ratios are more trustworthy than their absolute times. ``clock`` is wall time by
    default; with one torch thread, ``time.thread_time`` (CPU time of the calling thread)
    leaves out the time other processes take the core away, on a shared machine.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = clock()
            for _ in range(inner):
                fn()
            samples[name].append((clock() - start) / inner)
    return {name: statistics.median(s) for name, s in samples.items()}
