"""A benchmark script's command line, parsed as the script parses it: the shared steps of the
scripts' option tests (tests/benchmarks/test_*_options.py)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def benchmark(name: str) -> ModuleType:
    """The script benchmarks/NAME.py as a module (the scripts import one another by name)."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module(name)


def parsed(
    script: ModuleType, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> argparse.Namespace:
    """`script.parse_args()` on `argv`."""
    monkeypatch.setattr(sys, "argv", [f"{script.__name__}.py", *argv])
    return script.parse_args()  # type: ignore[no-any-return]


def refusal(script: ModuleType, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """What `script.parse_args()` exits with on `argv` (the test fails if it does not exit)."""
    with pytest.raises(SystemExit) as stopped:
        parsed(script, argv, monkeypatch)
    return str(stopped.value.code)
