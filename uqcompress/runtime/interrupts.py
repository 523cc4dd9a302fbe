"""Ctrl-C and SIGTERM, remembered from the first line of `main()` so that none is ever lost.

Python turns a signal into a KeyboardInterrupt raised wherever the main thread happens to
be. Raised inside a `__del__` it is only printed ("Exception ignored in ... __del__"), and a
library's `except BaseException` or half-finished import can swallow it too; the run would
then go on, install its artifact and exit 0. So the handler also records the signal here,
and the places that decide the outcome ask: the training loop at every step, the artifact
writer before it installs anything, and the CLI before it reports a result (exit 130).
Python's "Exception ignored" note for such a KeyboardInterrupt is silenced: it is not lost.

This module imports only `signal` and `sys`: `python -m uqcompress` installs the handler
before anything else is imported.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Any

_received: int | None = None  # the first signal that asked this process to stop
_next_unraisable = sys.unraisablehook


def install() -> None:
    """Route SIGINT and SIGTERM through `_handler` (main thread only, as `signal` requires)."""
    global _next_unraisable
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)
    if sys.unraisablehook is not _unraisable:
        _next_unraisable = sys.unraisablehook
        sys.unraisablehook = _unraisable


def _handler(signum: int, frame: FrameType | None) -> None:
    global _received
    if _received is None:
        _received = signum
    if signum == signal.SIGTERM:
        # SIGTERM takes the same clean-up path as Ctrl-C (temp dirs are removed on the way
        # out); later SIGTERMs are ignored so that they cannot interrupt that clean-up.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def _unraisable(unraisable: Any) -> None:
    # A KeyboardInterrupt raised inside a __del__ is recorded above and acted on by `check`;
    # Python's "Exception ignored in ... KeyboardInterrupt" note would only suggest otherwise.
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received is not None:
        return
    _next_unraisable(unraisable)


def interrupted() -> bool:
    """Whether SIGINT or SIGTERM arrived, even if its KeyboardInterrupt was lost."""
    return _received is not None


def check() -> None:
    """Raise KeyboardInterrupt if a signal arrived: call where a lost one must not be ignored."""
    if _received is not None:
        raise KeyboardInterrupt


def settle() -> None:
    """The outcome is decided: signals from now on are ignored (they must not turn the exit
    code into a kill by signal)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def reset() -> None:
    """Forget a recorded signal (for in-process callers such as tests)."""
    global _received
    _received = None
