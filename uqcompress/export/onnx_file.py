"""ONNX files without a second copy of their weights in memory.

`onnx.save` and `onnx.load` hold a model's weights twice or more while they work: saving
builds a ModelProto (one copy of every tensor) and then its serialized bytes (another);
loading reads the file's bytes and parses them into a proto. For a 1.4 GB graph that was
4 GB of peak memory over the model itself (measured on a Qwen2.5-0.5B shape), and for a
7B model it decides whether the machine can export at all.

- `write_model` writes an onnx_ir model as one self-contained `.onnx` file, streaming each
  large initializer's bytes from the tensor's own memory into the file. The bytes written
  are the ones `onnx_ir.save` writes (tested byte for byte): the same protobuf message, in
  protobuf's field order.
- `read_skeleton` reads an `.onnx` file's structure (graph, metadata, every initializer's
  name, type, shape and external-data entries) without reading any tensor's data.

Both walk the protobuf wire format (varint tags and length prefixes) for the two or three
messages that hold tensors (ModelProto -> GraphProto -> TensorProto) and leave everything
else to the protobuf library.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

# Field numbers from onnx.proto (stable since the format's first release).
_MODEL_GRAPH = 7  # ModelProto.graph
_GRAPH_INITIALIZER = 5  # GraphProto.initializer
_TENSOR_RAW_DATA = 9  # TensorProto.raw_data
# TensorProto's data fields: float_data, int32_data, string_data, int64_data, raw_data,
# double_data, uint64_data. A skeleton drops them all.
_TENSOR_DATA = frozenset({4, 5, 6, 7, 9, 10, 11})
_LENGTH_DELIMITED = 2
# Initializers at least this large are streamed; smaller ones go through protobuf (a copy of
# a few KiB is cheaper than a write call).
STREAM_BYTES = 64 * 1024
# A placeholder location for the tensors being streamed: protobuf serializes them as external
# references (no data), and the writer puts their bytes in place of the reference.
_PLACEHOLDER = "uqc-streamed-initializer"


# --------------------------------------------------------------------------- wire format


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _fields(data: bytes) -> Iterator[tuple[int, int, int, int]]:
    """(field number, start, payload start, end) of each top-level field of a serialized
    message; for a length-delimited field the payload is `data[payload start:end]`."""
    stream = io.BytesIO(data)
    while (start := stream.tell()) < len(data):
        key = _read_stream_varint(stream)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _read_stream_varint(stream)
            payload = end = stream.tell()
        elif wire_type in (1, 5):
            payload = stream.tell()
            end = payload + (8 if wire_type == 1 else 4)
        elif wire_type == _LENGTH_DELIMITED:
            length = _read_stream_varint(stream)
            payload = stream.tell()
            end = payload + length
        else:  # groups (3, 4): deprecated, and not in onnx.proto
            raise ValueError(f"unsupported protobuf wire type {wire_type}")
        yield field, start, payload, end
        stream.seek(end)


# --------------------------------------------------------------------------- writing


class _Streamed:
    """A tensor's bytes, written by the tensor itself (`tofile`) when the file is."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor
        self.size = int(tensor.nbytes)


_Piece = bytes | _Streamed


def _size(pieces: list[_Piece]) -> int:
    return sum(p.size if isinstance(p, _Streamed) else len(p) for p in pieces)


def _delimited(field: int, pieces: list[_Piece]) -> list[_Piece]:
    return [_tag(field, _LENGTH_DELIMITED) + _varint(_size(pieces)), *pieces]


def _streamable(tensor: Any) -> bool:
    import onnx_ir as ir

    if tensor is None or isinstance(tensor, ir.ExternalTensor | ir.StringTensor):
        return False
    if type(tensor).__name__ == "TensorProtoTensor":  # serialized verbatim from its proto
        return False
    return int(tensor.nbytes) >= STREAM_BYTES


def write_model(model: Any, path: Path) -> None:
    """Write the onnx_ir `model` to `path` as one `.onnx` file (initializers inline), the
    same bytes as `onnx_ir.save(model, path)` without its copies of the weights. The model is
    left as it was."""
    import onnx_ir as ir

    streamed: dict[str, Any] = {}
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if _streamable(tensor):
            streamed[value.name] = tensor
    try:
        for value in model.graph.initializers.values():
            if value.name in streamed:
                tensor = streamed[value.name]
                value.const_value = ir.ExternalTensor(
                    _PLACEHOLDER,
                    0,
                    int(tensor.nbytes),
                    tensor.dtype,
                    shape=tensor.shape,
                    name=value.name,
                    doc_string=tensor.doc_string,
                    metadata_props=dict(tensor.metadata_props),
                )
        skeleton = ir.serde.serialize_model(model).SerializeToString()
    finally:
        for value in model.graph.initializers.values():
            if value.name in streamed:
                value.const_value = streamed[value.name]
    pieces = _model_pieces(skeleton, streamed)
    with path.open("wb") as handle:
        for piece in pieces:
            if isinstance(piece, _Streamed):
                start = handle.tell()
                try:
                    piece.tensor.tofile(handle)
                except OSError as exc:
                    raise _with_errno(exc, path, piece.size) from exc
                if handle.tell() - start != piece.size:  # a tensor type we did not foresee
                    raise RuntimeError(
                        f"initializer {piece.tensor.name!r} wrote {handle.tell() - start} "
                        f"bytes, expected {piece.size}"
                    )
            else:
                handle.write(piece)


