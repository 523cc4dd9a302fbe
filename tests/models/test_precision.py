"""models.precision: what `--dtype auto` resolves to, from config.json and safetensors headers."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from uqcompress.models.precision import (
    AUTO_HALF_ABOVE,
    parameter_count,
    resolve_dtype,
    stored_dtype,
    torch_dtype,
)


def _header_only_checkpoint(directory: Path, shapes: dict[str, tuple[list[int], str]]) -> Path:
    """A safetensors file whose tensors are declared at `shapes` and never written: the file
    is sparse (its data a hole), so a 1B-parameter checkpoint costs a few kB of disk."""
    directory.mkdir(parents=True, exist_ok=True)
    size = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8}
    header, offset = {}, 0
    for name, (shape, dtype) in shapes.items():
        end = offset + size[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header).encode()
    path = directory / "model.safetensors"
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        handle.truncate(8 + len(raw) + offset)
    return directory


def test_parameter_count_reads_float_tensors_from_headers(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file(
        {
            "w": torch.zeros(3, 4),
            "b": torch.zeros(5, dtype=torch.bfloat16),
            "ids": torch.zeros(7, dtype=torch.int64),
        },
        str(tmp_path / "model.safetensors"),
    )
    assert parameter_count(tmp_path) == 3 * 4 + 5  # integer buffers are not weights
    assert parameter_count(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("decoder", "stored", "count", "expected"),
    [
        (True, "bfloat16", AUTO_HALF_ABOVE + 1, "bfloat16"),  # a large decoder keeps its dtype
        (True, "float16", AUTO_HALF_ABOVE + 1, "float16"),
        (True, "bfloat16", AUTO_HALF_ABOVE, "float32"),  # not above 1B
        (False, "bfloat16", AUTO_HALF_ABOVE + 1, "float32"),  # encoders: float32
        (True, "float32", AUTO_HALF_ABOVE + 1, "float32"),
        (True, None, AUTO_HALF_ABOVE + 1, "float32"),
    ],
)
def test_auto_keeps_half_precision_only_for_large_decoders(
    tmp_path: Path, decoder: bool, stored: str | None, count: int, expected: str
) -> None:
    directory = _header_only_checkpoint(tmp_path / "ckpt", {"w": ([count], "BF16")})
    config = SimpleNamespace(dtype=stored)
    assert resolve_dtype("auto", directory, config, decoder=decoder) == expected
    assert resolve_dtype("float16", directory, config, decoder=decoder) == "float16"


def test_stored_dtype_and_torch_dtype() -> None:
    assert stored_dtype(SimpleNamespace(dtype=torch.bfloat16)) == "bfloat16"
    assert stored_dtype(SimpleNamespace(torch_dtype="float16")) == "float16"
    assert stored_dtype(SimpleNamespace()) is None
    assert torch_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="not one of"):
        torch_dtype("auto")
