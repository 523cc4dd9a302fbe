"""Which floating-point type a step computes a model in (`--dtype`).

float32 is the default and what every step did before `--dtype` existed. bfloat16 halves the
weights' memory and is fast on CPUs with AVX-512 BF16 / AMX; float16 is for GPUs. `auto`
takes the checkpoint's own dtype for decoders above `AUTO_HALF_ABOVE` parameters (a 7B model
in float32 needs 28 GB before its first step) and float32 for everything else, where the
memory does not matter and float32 is the more precise.

This module reads only config.json and the safetensors headers (no weights, no torch at
import), so a step can resolve `auto` when it plans its artifact id.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16", "float16", "auto")
HALF = ("bfloat16", "float16")
# Two computations of the same function (pruned vs gated, fused vs members) that sum in
# another order, each rounding to an 8-bit (bfloat16) or 11-bit (float16) mantissa, differ by
# up to these (probabilities and logits); a surgery bug still moves the outputs by O(1).
HALF_PARITY_ATOL = {"bfloat16": 3e-2, "float16": 4e-3}
AUTO_HALF_ABOVE = 1_000_000_000  # parameters; a decoder above this keeps its stored dtype
DTYPE_HELP = (
    "Compute dtype: float32, bfloat16, float16 or auto (the checkpoint's own dtype for "
    "decoders above 1B parameters, else float32)."
)


def stored_dtype(config: Any) -> str | None:
    """The dtype a transformers config says its weights are stored in ("bfloat16"), if any."""
    raw = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if raw is None:
        return None
    text = str(raw).removeprefix("torch.")
    return text if text in ("float32", *HALF) else None


def parameter_count(directory: Path) -> int | None:
    """Elements in the floating-point tensors of a checkpoint's safetensors files, from
    their headers alone (safetensors maps the file; no tensor is read); None without
    readable safetensors."""
    from safetensors import SafetensorError, safe_open

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        try:
            with safe_open(str(file), "np") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                    piece = handle.get_slice(name)
                    if piece.get_dtype().startswith(("F", "BF")):
                        total += math.prod(piece.get_shape())
        except (OSError, SafetensorError):
            return None
    return total


def resolve_dtype(requested: str, directory: Path, config: Any, decoder: bool) -> str:
    """The dtype `requested` means for the checkpoint in `directory`: itself unless `auto`,
    which is the stored half dtype for a decoder above `AUTO_HALF_ABOVE` parameters, else
    float32."""
    if requested != "auto":
        return requested
    stored = stored_dtype(config)
    if not decoder or stored not in HALF:
        return "float32"
    count = parameter_count(directory)
    return stored if count is not None and count > AUTO_HALF_ABOVE else "float32"


def torch_dtype(name: str) -> Any:
    """The torch dtype of a resolved dtype name ("bfloat16" -> torch.bfloat16)."""
    import torch

    found = getattr(torch, name, None)
    if name not in ("float32", *HALF) or not isinstance(found, torch.dtype):
        raise ValueError(f"dtype {name!r} is not one of float32, bfloat16, float16")
    return found


def parity_atol(dtype: str, float32_atol: float) -> float:
    """The tolerance of a parity check computed in `dtype`: `float32_atol` in float32, the
    half dtype's round-off otherwise (never tighter than `float32_atol`)."""
    return max(HALF_PARITY_ATOL.get(dtype, float32_atol), float32_atol)