def _with_errno(exc: OSError, path: Path, size: int) -> OSError:
    """numpy's `tofile` reports a short write ("Not enough free space to write ...") without
    an errno; a full disk gets ENOSPC, so the CLI says it in one line as for any writer."""
    import errno
    import shutil

    if exc.errno is None and shutil.disk_usage(path.parent).free < size:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return exc


def _model_pieces(model: bytes, streamed: dict[str, Any]) -> list[_Piece]:
    pieces: list[_Piece] = []
    for field, start, payload, end in _fields(model):
        if field == _MODEL_GRAPH:
            pieces += _delimited(_MODEL_GRAPH, _graph_pieces(model[payload:end], streamed))
        else:
            pieces.append(model[start:end])
    return pieces


def _graph_pieces(graph: bytes, streamed: dict[str, Any]) -> list[_Piece]:
    import onnx

    pieces: list[_Piece] = []
    for field, start, payload, end in _fields(graph):
        if field != _GRAPH_INITIALIZER:
            pieces.append(graph[start:end])
            continue
        header = graph[payload:end]
        name = onnx.TensorProto.FromString(header).name
        if name not in streamed:
            pieces.append(graph[start:end])
            continue
        pieces += _delimited(_GRAPH_INITIALIZER, _tensor_pieces(header, streamed[name]))
    return pieces


def _tensor_pieces(header: bytes, tensor: Any) -> list[_Piece]:
    """The TensorProto of a streamed tensor: its placeholder's fields without the external
    reference (external_data, data_location), and raw_data in field order."""
    import onnx

    proto = onnx.TensorProto.FromString(header)
    proto.ClearField("external_data")
    proto.ClearField("data_location")
    fields = proto.SerializeToString()
    data = _Streamed(tensor)
    raw: list[_Piece] = [_tag(_TENSOR_RAW_DATA, _LENGTH_DELIMITED) + _varint(data.size), data]
    pieces: list[_Piece] = []
    for field, start, _, end in _fields(fields):
        if field > _TENSOR_RAW_DATA and raw:
            pieces += raw
            raw = []
        pieces.append(fields[start:end])
    return pieces + raw


# --------------------------------------------------------------------------- reading


def read_skeleton(path: Path | str) -> Any:
    """The ModelProto of an `.onnx` file without its tensors' data: every initializer keeps
    its name, type, shape and external-data entries, and loses raw_data (and the typed data
    fields). Reads the file in small pieces and skips over the data, so memory does not grow
    with the weights. Raises `google.protobuf.message.DecodeError` or `ValueError` for a file
    that is not a protobuf, OSError when it cannot be read."""
    import onnx

    with open(path, "rb") as raw:
        size = os.fstat(raw.fileno()).st_size
        handle = io.BufferedReader(raw, buffer_size=1 << 16)
        data = b"".join(_skeleton(handle, 0, size, _model_field))
    return onnx.ModelProto.FromString(data)


def _model_field(field: int) -> Any:
    return _graph_field if field == _MODEL_GRAPH else None


def _graph_field(field: int) -> Any:
    return _tensor_field if field == _GRAPH_INITIALIZER else None


def _tensor_field(field: int) -> Any:
    return "skip" if field in _TENSOR_DATA else None


def _read_stream_varint(handle: BinaryIO) -> int:
    value = shift = 0
    while True:
        byte = handle.read(1)
        if not byte:
            raise ValueError("truncated protobuf varint")
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7


def _skeleton(handle: BinaryIO, start: int, end: int, descend: Any) -> list[bytes]:
    """The serialized fields of the message in `[start, end)` of the file, with the fields
    `descend(field)` names rewritten: "skip" drops the field, a function re-reads the
    field's message with that function for its own fields."""
    out: list[bytes] = []
    handle.seek(start)
    pos = start
    while pos < end:
        key = _read_stream_varint(handle)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value = _read_stream_varint(handle)
            out.append(_varint(key) + _varint(value))
        elif wire_type in (1, 5):
            out.append(_varint(key) + handle.read(8 if wire_type == 1 else 4))
        elif wire_type == _LENGTH_DELIMITED:
            length = _read_stream_varint(handle)
            payload = handle.tell()
            if payload + length > end:  # before reading: a forged length is not allocated
                raise ValueError("protobuf field runs past its message")
            action = descend(field)
            if action == "skip":
                handle.seek(payload + length)
            elif action is not None:
                inner = b"".join(_skeleton(handle, payload, payload + length, action))
                out.append(_varint(key) + _varint(len(inner)) + inner)
                handle.seek(payload + length)
            else:
                body = handle.read(length)
                if len(body) != length:
                    raise ValueError("truncated protobuf message")
                out.append(_varint(key) + _varint(length) + body)
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type}")
        pos = handle.tell()
        if pos > end:  # a varint or fixed-size field across the message's end
            raise ValueError("protobuf field runs past its message")
    return out
