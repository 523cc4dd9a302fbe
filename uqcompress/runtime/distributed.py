"""Who am I in a multi-process launch (`torchrun`, `accelerate launch`)? Read from the
environment those launchers set, so it works before any process group exists."""

from __future__ import annotations

import os


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def is_main_process() -> bool:
    """Rank 0 writes artifacts and prints results; the other ranks only compute."""
    return rank() == 0
