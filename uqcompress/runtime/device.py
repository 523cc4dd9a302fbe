"""Resolve `--device` and `--threads` once, the same way for every step."""

from __future__ import annotations

import os

from uqcompress.errors import ConfigError

DEFAULT_THREADS = 1  # measured: CPU training with 1 torch thread beat 2 on 2-core machines
# More threads than cores only adds contention; far more (measured: --threads 100000) makes
# OpenBLAS / OpenMP fail to allocate per-thread buffers and kill the process (exit 139).
THREADS_PER_CORE_LIMIT = 4


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS / Windows have no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def max_threads() -> int:
    """The most `--threads` accepted: THREADS_PER_CORE_LIMIT x the usable cores."""
    return THREADS_PER_CORE_LIMIT * usable_cores()


def resolve_device(requested: str) -> str:
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'; 'cuda[:N]' must exist."""
    import torch

    value = requested.strip().lower()
    if value == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if value == "cpu":
        return "cpu"
    if value == "cuda" or value.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"--device {requested}: no CUDA device is visible to torch",
                hint="use --device cpu (or auto), or install a CUDA build of torch",
            )
        index = value.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise ConfigError(
                f"--device {requested}: torch sees {torch.cuda.device_count()} CUDA device(s)",
                hint="use --device cuda:0 .. cuda:N-1",
            )
        return value
    raise ConfigError(f"unknown --device {requested!r}", hint="use auto, cpu, cuda or cuda:N")


def configure_threads(threads: int | None) -> int:
    """Set torch's intra-op threads (default 1, or $UQC_THREADS); returns the value used.

    Refuses more than `max_threads()` (4 x the usable cores) rather than clamping: a number
    that large is a typo or a misunderstanding, and silently running with fewer would hide it.
    """
    import torch

    flag = f"--threads {threads}"
    if threads is None:
        env = os.environ.get("UQC_THREADS", "").strip()
        if env and (not env.isdigit() or int(env) < 1):
            raise ConfigError(
                f"UQC_THREADS={env!r} is not a positive integer",
                hint="set UQC_THREADS=1 (or unset it), or pass --threads N",
            )
        threads = int(env) if env else DEFAULT_THREADS
        flag = f"UQC_THREADS={threads}"
    if threads < 1:
        raise ConfigError(f"--threads {threads} must be at least 1", hint="pass --threads 1")
    limit = max_threads()
    if threads > limit:
        raise ConfigError(
            f"{flag} is more than {limit} ({THREADS_PER_CORE_LIMIT} x the {usable_cores()} "
            "CPU cores this process may use)",
            hint=f"use 1 to {limit} threads (--threads or UQC_THREADS); 1 to {usable_cores()} "
            "is usually fastest",
        )
    torch.set_num_threads(threads)
    return threads
