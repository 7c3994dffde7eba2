"""Who owns an MLflow run: the process that opened or continued it, named ``host:pid:start time`` (the value of
every run's ``nope_lightning.owner`` tag), and whether that process still runs. A run whose owner died is closed
as KILLED, never left RUNNING (``tracking.close_dead_runs``). And what machine it ran on (``machine``): two
machines can train different models from one config and seed (their CPUs' floating-point kernels differ), so a run
says where its numbers came from."""

from __future__ import annotations

import contextlib
import os
import platform
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


def machine() -> str:
    """The machine a run's numbers come from: CPU model (family and model number, which a virtual machine's bare
    model name hides) and core count, torch version with the vector instructions its CPU kernels dispatch to, intra-op
    threads and the accelerator, e.g. ``"AMD EPYC (family 26, model 2) x2; torch 2.14.1+cpu (AVX512); 1 thread; no
    GPU"`` (the value of every run's ``nope_lightning.machine`` tag)."""
    import torch  # here, not at the top: the owner helpers serve light paths (a stop, a store check) too

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, KeyError):  # Linux: the first processor's block of /proc/cpuinfo
        block = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
        info = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        info = {key.strip(): value.strip() for key, value in info.items()}
        cpu = f"{info['model name']} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"
    threads = torch.get_num_threads()
    gpu = _gpus() if torch.cuda.is_available() else "no GPU"
    return (f"{cpu} x{os.cpu_count()}; torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}); "
            f"{threads} thread{'s' * (threads != 1)}; {gpu}")


def _gpus(driver: Path = Path("/proc/driver/nvidia/gpus")) -> str:
    """The CUDA devices, by model where the NVIDIA driver lists them in /proc (``"NVIDIA H200 x1"``), else by count:
    torch would name them only by initialising CUDA, which a store check or a report run should not do."""
    import torch

    names = [line.split(":", 1)[1].strip() for info in sorted(driver.glob("*/information"))
             for line in info.read_text().splitlines() if line.startswith("Model:")]
    if not names:
        return f"{torch.cuda.device_count()} CUDA device(s)"
    return ", ".join(f"{name} x{names.count(name)}" for name in dict.fromkeys(names))
