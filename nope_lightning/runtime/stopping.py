"""Stopping on a signal: Ctrl-C (SIGINT), SIGTERM and SIGHUP end a command with one line of ours and exit code
128 + the signal (130, 143, 129), never a traceback.

Outside a training loop the signal raises ``Stopped`` at once (a ``SystemExit``, so nothing prints a traceback
for it). Inside one, ``training.trainer.StepBoundarySignals`` only records it (``defer``) and the Trainer stops
at the start of its next step, on every rank at the same place; a repeated signal stops at once. What the line
says is noted here while the command runs: where it is (``at``: a pipeline's step), and what a rerun resumes
(``out_dir``: the folder a training step writes its checkpoints to, or ``note``: the sentence a step's own
process wrote before it stopped).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: A signal this long (s) after the first is a second request, which stops at once. One stop often arrives
#: twice within it: ``timeout`` signals its command and then the command's group, Ctrl-C reaches every rank
#: and rank 0 forwards it to the ranks it launched.
REPEAT_S = 1.0


class Stopped(SystemExit):
    """A command stopped by signal ``signum``; exits with 128 + ``signum`` (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


@dataclass
class StopState:
    """What this process knows of its stop: the signals it received, in order, and what the stop line says
    (``note``: the sentence, or what makes it when the stop comes, e.g. from the newest checkpoint's step)."""

    signals: list[int]
    first_at: float = 0.0
    at: str = ""
    out_dir: Path | None = None
    note: str | Callable[[], str] = ""


STATE = StopState(signals=[])


def begin() -> None:
    """A command starts unstopped: forget the signals and notes of a command this process ran before (the tests
    call ``cli.main`` many times in one process)."""
    STATE.signals.clear()
    STATE.first_at, STATE.at, STATE.out_dir, STATE.note = 0.0, "", None, ""


def at(where: str) -> None:
    """This command now runs ``where`` (a pipeline's step): a stop names it, and what that step resumes."""
    STATE.at, STATE.out_dir, STATE.note = where, None, ""


def received() -> int | None:
    """The first stop signal this process received; None if none."""
    return STATE.signals[0] if STATE.signals else None


def exit_code() -> int:
    """128 + the first stop signal (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + (received() or signal.SIGTERM)


def _raise(signum: int, frame) -> None:
    if not STATE.signals:
        STATE.first_at = time.monotonic()
    STATE.signals.append(signum)
    raise Stopped(signum)


def defer(signum: int) -> None:
    """Record ``signum`` for a caller that stops at its next safe point; a second request (``REPEAT_S``) raises
    ``Stopped``."""
    now = time.monotonic()
    if not STATE.signals:
        STATE.first_at = now
    STATE.signals.append(signum)
    if now - STATE.first_at > REPEAT_S:
        raise Stopped(signum)


@contextlib.contextmanager
def _handling(handler) -> Iterator[None]:
    """``handler`` for every stop signal within the block; only the main thread can install handlers,
    elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def signals_raise() -> contextlib.AbstractContextManager[None]:
    """Within the block, a stop signal raises ``Stopped`` (SIGTERM's and SIGHUP's defaults kill Python without
    unwinding, SIGINT's KeyboardInterrupt prints a traceback), so the caller can clean up."""
    return _handling(_raise)


def shielded() -> contextlib.AbstractContextManager[None]:
    """Within the block, stop signals are only recorded: cleanup after a stop (killing a step's processes,
    marking runs KILLED) runs to its end when Ctrl-C is pressed again."""
    return _handling(lambda signum, frame: STATE.signals.append(signum))


def stop_line(stage: str, note: str) -> str:
    """The one line a stopped command prints: where it stopped, what is kept, and what a rerun does."""
    if STATE.at:  # a pipeline's step
        return (f"nope-lightning: stopped at {STATE.at}; finished steps are kept; rerun the same command to "
                f"resume — this step {note}")
    return f"nope-lightning: stopped {stage}; rerun the same command to resume — it {note}"
