"""Who owns an MLflow run: the process that opened or continued it, named ``host:pid:start time`` (the value of
every run's ``nope_lightning.owner`` tag), and whether that process still runs. A run whose owner died is closed
as KILLED, never left RUNNING (``tracking.close_dead_runs``)."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (with the pid, unique for the machine's uptime);
    empty where /proc does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2:].split()[19]


def owner(pid: int | None = None) -> str:
    """``host:pid:start time`` of process ``pid`` (default: this one), the value of every run's
    ``nope_lightning.owner`` tag."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def owner_alive(value: str) -> bool:
    """Whether the process an owner tag names still runs (an owner on another host is assumed alive)."""
    host, _, rest = value.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    if started:
        return _start_time(int(pid)) == started
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
