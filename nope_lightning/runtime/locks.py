"""Advisory file locks (``fcntl.flock``): held by an open file, so the kernel drops them when the holding
process dies, however it dies — a lock can never outlive a killed run.

``file_lock`` waits (short critical sections: creating a store's schema); ``hold_lock`` refuses at once and
names the holder (long ones: a process training into an out_dir).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def file_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created with its folder if needed), waiting for other holders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def hold_lock(path: str | Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` or raise ``ValueError`` at once, naming the process that holds it.

    ``what`` describes the locked thing in the error (e.g. ``out_dir=runs/x``). The holder's pid is written
    into the file for that message only; the lock itself is the ``flock``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise ValueError(f"{what} is in use by another process (pid {holder}); wait for it to finish or "
                             f"choose another folder") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()  # closing the file releases the lock
