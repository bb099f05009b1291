"""The clock of the benchmarks: one timed call, a stopwatch, and the median of interleaved repetitions.

Every benchmark times with these (wall clock, `time.perf_counter`), so that their figures mean the same thing. Run
from a checkout, `benchmarks/` is the script's folder and so on `sys.path`: `from timing import median_seconds`.
"""

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

Result = TypeVar("Result")


class Stopwatch:
    """Seconds since it was made."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.started


def timed(function: Callable[[], Result]) -> tuple[Result, float]:
    """`function()`'s result and the seconds the call took."""
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def median_seconds(runs: dict[str, Callable[[], object]], repetitions: int) -> dict[str, float]:
    """Median seconds per call of each callable: one untimed warm-up each (for training, Adam's state too), then
    interleaved repetitions in alternating order (A B, B A, ...: no callable always first)."""
    for run in runs.values():
        run()
    seconds = {name: [] for name in runs}
    for repetition in range(repetitions):
        for name in list(runs) if repetition % 2 == 0 else list(runs)[::-1]:
            start = time.perf_counter()
            runs[name]()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in seconds.items()}
