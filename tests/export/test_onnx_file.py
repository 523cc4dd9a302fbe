"""`export/onnx_file.py`: the streamed writer produces the bytes `onnx_ir.save` writes, and the
skeleton reader the model `onnx.load` reads less its tensors' data, neither holding a copy
of the weights."""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from google.protobuf.message import DecodeError

from uqcompress.export import onnx_file
from uqcompress.export.onnx_file import STREAM_BYTES, read_skeleton, write_model


class _Mixed(torch.nn.Module):
    """Initializers of several dtypes and sizes: a float32 linear layer and embedding table
    (streamed), a float16 buffer (streamed), small ones (through protobuf)."""

    def __init__(self, width: int = 300) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, 200)
        self.table = torch.nn.Embedding(1000, 64)
        self.register_buffer("halves", torch.randn(200, width).half())
        self.register_buffer("small", torch.arange(4, dtype=torch.int64))

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        out = self.linear(x) + (self.halves.float() @ x.T).T
        return out + self.table(ids + self.small[0]).sum(-1, keepdim=True)


def _exported(width: int = 300) -> Any:
    """An onnx_ir model from the dynamo exporter, plus a transposed (non-contiguous) torch
    tensor with a doc string and metadata, and model metadata."""
    from torch.onnx._internal.exporter._core import TorchTensor

    torch.manual_seed(0)
    inputs = (torch.randn(2, width), torch.tensor([[1, 2], [3, 4]]))
    program = torch.onnx.export(_Mixed(width).eval(), inputs, dynamo=True, verbose=False)
    assert program is not None
    model = program.model
    tensor = TorchTensor(torch.randn(400, 300).T, "transposed")
    tensor.doc_string = "a transposed view"
    tensor.metadata_props["origin"] = "test"
    value = ir.Value(
        name="transposed",
        const_value=tensor,
        type=ir.TensorType(ir.DataType.FLOAT),
        shape=ir.Shape([300, 400]),
    )
    model.graph.register_initializer(value)
    model.metadata_props["uqc.test"] = "kept"
    return model


def test_written_bytes_equal_onnx_ir_save(tmp_path: Path) -> None:
    model = _exported()
    sizes = [v.const_value.nbytes for v in model.graph.initializers.values()]
    assert any(s >= STREAM_BYTES for s in sizes) and any(s < STREAM_BYTES for s in sizes)
    ir.save(model, tmp_path / "reference.onnx")
    write_model(model, tmp_path / "streamed.onnx")
    assert (tmp_path / "streamed.onnx").read_bytes() == (tmp_path / "reference.onnx").read_bytes()
    # the model is left as it was (no placeholder survives the write)
    assert not any(
        isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
    )
    loaded = onnx.load(str(tmp_path / "streamed.onnx"))
    onnx.checker.check_model(loaded)
    got = {t.name: onnx.numpy_helper.to_array(t) for t in loaded.graph.initializer}
    for value in model.graph.initializers.values():
        np.testing.assert_array_equal(got[value.name], value.const_value.numpy())


def test_writing_holds_no_copy_of_a_large_initializer(tmp_path: Path) -> None:
    """onnx_ir.save makes Python bytes of every tensor (tracemalloc sees them); the streamed
    writer writes from the tensor's own memory."""
    model = _exported(width=40_000)  # a 32 MB linear weight
    largest = max(v.const_value.nbytes for v in model.graph.initializers.values())
    assert largest >= 30_000_000
    tracemalloc.start()
    try:
        write_model(model, tmp_path / "streamed.onnx")
        _, streamed_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        ir.save(model, tmp_path / "reference.onnx")
        _, reference_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reference_peak > largest  # the measure sees a copy where there is one
    assert streamed_peak < largest / 10


def test_skeleton_is_the_model_without_tensor_data(tmp_path: Path) -> None:
    model = _exported()
    write_model(model, tmp_path / "model.onnx")
    full = onnx.load(str(tmp_path / "model.onnx"))
    for tensor in full.graph.initializer:
        assert tensor.HasField("raw_data")
        tensor.ClearField("raw_data")
    skeleton = read_skeleton(tmp_path / "model.onnx")
    assert skeleton == full
    assert {p.key: p.value for p in skeleton.metadata_props}["uqc.test"] == "kept"


def test_skeleton_keeps_external_data_references(tmp_path: Path) -> None:
    model = _exported()
    ir.save(model, tmp_path / "model.onnx", external_data="model.onnx.data")
    want = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    for tensor in want.graph.initializer:  # small ones stay inline: their data is dropped
        tensor.ClearField("raw_data")
    skeleton = read_skeleton(tmp_path / "model.onnx")
    assert skeleton == want
    external = [
        t for t in skeleton.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
    ]
    assert external and all(
        {e.key for e in t.external_data} >= {"location", "offset", "length"} for t in external
    )


def test_reading_a_skeleton_holds_no_copy_of_the_weights(tmp_path: Path) -> None:
    model = _exported(width=40_000)
    write_model(model, tmp_path / "model.onnx")
    size = (tmp_path / "model.onnx").stat().st_size
    tracemalloc.start()
    try:
        read_skeleton(tmp_path / "model.onnx")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size / 20


@pytest.mark.parametrize(
    "content",
    [
        b"not a protobuf at all",
        b"\x3a\xff\xff\xff\x0f",
        b"\x3a\xff\xff\xff\xff\xff\xff\xff\xff\x0f",
        b"\x62\xff\xff\xff\xff\xff\xff\xff\xff\x0f",
        b"\x0b\x00",
    ],
    ids=[
        "text",
        "length past the end",
        "a graph of 2**63 bytes",
        "a string of 2**63 bytes (not allocated)",
        "group wire type",
    ],
)
def test_a_file_that_is_not_onnx_is_an_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises((DecodeError, ValueError)):
        read_skeleton(path)


def test_varints_round_trip() -> None:
    for value in (0, 1, 127, 128, 300, 2**31, 2**63 - 1):
        encoded = onnx_file._varint(value)
        stream = io.BytesIO(encoded)
        assert onnx_file._read_stream_varint(stream) == value
        assert stream.tell() == len(encoded)


@pytest.mark.parametrize(("free", "errno_expected"), [(0, 28), (1 << 40, None)])
def test_a_short_write_on_a_full_disk_is_enospc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free: int, errno_expected: int | None
) -> None:
    """numpy's tofile reports a short write without an errno: with the disk full it becomes
    ENOSPC (which the CLI turns into one line); with space left it stays as it was."""
    import shutil
    from collections import namedtuple

    from torch.onnx._internal.exporter._core import TorchTensor

    model = _exported()

    def short_write(self: Any, file: Any) -> None:
        raise OSError("Not enough free space to write 480000 bytes after offset 0")

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(TorchTensor, "tofile", short_write)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 41, 0, free))
    with pytest.raises(OSError, match=r"No space left|Not enough free space") as raised:
        write_model(model, tmp_path / "full.onnx")
    assert raised.value.errno == errno_expected
