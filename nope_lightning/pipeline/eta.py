"""The pipeline's clock for the whole study: how long it has run, how long its remaining steps will take, and how
fast it goes against the estimate (``pipeline.estimate``, seconds of the development machine).

The time left is each remaining step's estimate times the measured pace: measured / estimated seconds over the
steps this run has finished, of the step's own stage when one of its stage has finished (a cost model can be right
for pre-training and off for evaluations), else over every stage; 1 before any step has finished. A step the store
had finished (skipped, reused) takes no time and counts as done. So a slower machine, or one other work shares,
lengthens the ETA from its first measured step on; the line then says so, with the load, when the 1-minute load
average exceeds the cores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from nope_lightning.runtime.progress import busy_note, duration


class StudyClock:
    """``plan``: the dry run's entries in run order (``stage``, ``estimate_s`` in seconds or None); ``clock`` in
    seconds, ``load`` as ``os.getloadavg``, ``cores`` the cores the study's steps use."""

    def __init__(self, plan: list[dict], clock: Callable[[], float] = time.perf_counter,
                 load: Callable[[], tuple] = os.getloadavg, cores: int | None = None) -> None:
        self.stages = [entry["stage"] for entry in plan]
        self.estimates = [entry["estimate_s"] for entry in plan]
        self.clock, self.load, self.cores = clock, load, cores or os.cpu_count() or 1
        self.start = clock()
        self.done: set[int] = set()
        self.measured: dict[int, float] = {}  # step index -> seconds it ran here

    def skipped(self, index: int) -> None:
        """Step ``index`` (0-based) needed no compute: the store had finished it."""
        self.done.add(index)

    def finished(self, index: int, seconds: float) -> str:
        """Step ``index`` ran ``seconds``: recorded; ``done in 812 s (estimate 13 min, 1.03x)``."""
        self.done.add(index)
        self.measured[index] = seconds
        estimate = self.estimates[index]
        if not estimate:
            return f"done in {duration(seconds)} (no estimate)"
        return f"done in {duration(seconds)} (estimate {duration(estimate)}, {seconds / estimate:.2f}x)"

    def pace(self, stage: str | None = None) -> float:
        """Measured / estimated seconds over the finished steps (of ``stage`` when it has one), else 1."""
        timed = [i for i in self.measured if self.estimates[i]]
        own = [i for i in timed if self.stages[i] == stage]
        steps = own or timed
        if not steps:
            return 1.0
        return sum(self.measured[i] for i in steps) / sum(self.estimates[i] for i in steps)

    def left(self) -> float:
        """Seconds the steps not done will take at the measured pace (those without an estimate: 0)."""
        return sum(self.estimates[i] * self.pace(self.stages[i]) for i in range(len(self.estimates))
                   if i not in self.done and self.estimates[i])

    def status(self) -> str:
        """``study 14 min in, ~1 h 20 min left (2 of 56 steps done; pace 1.30x the estimate)`` and, when the
        1-minute load average exceeds the cores, ``; machine busy: load 3.6 on 2 cores, ETA follows ...``."""
        pace = f"pace {self.pace():.2f}x the estimate" if self.measured else "no step timed yet"
        line = (f"study {duration(self.clock() - self.start)} in, ~{duration(self.left())} left "
                f"({len(self.done)} of {len(self.estimates)} steps done; {pace})")
        return "; ".join(filter(None, [line, busy_note(self.cores, self.load)]))
