"""A torch-free predictor over ONNX Runtime: what a service deploys.

It needs only numpy, onnxruntime and (for text) tokenizers. It reads the metadata that
`uqc export` put into the graph, preprocesses exactly as the model was trained (tokeniser
file or image rescale/normalise), and returns labels, probabilities, entropy and mutual
information. Never import torch here: a test runs this module where torch cannot load.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from uqcompress.errors import ArtifactError, DataError, empty_text_error
from uqcompress.export import contract
from uqcompress.export.onnx_file import read_skeleton
from uqcompress.runtime.paths import safe_join
from uqcompress.uq.calibration import Calibration, abstain_scores, abstains
from uqcompress.uq.outputs import ModelOutputs, concat_outputs


@dataclass(frozen=True)
class Prediction(ModelOutputs):
    """Predictions for N examples: the four outputs as the graph computes them (float32) and
    what a service reads of them. Shape: member_logits `[N, M, C]`, probs `[N, C]`, entropy
    `[N]`, mutual_info `[N]`; labels: N class names."""

    labels: list[str]
    # `[N]` bool, True where the model abstains; None when the model has no abstention rule
    abstain: npt.NDArray[np.bool_] | None = None


def _providers(device: str) -> list[str]:
    from uqcompress.runtime.deps import require_onnxruntime

    ort = require_onnxruntime()
    available = ort.get_available_providers()
    if device.startswith("cuda") and "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


_CONTRACT_HINT = "export the model with uqc export --format onnx"


def special_token_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of a `tokenizers.Tokenizer`'s special tokens ([CLS], [SEP], [PAD], ...) but
    its unknown token, which stands for real text: what `transformers`' `all_special_ids`
    holds, less `unk_token_id`, as `data.encoding.encode` counts them."""
    special = {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    unknown = getattr(tokenizer.model, "unk_token", None)
    if unknown is not None and (unknown_id := tokenizer.token_to_id(unknown)) is not None:
        special.discard(unknown_id)
    return frozenset(special)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def read_structure(onnx_path: Path) -> Any | None:
    """The file's graph and metadata without any tensor's data (`read_skeleton`); None
    without the onnx package (a deployment without it: ONNX Runtime's own checks remain).
    ArtifactError for a file that is not a readable ONNX model."""
    try:
        from google.protobuf.message import DecodeError
    except ImportError:
        return None
    try:
        return read_skeleton(onnx_path)
    except (DecodeError, ValueError, OSError) as exc:
        raise ArtifactError(
            f"{onnx_path} is not a readable ONNX model ({_first_line(exc)})",
            hint="pass a model written by uqc export --format onnx",
        ) from exc


def check_onnx_paths(onnx_path: Path, model: Any = None) -> None:
    """Refuse an ONNX file whose external-data locations or the tokenizer path in its
    metadata leave its folder, directly or through a symlink: `uqc verify` and the Predictor
    both run this, before ONNX Runtime opens the file. `model`: the file's structure
    (`read_structure`) where the caller has read it already.

    ONNX Runtime checks external data itself in recent versions, but with a traceback; older
    ones do not check at all. Reads the graph's structure only, never a tensor's data.
    """
    if model is None:
        model = read_structure(onnx_path)
    if model is None:
        return
    import onnx

    graphs, tensors = [model.graph], []
    while graphs:  # the main graph and every subgraph (If/Loop bodies), without recursion
        graph = graphs.pop()
        tensors.extend(graph.initializer)
        for sparse in graph.sparse_initializer:
            tensors.extend((sparse.values, sparse.indices))
        for node in graph.node:
            for attribute in node.attribute:
                tensors.extend([attribute.t, *attribute.tensors])
                graphs.extend([attribute.g, *attribute.graphs])
    for tensor in tensors:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entries = {entry.key: entry.value for entry in tensor.external_data}
        safe_join(
            onnx_path.parent,
            entries.get("location", ""),
            named_by=f"the external data of {tensor.name!r} in {onnx_path}",
        )
    meta = {prop.key: prop.value for prop in model.metadata_props}
    try:
        preprocessing = json.loads(meta.get(contract.META_PREPROCESSING, "{}"))
    except (json.JSONDecodeError, RecursionError):
        return  # not a path; the Predictor refuses the malformed value in one line
    tokenizer = preprocessing.get("tokenizer") if isinstance(preprocessing, dict) else None
    if tokenizer is not None:
        safe_join(onnx_path.parent, tokenizer, named_by=f"the metadata of {onnx_path}")


class _Metadata:
    """The `uqc.*` metadata of an ONNX model, each value parsed and type-checked, and the
    graph's inputs and outputs checked against it (what the Predictor relies on)."""

    def __init__(self, meta: dict[str, str], onnx_path: Path) -> None:
        self.meta, self.path = meta, onnx_path
        labels = self._json(contract.META_LABELS)
        if (
            not isinstance(labels, list)
            or not labels
            or not all(isinstance(x, str) for x in labels)
        ):
            self._refuse(f"{contract.META_LABELS} must be a non-empty list of class names")
        self.labels: list[str] = labels
        kind = self._text(contract.META_INPUT_KIND)
        if kind not in ("text", "image"):
            self._refuse(f"{contract.META_INPUT_KIND} is {kind!r}, not 'text' or 'image'")
        self.input_kind: str = kind
        # A sampling model (uqc.noise) also takes its draws as the input `noise`.
        sampling = contract.META_NOISE in meta
        allowed: tuple[str, ...] = (
            contract.TEXT_INPUTS if kind == "text" else contract.IMAGE_INPUTS
        ) + ((contract.NOISE_INPUT,) if sampling else ())
        names = self._json(contract.META_INPUT_NAMES)
        if (
            not isinstance(names, list)
            or len(set(map(str, names))) != len(names)
            or not all(isinstance(x, str) and x in allowed for x in names)
            or (contract.NOISE_INPUT in names) != sampling
            or set(names) <= {contract.NOISE_INPUT}
        ):
            self._refuse(
                f"{contract.META_INPUT_NAMES} must list distinct inputs out of "
                f"{', '.join(allowed)} for this {kind} model"
                + (f" ({contract.NOISE_INPUT} included)" if sampling else "")
            )
        self.input_names: list[str] = names
        members = self._text(contract.META_MEMBERS)
        if not members.isdigit() or int(members) < 1:
            self._refuse(f"{contract.META_MEMBERS} is {members!r}, not a positive integer")
        self.members = int(members)
        aggregation = self.meta.get(contract.META_AGGREGATION, contract.AGGREGATION)
        if aggregation != contract.AGGREGATION:  # the Predictor reads `probs` as this
            self._refuse(
                f"{contract.META_AGGREGATION} is {aggregation!r}; uqc reads only "
                f"{contract.AGGREGATION!r} (probs = the mean of the members' softmaxes)"
            )
        self.preprocessing: dict[str, Any] = self._object(
            contract.META_PREPROCESSING,
            _TEXT_PREPROCESSING if kind == "text" else _IMAGE_PREPROCESSING,
        )
        self.noise: dict[str, Any] | None = (
            self._object(contract.META_NOISE, _NOISE) if contract.META_NOISE in meta else None
        )
        self.calibration: Calibration | None = None
        if contract.META_CALIBRATION in meta:
            raw = self._json(contract.META_CALIBRATION)
            try:
                self.calibration = Calibration.from_dict(raw)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                self._refuse(f"{contract.META_CALIBRATION} is malformed ({exc!r})")

    def _refuse(self, problem: str) -> Any:
        raise ArtifactError(
            f"{self.path} does not follow the uqc export contract: {problem}",
            hint=_CONTRACT_HINT,
        )

    def _text(self, key: str) -> str:
        if key not in self.meta:
            self._refuse(f"its metadata has no {key}")
        return self.meta[key]

    def _json(self, key: str) -> Any:
        try:
            return json.loads(self._text(key))
        except (json.JSONDecodeError, RecursionError):
            return self._refuse(f"{key} is not valid JSON")

    def _object(self, key: str, fields: dict[str, tuple[type | tuple[type, ...], bool]]) -> Any:
        value = self._json(key)
        if not isinstance(value, dict):
            self._refuse(f"{key} must be a JSON object")
        for name, (types, required) in fields.items():
            if name not in value:
                if required:
                    self._refuse(f"{key} has no {name!r}")
                continue
            item = value[name]
            if (isinstance(item, bool) and types is not bool) or not isinstance(item, types):
                self._refuse(f"{key}: {name!r} has the wrong type ({type(item).__name__})")
            if name in _POSITIVE and isinstance(item, int) and item < 1:
                self._refuse(f"{key}: {name!r} is {item}, not a positive integer")
            if isinstance(item, list) and not all(
                isinstance(x, int | float) and not isinstance(x, bool) for x in item
            ):
                self._refuse(f"{key}: {name!r} must be a list of numbers")
        return value

    def check_graph(self, session: Any) -> None:
        """The graph takes exactly the inputs the metadata names and returns the contract's
        outputs, with the types and ranks the Predictor feeds and reads."""
        want = {name: _INPUT_SPECS[name] for name in self.input_names}
        got = {node.name: node for node in session.get_inputs()}
        if set(got) != set(want):
            self._refuse(f"the graph takes inputs {sorted(got)}, the metadata says {sorted(want)}")
        for name, (dtype, rank) in want.items():
            if got[name].type != dtype or len(got[name].shape) != rank:
                self._refuse(
                    f"input {name!r} is {got[name].type} of rank {len(got[name].shape)}, "
                    f"not {dtype} of rank {rank}"
                )
        outputs = {node.name: node for node in session.get_outputs()}
        for name, rank in zip(contract.OUTPUT_NAMES, (3, 2, 1, 1), strict=True):
            if name not in outputs:
                self._refuse(f"the graph has no output {name!r}")
            if outputs[name].type != "tensor(float)" or len(outputs[name].shape) != rank:
                self._refuse(
                    f"output {name!r} is {outputs[name].type} of rank "
                    f"{len(outputs[name].shape)}, not tensor(float) of rank {rank}"
                )
        # Static sizes, where the graph fixes them, must agree with the labels and members.
        classes = outputs["probs"].shape[-1]
        if isinstance(classes, int) and classes != len(self.labels):
            self._refuse(
                f"the graph returns {classes} classes, the metadata names {len(self.labels)}"
            )
        members = outputs["member_logits"].shape[1]
        if isinstance(members, int) and members != self.members:
            self._refuse(f"the graph returns {members} members, the metadata says {self.members}")
        if self.input_kind == "image" and "pixel_values" in got:
            # [B, C, H, W]: the export fixes channels and size; the metadata must say the same
            _, channels, height, width = got["pixel_values"].shape
            wanted = self.preprocessing["num_channels"]
            if isinstance(channels, int) and channels != wanted:
                self._refuse(
                    f"num_channels is {wanted} in {contract.META_PREPROCESSING}; the graph "
                    f"takes {channels}"
                )
            size = self.preprocessing["image_size"]
            for side in (height, width):
                if isinstance(side, int) and side != size:
                    self._refuse(
                        f"image_size is {size} in {contract.META_PREPROCESSING}; the graph "
                        f"takes {height}x{width} images"
                    )

    def check_text_tables(self, vocabulary: int | None, positions: int | None) -> None:
        """A text model's pad id inside its vocabulary and its max_length inside its
        position table (sizes read from the graph: `graph_tables`; None where unknown)."""
        pad = self.preprocessing.get("pad_token_id", 0)
        if pad < 0 or (vocabulary is not None and pad >= vocabulary):
            self._refuse(
                f"pad_token_id is {pad} in {contract.META_PREPROCESSING}, outside the "
                f"vocabulary (0..{(vocabulary or 1) - 1})"
                if vocabulary is not None
                else f"pad_token_id is {pad} in {contract.META_PREPROCESSING}, below 0"
            )
        length = self.preprocessing["max_length"]
        if positions is not None and length > positions:
            self._refuse(
                f"max_length is {length} in {contract.META_PREPROCESSING}, above the graph's "
                f"position table ({positions} positions)"
            )


_POSITION_TABLES = ("position_embeddings.weight", "embed_positions.weight")


def graph_tables(model: Any) -> tuple[int | None, int | None]:
    """Rows of a text graph's token embedding (the initializer that `input_ids` index) and
    of its learned position table, if it has one (rotary decoders have none), from the
    file's structure (`read_structure`); (None, None) without it (no onnx package)."""
    if model is None:
        return None, None
    rows = {t.name: int(t.dims[0]) for t in model.graph.initializer if len(t.dims) == 2}
    vocabulary = next(
        (
            rows[node.input[0]]
            for node in model.graph.node
            if node.op_type == "Gather"
            and len(node.input) == 2
            and node.input[1] == "input_ids"
            and node.input[0] in rows
        ),
        None,
    )
    positions = next(
        (n for name, n in rows.items() if name.endswith(_POSITION_TABLES)),
        None,
    )
    return vocabulary, positions


# What the Predictor feeds each graph input: ONNX type and rank.
_INPUT_SPECS = {
    **{name: ("tensor(int64)", 2) for name in contract.TEXT_INPUTS},
    "pixel_values": ("tensor(float)", 4),
    contract.NOISE_INPUT: ("tensor(float)", 5),
}
# Metadata objects: key -> (allowed types, required).
_NUMBER = (int, float)
_TEXT_PREPROCESSING: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "tokenizer": (str, True),
    "max_length": (int, True),
    "pad_token_id": (int, False),
    "token_types": (bool, False),  # exports before text pairs: absent (zeros)
    "text_pair": (bool, False),  # absent: not recorded, single texts and pairs taken
}
_IMAGE_PREPROCESSING: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "image_size": (int, True),
    "num_channels": (int, True),
    "image_mean": (list, True),
    "image_std": (list, True),
    "rescale_factor": (_NUMBER, True),
}
# sizes and counts: 0 or less would fail later, deep inside ONNX Runtime or numpy
_POSITIVE = {"max_length", "image_size", "num_channels", "samples", "steps", "hidden", "tokens"}
_NOISE: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "samples": (int, True),
    "steps": (int, True),
    "hidden": (int, True),
    "tokens": ((int, type(None)), True),
    "seed": (int, True),
}


