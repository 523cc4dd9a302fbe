"""The `serve` extra (FastAPI, uvicorn), imported on demand with a one-line fix when missing,
as `runtime/deps.py` does for ONNX Runtime."""

from __future__ import annotations

import importlib
from types import ModuleType

from uqcompress.errors import DependencyError

SERVE_HINT = "pip install 'uqcompress[serve]'"


def require_serve() -> tuple[ModuleType, ModuleType]:
    """Import FastAPI and uvicorn, which come from the `serve` extra, never the base install."""
    modules = []
    for name in ("fastapi", "uvicorn"):
        try:
            modules.append(importlib.import_module(name))
        except ImportError as exc:
            raise DependencyError(
                f"uqc serve needs {name}, which is not installed (it comes with the serve "
                "extra, not the base package)",
                hint=SERVE_HINT,
            ) from exc
    return modules[0], modules[1]
