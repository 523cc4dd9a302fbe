"""Optional dependencies, imported on demand with a one-line fix when they are missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from uqcompress.errors import DependencyError

ORT_HINT = "pip install 'uqcompress[cpu]' (or 'uqcompress[gpu]' on a CUDA machine; never both)"


def require_onnxruntime() -> ModuleType:
    """Import ONNX Runtime, which comes from the `cpu` or `gpu` extra, never the base install."""
    try:
        return importlib.import_module("onnxruntime")
    except ImportError as exc:
        raise DependencyError(
            "ONNX Runtime is not installed (it comes with an extra, not the base package)",
            hint=ORT_HINT,
        ) from exc
