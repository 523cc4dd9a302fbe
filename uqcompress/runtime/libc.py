"""The C library's own memory calls (glibc on Linux: `madvise`, `mallopt`), for the few
places that hand memory back to the system. Torch-free: the runtime distribution uses it."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import cache
from typing import Any


@cache
def libc_function(name: str, argtypes: tuple[Any, ...]) -> Any:
    """libc's function `name` taking `argtypes` and returning an int, or None where there is
    none to call (not Linux, no such function: musl, another C library)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(
            ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True), name
        )
    except (OSError, AttributeError):
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function
