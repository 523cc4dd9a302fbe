"""This process's memory, read from /proc (Linux): what a memory test measures."""

from __future__ import annotations


def status(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM, RssFile, ...)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """VmHWM back to the current RSS, so the next read of it is the peak from here on."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