# glibc's mallopt parameter, and the thresholds used around a session's opening.
_M_MMAP_THRESHOLD = -3
_MMAP_WHILE_OPENING = 1 << 20
_MMAP_AFTER = 32 << 20  # where glibc's own moving threshold ends up (its maximum)


@contextlib.contextmanager
def _freed_memory_returned() -> Iterator[None]:
    """While ONNX Runtime opens a session, every allocation of 1 MiB or more gets its own
    memory map, so the graph's initializers it frees after pre-packing them go back to the
    system. glibc's default threshold rises to the size of the last large block freed; the
    initializers freed after it then stay in the heap, and a 1.44 GiB graph's session held
    2.6 GiB in 9 of 15 runs instead of 1.6 GiB (measured; 1.6 GiB in each of 6 with this).
    Afterwards the threshold is left at glibc's own maximum. Off glibc (no mallopt), or if
    the call fails, a no-op."""
    import ctypes

    from uqcompress.runtime.libc import libc_function

    mallopt = libc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, _MMAP_WHILE_OPENING)
    try:
        yield
    finally:
        if mallopt is not None:
            mallopt(_M_MMAP_THRESHOLD, _MMAP_AFTER)


class Predictor:
    """Run an exported model. ``source`` is an onnx artifact directory or a `.onnx` file
    (a text model then needs `tokenizer.json` beside it)."""

    def __init__(
        self,
        source: Path | str,
        device: str = "cpu",
        threads: int | None = None,
        sample_chunk: int | None = None,
        *,
        open_session: bool = True,
    ):
        """``open_session=False`` reads the metadata and the tokenizer only: the inputs can
        be encoded, and ONNX Runtime opens the graph (and the graph is checked against the
        contract) on the first run. `uqc export` uses it to free the torch model before the
        graph's weights are loaded a second time."""
        from uqcompress.runtime.deps import require_onnxruntime

        # Sampling models: samples per pass (None: sized by uq.noise.AUTO_CHUNK_TOKENS). The
        # graph runs all S samples of each example it gets, so a batch is fed in slices.
        self.sample_chunk = sample_chunk

        ort = require_onnxruntime()
        source = Path(source)
        onnx_path = source / contract.ONNX_FILE if source.is_dir() else source
        if not onnx_path.is_file():
            raise ArtifactError(
                f"{source} holds no {contract.ONNX_FILE}",
                hint="pass an artifact written by uqc export --format onnx",
            )
        # An ONNX file may come from anywhere: its external-data locations are checked before
        # ONNX Runtime opens them, and every metadata value and the graph's inputs and outputs
        # are checked against the contract before use, so a file uqc did not make is one line.
        structure = read_structure(onnx_path)  # read once: the paths, tables, metadata
        check_onnx_paths(onnx_path, structure)
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: ORT's warnings would bury our one line
        if threads is not None:
            options.intra_op_num_threads = threads
        self._open_args = (ort, onnx_path, options, _providers(device))
        self._session: Any = None
        self._spec: _Metadata | None = None  # set once read; a late session is checked by it
        if open_session or structure is None:
            meta = self.session.get_modelmeta().custom_metadata_map
        else:
            meta = {p.key: p.value for p in structure.metadata_props}
        if meta.get(contract.META_FORMAT) != contract.FORMAT_VERSION:
            raise ArtifactError(
                f"{onnx_path} was not written by uqc export (no uqc metadata of format "
                f"{contract.FORMAT_VERSION})",
                hint="export the model with uqc export --format onnx",
            )
        spec = _Metadata(meta, onnx_path)
        self.labels: list[str] = spec.labels
        self.input_kind: str = spec.input_kind
        self.input_names: list[str] = spec.input_names
        self.members = spec.members
        self.preprocessing: dict[str, Any] = spec.preprocessing
        self.source_id = meta.get(contract.META_SOURCE_ID, "")
        # Sampling models: the noise spec; draws come from a NumPy generator seeded per call.
        self.noise: dict[str, Any] | None = spec.noise
        # `uqc calibrate`: the temperature is in the graph; the abstention rule is applied here.
        self.calibration = spec.calibration
        self._spec = spec
        if open_session:
            spec.check_graph(self.session)
        self._tokenizer: Any = None
        self._special_ids: frozenset[int] = frozenset()
        if self.input_kind == "text":
            spec.check_text_tables(*graph_tables(structure))
            tokenizer_path = safe_join(
                onnx_path.parent,
                self.preprocessing["tokenizer"],
                named_by=f"the metadata of {onnx_path}",
            )
            if not tokenizer_path.is_file():
                raise ArtifactError(
                    f"{tokenizer_path} is missing; a text model needs its tokenizer",
                    hint="keep tokenizer.json beside model.onnx (the export artifact has it)",
                )
            from tokenizers import Tokenizer

            try:
                self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
            except Exception as exc:  # tokenizers raises plain Exception on a bad file
                raise ArtifactError(
                    f"cannot load the tokenizer {tokenizer_path}: {_first_line(exc)}",
                    hint="keep the tokenizer.json that uqc export wrote beside model.onnx",
                ) from exc
            self._tokenizer.no_padding()
            self._tokenizer.enable_truncation(int(self.preprocessing["max_length"]))
            self._special_ids = special_token_ids(self._tokenizer)

    @property
    def session(self) -> Any:
        """The ONNX Runtime session, opened on first use."""
        if self._session is None:
            ort, onnx_path, options, providers = self._open_args
            try:
                with _freed_memory_returned():
                    self._session = ort.InferenceSession(
                        str(onnx_path), sess_options=options, providers=providers
                    )
            except Exception as exc:  # ORT's own exception types (Fail, InvalidGraph, ...)
                if not type(exc).__module__.startswith("onnxruntime"):
                    raise
                raise ArtifactError(
                    f"ONNX Runtime cannot load {onnx_path}: {_first_line(exc)}",
                    hint="pass a model written by uqc export --format onnx",
                ) from exc
            if self._spec is not None:  # opened late: checked now, before its first run
                self._spec.check_graph(self._session)
        return self._session

    # -- inputs ---------------------------------------------------------------------------

    @property
    def text_pair(self) -> bool | None:
        """Whether the model was trained on text pairs (None: not recorded, either is taken)."""
        recorded = self.preprocessing.get("text_pair")
        return None if recorded is None else bool(recorded)

    def _check_pairs(self, texts: list[str], pairs: list[str] | None) -> None:
        if pairs is not None and len(pairs) != len(texts):
            raise DataError(
                f"{len(texts)} texts but {len(pairs)} pair texts",
                hint="pass one pair text per text",
            )
        if self.text_pair is True and pairs is None:
            raise DataError(
                "the model was fine-tuned on text pairs; no pair texts were given",
                hint="pass the second texts too (--text-pair-column COLUMN; in Python "
                "predict_texts(texts, pairs=...))",
            )
        if self.text_pair is False and pairs is not None:
            raise DataError(
                "the model was fine-tuned on single texts; pair texts were given",
                hint="pass single texts (drop the pairs or --text-pair-column)",
            )

    def encode_texts(
        self, texts: list[str], pairs: list[str] | None = None, first: int = 0
    ) -> dict[str, npt.NDArray[np.int64]]:
        """Tokenise, truncate and pad to the longest text; with ``pairs``, each text and its
        pair text as one input (the tokenizer's pair template, the longer one truncated
        first), with token types 0 and 1 where the model uses them. A text (with its pair)
        that has no real token is refused, named by its index plus ``first`` (the position
        of this batch in the caller's list).

        Shape: each of input_ids, attention_mask, token_type_ids `[N, T]` int64.
        """
        return self._pad(self._tokenize(texts, pairs, first), pairs is not None)

    def _tokenize(self, texts: list[str], pairs: list[str] | None, first: int) -> list[Any]:
        """The tokenizer's encodings of `texts` (with `pairs`), each checked for a real
        token (see `encode_texts`)."""
        if self.input_kind != "text":
            raise DataError("this model takes images, not text", hint="pass image data")
        self._check_pairs(texts, pairs)
        inputs: list[Any] = [str(t) for t in texts]
        if pairs is not None:
            inputs = [(str(t), str(p)) for t, p in zip(texts, pairs, strict=True)]
        encodings: list[Any] = self._tokenizer.encode_batch(inputs)
        for i, encoding in enumerate(encodings):
            if all(
                flag or token in self._special_ids
                for flag, token in zip(encoding.special_tokens_mask, encoding.ids, strict=True)
            ):
                raise empty_text_error(f"text {first + i + 1} (counting from 1)")
        return encodings

    def _pad(self, encodings: list[Any], paired: bool) -> dict[str, npt.NDArray[np.int64]]:
        """Encodings as the graph's inputs, padded to the longest of them.

        Shape: N encodings -> each of input_ids, attention_mask, token_type_ids `[N, T]`.
        """
        width = max(len(e.ids) for e in encodings)
        pad = int(self.preprocessing.get("pad_token_id", 0))
        ids = np.full((len(encodings), width), pad, dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        types = np.zeros((len(encodings), width), dtype=np.int64)
        with_types = paired and bool(self.preprocessing.get("token_types"))
        for i, encoding in enumerate(encodings):
            ids[i, : len(encoding.ids)] = encoding.ids
            mask[i, : len(encoding.ids)] = 1
            if with_types:
                types[i, : len(encoding.ids)] = encoding.type_ids
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

    def encode_pixels(self, pixels: npt.NDArray[Any]) -> dict[str, npt.NDArray[np.float32]]:
        """Rescale and normalise images given on the 0..255 scale.

        Shape: pixels `[N, C, H, W]` -> pixel_values `[N, C, H, W]` float32.
        """
        if self.input_kind != "image":
            raise DataError("this model takes text, not images", hint="pass text data")
        from uqcompress.models.preprocessing import match_channels

        p = self.preprocessing
        size, channels = int(p["image_size"]), int(p["num_channels"])
        pixels = match_channels(pixels, channels)
        if pixels.ndim != 4 or pixels.shape[1:] != (channels, size, size):
            raise DataError(
                f"images have shape {tuple(pixels.shape)}; the model expects "
                f"[N, {channels}, {size}, {size}]",
                hint="pass images of the model's size and channels",
            )
        mean = np.asarray(p["image_mean"], dtype=np.float32).reshape(1, -1, 1, 1)
        std = np.asarray(p["image_std"], dtype=np.float32).reshape(1, -1, 1, 1)
        scaled = pixels.astype(np.float32) * np.float32(p["rescale_factor"])
        return {"pixel_values": ((scaled - mean) / std).astype(np.float32)}

    # -- running --------------------------------------------------------------------------

    def draw_noise(
        self, inputs: dict[str, npt.NDArray[Any]], seed: int | None = None
    ) -> npt.NDArray[np.float32]:
        """Standard normal draws for a sampling model's `noise` input, per example: each from
        its own generator seeded by `seed` (default: the seed in the metadata) and the
        example's content (uq/noise.py), so an example gets the same draws, and the same
        prediction, in any batch and as torch draws them.

        Shape: `[B, S, K, T, d]`.
        """
        from uqcompress.uq.noise import NOISE_SCHEME
        from uqcompress.uq.noise import draw_noise as draw

        assert self.noise is not None, "this model takes no noise"
        scheme = self.noise.get("scheme", NOISE_SCHEME)  # exports before the tag: this one
        if scheme != NOISE_SCHEME:
            raise ArtifactError(
                f"the model's noise scheme {scheme!r} is not this uqc's ({NOISE_SCHEME!r})",
                hint="export the model again with this uqc",
            )
        return draw(
            inputs,
            seed=int(self.noise["seed"] if seed is None else seed),
            samples=int(self.noise["samples"]),
            steps=int(self.noise["steps"]),
            hidden=int(self.noise["hidden"]),
            tokens=self.noise["tokens"],
        )

    def run(self, inputs: dict[str, npt.NDArray[Any]]) -> Prediction:
        """Run the graph on already-encoded inputs (a sampling model's noise is drawn when
        not given)."""
        if self.noise is not None and contract.NOISE_INPUT not in inputs:
            inputs = {**inputs, contract.NOISE_INPUT: self.draw_noise(inputs)}
        member_logits, probs, entropy, mutual_info = self._session_run(inputs)
        rule = self.calibration.abstain if self.calibration is not None else None
        return Prediction(
            member_logits=member_logits,
            probs=probs,
            entropy=entropy,
            mutual_info=mutual_info,
            labels=[self.labels[i] for i in np.argmax(probs, axis=1)],
            abstain=(
                abstains(rule, abstain_scores(probs, entropy, mutual_info))
                if rule is not None
                else None
            ),
        )

    def _session_run(
        self, inputs: dict[str, npt.NDArray[Any]], names: tuple[str, ...] = contract.OUTPUT_NAMES
    ) -> list[npt.NDArray[Any]]:
        """The graph's outputs `names` (default: the contract's four) for `inputs`; a
        sampling model's batch is fed in slices of `examples_per_pass` examples (each with
        all its S samples and its own draws, so the outputs are those of one pass).

        Shape: inputs `[B, ...]` (noise `[B, S, K, T, d]`) -> the outputs `[B, ...]`.
        """
        feed = {name: inputs[name] for name in self.input_names}
        if self.noise is None:
            return list(self.session.run(list(names), feed))
        from uqcompress.uq.noise import examples_per_pass

        noise = feed[contract.NOISE_INPUT]  # [B, S, K, T, d]
        batch, samples, _, tokens, _ = noise.shape
        step = examples_per_pass(batch, samples, tokens, self.sample_chunk)
        parts = [
            self.session.run(list(names), {k: v[i : i + step] for k, v in feed.items()})
            for i in range(0, batch, step)
        ]
        return [np.concatenate([p[j] for p in parts]) for j in range(len(names))]

    def loader_logits(self, inputs: dict[str, npt.NDArray[Any]]) -> npt.NDArray[Any]:
        """The graph's `logits` output (what Hugging Face loaders read), for a parity check.

        Shape: inputs `[B, ...]` (a sampling model's noise included) -> `[B, C]`.
        """
        return self._session_run(inputs, (contract.LOGITS_OUTPUT,))[0]

    def predict_texts(
        self, texts: list[str], batch_size: int = 64, pairs: list[str] | None = None
    ) -> Prediction:
        """Predict texts, or text pairs (`texts[i]` with `pairs[i]`) for a model trained on
        pairs; results in the order given.

        Texts of similar token length share a call (`length_buckets`): padding every text of
        a batch to its longest wasted up to half the compute on mixed lengths, and on a CPU
        that waste cost more than batching saved. Each window of `BUCKET_WINDOW` batches is
        tokenised, sorted by length and cut into calls of at most `batch_size` texts; an
        example's outputs do not depend on the others in its call (attention masks padding,
        a sampling model draws per-example noise)."""
        self._check_pairs(texts, pairs)
        parts: list[Prediction] = []
        window = batch_size * BUCKET_WINDOW
        for start in range(0, len(texts), window):
            chunk_pairs = pairs[start : start + window] if pairs is not None else None
            encodings = self._tokenize(texts[start : start + window], chunk_pairs, start)
            buckets = length_buckets([len(e.ids) for e in encodings], batch_size)
            outs = [
                self.run(self._pad([encodings[i] for i in b], pairs is not None)) for b in buckets
            ]
            parts.append(_unsort(outs, np.concatenate(buckets)))
        return _joined(parts)

    def predict_pixels(self, pixels: npt.NDArray[Any], batch_size: int = 64) -> Prediction:
        return self._batched(len(pixels), batch_size, lambda s: self.encode_pixels(pixels[s]))

    def _batched(self, n: int, batch_size: int, encode: Any) -> Prediction:
        return self.predict_batches(
            encode(slice(i, i + batch_size)) for i in range(0, n, batch_size)
        )

    def predict_batches(self, batches: Iterable[dict[str, npt.NDArray[Any]]]) -> Prediction:
        """Run already-encoded batches (`encode_texts`/`encode_pixels` outputs) one by one."""
        return _joined([self.run(batch) for batch in batches])


# Texts are bucketed by length within windows of this many batches: the window bounds the
# encodings held at once (a million-text `uqc predict` tokenises window by window).
BUCKET_WINDOW = 8
# A call's padded tokens may be at most this many times its real tokens.
BUCKET_PADDING = 1.25


def length_buckets(lengths: list[int], batch_size: int) -> list[npt.NDArray[np.intp]]:
    """Indices of `lengths` grouped into calls: sorted by length (stable), each call at most
    `batch_size` long and padded to at most BUCKET_PADDING times its real tokens (a call
    grows while its longest, times its size, stays within that of its total).

    Shape: N lengths -> calls of indices, together a permutation of range(N).
    """
    order = np.argsort(np.asarray(lengths), kind="stable")
    buckets: list[list[int]] = []
    total = 0
    for i in order.tolist():
        n = lengths[i]
        current = buckets[-1] if buckets else None
        if (
            current is not None
            and len(current) < batch_size
            and n * (len(current) + 1) <= BUCKET_PADDING * (total + n)
        ):
            current.append(i)
            total += n
        else:
            buckets.append([i])
            total = n
    return [np.asarray(b, dtype=np.intp) for b in buckets]


def _joined(parts: list[Prediction]) -> Prediction:
    """Consecutive predictions as one."""
    if not parts:
        raise DataError("nothing to predict: no examples", hint="pass non-empty data")
    return Prediction(
        **concat_outputs(parts),
        labels=[label for p in parts for label in p.labels],
        abstain=(
            np.concatenate([p.abstain for p in parts if p.abstain is not None])
            if parts[0].abstain is not None
            else None
        ),
    )


def _unsort(parts: list[Prediction], order: npt.NDArray[np.intp]) -> Prediction:
    """Predictions made in `order` (row k is example order[k]) back in the examples' order."""
    joined = _joined(parts)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    return Prediction(
        member_logits=joined.member_logits[back],
        probs=joined.probs[back],
        entropy=joined.entropy[back],
        mutual_info=joined.mutual_info[back],
        labels=[joined.labels[k] for k in back],
        abstain=joined.abstain[back] if joined.abstain is not None else None,
    )
