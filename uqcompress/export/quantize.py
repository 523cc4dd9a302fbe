"""Quantize an exported ONNX graph (int8 dynamic, int8 static QDQ, float16) and measure how far
the quantized model drifts from the float32 export.

The uncertainty tail stays float32 and unquantized. It is found in the graph, not by naming
convention: walk back from the `member_logits` output to the nearest MatMul/Gemm (the
classifier head, grouped for an ensemble); every node downstream of that node's output (its
bias Add, the reshape to `[B, M, C]`, a calibrated model's division by T, and the softmax,
mean, log, entropy and mutual-information nodes up to `probs`, `entropy` and `mutual_info`)
is excluded from quantization, and from the float16 conversion. The classifier MatMul itself
is quantized like every other layer. A sampling model's `noise` input stays float32: the
nodes that read it are excluded too, and the graph's inputs and outputs keep their types in
every mode.

This module needs `onnx` and `onnxruntime` (the `cpu`/`gpu` extras), never torch.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from uqcompress.errors import ArtifactError, ConfigError
from uqcompress.export import contract

MODES = ("dynamic", "static", "fp16")
CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
CALIBRATION_BATCH = 8  # examples per calibration batch (texts padded to the batch's longest)
HEAD_OPS = ("MatMul", "Gemm")
# static QDQ: the layers with int8 kernels; Q/DQ pairs around anything else only cost time
STATIC_OPS = ("MatMul", "Gemm")


def uncertainty_tail(model: Any) -> list[str]:
    """Names of the nodes that compute the contract's outputs from the classifier head:
    everything downstream of the nearest MatMul/Gemms above `member_logits` (those nodes
    excluded; an ensemble exported with one GEMM per member has M of them at that depth).
    Raises ArtifactError when the graph has no such node."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    # breadth-first up from member_logits: the nearest MatMul/Gemms are the classifier head
    # (every one at that depth: M per-member heads)
    heads: list[Any] = []
    frontier: list[str] = [contract.OUTPUT_NAMES[0]]
    seen: set[int] = set()
    while frontier and not heads:
        following: list[str] = []
        for tensor in frontier:
            node = producer.get(tensor)
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type in HEAD_OPS:
                heads.append(node)
                continue
            following.extend(node.input)
        frontier = following
    if not heads:
        raise ArtifactError(
            "the graph computes member_logits without a MatMul/Gemm classifier head; cannot "
            "tell the uncertainty tail from the layers to quantize",
            hint="pass an ONNX artifact written by uqc export",
        )
    tail: dict[str, None] = {}
    stack = [out for head in heads for out in head.output]
    while stack:
        for node in consumers.get(stack.pop(), []):
            if node.name not in tail:
                tail[node.name] = None
                stack.extend(node.output)
    return list(tail)


def noise_readers(model: Any) -> list[str]:
    """Names of the nodes that read a sampling model's `noise` input (none for others)."""
    return [n.name for n in model.graph.node if contract.NOISE_INPUT in n.input]


def _name_nodes(model: Any) -> None:
    """Give every unnamed node a unique name: exclusion lists name nodes."""
    used = {n.name for n in model.graph.node if n.name}
    for index, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_uqc{index}"
            while name in used:
                name += "_"
            node.name = name
            used.add(name)


def fold_weight_transposes(model: Any) -> int:
    """Replace every Transpose of an initializer by the transposed initializer; returns how
    many were folded.

    Why: ONNX Runtime's quantizers quantize a MatMul only when its weight is an initializer.
    The exporter folds `x @ W.T` into a transposed initializer when W is read once, but leaves
    `Transpose(W)` in the graph when W is read several times (a Hydra's shared MLP, one GEMM
    per member): those MatMuls stayed float32 under int8 (measured: a 6-block MiniLM-shaped
    Hydra M = 3 int8 0.92x its float32 export at batch 8, against 0.46x for a single model).
    ONNX Runtime folds such Transposes only when a session starts, after quantization.
    """
    from onnx import numpy_helper

    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    folded, kept_nodes = [], []
    for node in graph.node:
        if node.op_type == "Transpose" and len(node.input) == 1 and node.input[0] in initializers:
            weight = numpy_helper.to_array(initializers[node.input[0]])
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            # ONNX's default perm reverses the axes, as numpy's does
            folded.append(numpy_helper.from_array(np.transpose(weight, perm), node.output[0]))
        else:
            kept_nodes.append(node)
    if not folded:
        return 0
    del graph.node[:]
    graph.node.extend(kept_nodes)
    graph.initializer.extend(folded)
    if not any(a.type in (a.GRAPH, a.GRAPHS) for n in graph.node for a in n.attribute):
        # drop the originals nothing reads any more (a subgraph could read one: then keep all)
        read = {i for n in graph.node for i in n.input}
        read |= {o.name for o in graph.output} | {i.name for i in graph.input}
        unused = [t for t in graph.initializer if t.name not in read]
        for tensor in unused:
            graph.initializer.remove(tensor)
    return len(folded)


def excluded_nodes(model: Any, pattern: str | None) -> tuple[list[str], list[str]]:
    """(kept float32 by the contract: the uncertainty tail and the noise readers, matched by
    the user's --exclude regex): node names never quantized."""
    kept = list(dict.fromkeys(uncertainty_tail(model) + noise_readers(model)))
    matched = []
    if pattern:
        regex = re.compile(pattern)
        matched = [n.name for n in model.graph.node if regex.search(n.name) and n.name not in kept]
    return kept, matched


# the ops each int8 mode turns into integer kernels (dynamic also quantizes embeddings' Gather)
INT8_OPS = {"dynamic": ("MatMul", "Gemm", "Gather", "Conv"), "static": STATIC_OPS}


def check_exclude(model: Any, mode: str, pattern: str | None) -> None:
    """Refuse an --exclude that leaves nothing to quantize (the artifact would be marked
    int8 or float16 while every layer stays float32)."""
    if not pattern:
        return
    _name_nodes(model)
    kept, matched = excluded_nodes(model, pattern)
    never = set(kept) | set(matched)
    ops = INT8_OPS.get(mode)
    left = [
        n.name
        for n in model.graph.node
        if n.name not in never and (ops is None or n.op_type in ops) and n.op_type != "Constant"
    ]
    if not left:
        what = "layer" if ops is None else f"{'/'.join(ops)} layer"
        raise ConfigError(
            f"--exclude {pattern!r} keeps every {what} outside the float32 tail in float32 "
            f"({len(matched)} nodes matched); the {mode} artifact would quantize nothing",
            hint="exclude fewer nodes (a pattern like 'layer\\.0\\.' over ONNX node names), or "
            "leave out --exclude",
        )


@dataclass
class QuantizeResult:
    """What was done to the graph: recorded in the metadata and the artifact's summary."""

    mode: str
    per_channel: bool
    reduce_range: bool
    calibration_method: str | None
    calibration_examples: int
    kept_float32: list[str]  # the uncertainty tail and noise readers
    excluded: list[str]  # matched by --exclude
    quantized_nodes: int  # nodes of the quantization's own ops (QDQ, integer ops, casts)
    # a per-channel dynamic run: grouped (3-D weight) MatMuls quantized per tensor after it
    per_tensor_grouped: int = 0

    def record(self) -> dict[str, Any]:
        """The `uqc.quantization` metadata value (JSON)."""
        return {
            "mode": self.mode,
            "weights": "float16" if self.mode == "fp16" else "int8",
            "activations": {"dynamic": "int8 at run time", "static": "int8 (QDQ)"}.get(
                self.mode, "float16"
            ),
            "per_channel": self.per_channel,
            "reduce_range": self.reduce_range,
            "per_tensor_grouped": self.per_tensor_grouped,
            "calibration_method": self.calibration_method,
            "calibration_examples": self.calibration_examples,
            "float32_tail": len(self.kept_float32),
            "excluded": self.excluded,
        }


class BatchReader:
    """An ONNX Runtime CalibrationDataReader over preprocessed batches (built lazily, so a
    subclass of ORT's abstract reader is created only when ORT is importable)."""

    def __init__(self, batches: list[dict[str, npt.NDArray[Any]]]) -> None:
        self.batches = batches
        self._iter: Iterator[dict[str, npt.NDArray[Any]]] = iter(batches)

    def get_next(self) -> dict[str, npt.NDArray[Any]] | None:
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = iter(self.batches)


def _reader(batches: list[dict[str, npt.NDArray[Any]]]) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(BatchReader, CalibrationDataReader):
        pass

    return Reader(batches)


def quantize_graph(
    source: Path,
    target: Path,
    mode: str,
    *,
    per_channel: bool = False,
    reduce_range: bool = False,
    exclude: str | None = None,
    calibration: list[dict[str, npt.NDArray[Any]]] | None = None,
    calibration_method: str = "minmax",
    work_dir: Path | None = None,
) -> QuantizeResult:
    """Write the quantized graph of `source` (a uqc export) to `target`, its `uqc.*` metadata
    kept and the quantization recorded under `uqc.quantization`.

    `calibration`: preprocessed input batches (static mode only), as the Predictor feeds them.
    """
    import onnx

    model = onnx.load(str(source))
    fold_weight_transposes(model)
    _name_nodes(model)
    meta = {p.key: p.value for p in model.metadata_props}
    check_exclude(model, mode, exclude)
    kept, matched = excluded_nodes(model, exclude)
    # ONNX Runtime's per-channel int8 MatMul takes 2-D weights only: the grouped `[M, in, out]`
    # layers of a Hydra exported before one 2-D GEMM per member (export_graph) are left out
    # of the per-channel pass; dynamic mode quantizes them per tensor after it (static mode
    # keeps them float32: a second calibrated pass over a QDQ graph is not done)
    grouped: list[str] = []
    if per_channel and mode != "fp16":
        grouped = [n for n in grouped_matmuls(model) if n not in matched and n not in kept]
    never = kept + matched + grouped
    staged = (work_dir or target.parent) / "named.onnx"
    onnx.save(model, str(staged))
    examples = 0
    # ONNX Runtime's quantizer logs advice on the root logger; our stderr carries progress only
    logging.disable(logging.WARNING)
    try:
        if mode == "dynamic":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantize_dynamic(
                staged,
                target,
                per_channel=per_channel,
                reduce_range=reduce_range,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=never,
            )
            if grouped:
                target.replace(staged)
                quantize_dynamic(
                    staged,
                    target,
                    per_channel=False,
                    reduce_range=reduce_range,
                    weight_type=QuantType.QInt8,
                    nodes_to_quantize=grouped,
                )
        elif mode == "static":
            from onnxruntime.quantization import (
                CalibrationMethod,
                QuantFormat,
                QuantType,
                quantize_static,
            )

            assert calibration, "static quantization needs calibration batches"
            examples = sum(len(next(iter(b.values()))) for b in calibration)
            method = {
                "minmax": CalibrationMethod.MinMax,
                "entropy": CalibrationMethod.Entropy,
                "percentile": CalibrationMethod.Percentile,
            }[calibration_method]
            quantize_static(
                staged,
                target,
                _reader(calibration),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=list(STATIC_OPS),
                per_channel=per_channel,
                reduce_range=reduce_range,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=never,
                calibrate_method=method,
                extra_options={"CalibTensorRangeSymmetric": False},
            )
        else:
            onnx.save(half_precision(model, kept, matched), str(target))
    finally:
        logging.disable(logging.NOTSET)
        staged.unlink(missing_ok=True)
        for leftover in (work_dir or target.parent).glob("*augmented*"):
            leftover.unlink(missing_ok=True)
    result = QuantizeResult(
        mode=mode,
        per_channel=per_channel,
        reduce_range=reduce_range,
        calibration_method=calibration_method if mode == "static" else None,
        calibration_examples=examples,
        kept_float32=kept,
        excluded=matched if mode == "dynamic" else matched + grouped,
        quantized_nodes=0,
        per_tensor_grouped=len(grouped) if mode == "dynamic" else 0,
    )
    written = onnx.load(str(target))
    before = {n.name for n in model.graph.node}
    result.quantized_nodes = sum(1 for n in written.graph.node if n.name not in before)
    del written.metadata_props[:]
    meta[contract.META_QUANTIZATION] = json.dumps(result.record())
    for key, value in sorted(meta.items()):
        entry = written.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(written, str(target))
    return result


def half_precision(model: Any, tail: list[str], blocked: list[str]) -> Any:
    """The model in float16 with float32 inputs and outputs, its uncertainty tail (`tail`,
    node names) kept float32 from end to end.

    ONNX Runtime's converter computes a blocked node in float32 but casts its output back to
    float16, so a blocked tail would still round between its nodes. Instead the tail is cut
    off: the body up to the classifier head is converted (its output, the head's logits,
    cast back to float32), and the export's own float32 tail nodes, with float32 copies of the
    constants they read, are put back after it. `blocked` (--exclude, the noise readers) is
    left to the converter's blocking.
    """
    import copy

    import onnx
    from onnx import TensorProto, helper
    from onnxruntime.transformers.float16 import convert_float_to_float16

    graph = model.graph
    tail_set = set(tail)
    tail_nodes = [n for n in graph.node if n.name in tail_set]
    produced_in_tail = {o for n in tail_nodes for o in n.output}
    needed = {i for n in tail_nodes for i in n.input} - produced_in_tail
    initializers = {t.name: t for t in graph.initializer}
    constants = {o: n for n in graph.node if n.op_type == "Constant" for o in n.output}
    # the tensors the body hands the tail: its outputs after the cut (float32 at the edge)
    body_outputs = [
        name
        for name in dict.fromkeys(i for n in tail_nodes for i in n.input)
        if name in needed and name not in initializers and name not in constants and name
    ]
    body = copy.deepcopy(model)
    del body.graph.node[:]
    body.graph.node.extend(copy.deepcopy(n) for n in graph.node if n.name not in tail_set)
    del body.graph.output[:]
    # each keeps its own element type: a decoder's int64 last-token indices cross the cut too
    types = _element_types(model)
    body.graph.output.extend(
        helper.make_tensor_value_info(name, types.get(name, TensorProto.FLOAT), None)
        for name in body_outputs
    )
    keep_info = [v for v in body.graph.value_info if v.name not in produced_in_tail]
    del body.graph.value_info[:]
    body.graph.value_info.extend(keep_info)
    half = convert_float_to_float16(body, keep_io_types=True, node_block_list=blocked or None)
    # float32 copies of the constants the tail reads, under names of their own
    renamed: dict[str, str] = {}
    for name in needed:
        fresh = f"{name}_uqc_fp32"
        if name in initializers:
            tensor = copy.deepcopy(initializers[name])
            tensor.name = fresh
            half.graph.initializer.append(tensor)
            renamed[name] = fresh
        elif name in constants:
            node = copy.deepcopy(constants[name])
            node.name = f"{node.name}_uqc_fp32"
            del node.output[:]
            node.output.append(fresh)
            half.graph.node.append(node)
            renamed[name] = fresh
    for node in tail_nodes:
        node = copy.deepcopy(node)
        for index, name in enumerate(node.input):
            if name in renamed:
                node.input[index] = renamed[name]
        half.graph.node.append(node)
    del half.graph.output[:]
    half.graph.output.extend(copy.deepcopy(o) for o in graph.output)
    _sort_nodes(half.graph)
    onnx.checker.check_model(half)
    return half


def _element_types(model: Any) -> dict[str, int]:
    """Tensor name -> ONNX element type, from the graph's inputs, initializers, Constant
    nodes and ONNX's type inference (the export declares few value_infos)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # inference is best effort; the declared types below still count
        inferred = model.graph
    types: dict[str, int] = {}
    for info in [*inferred.value_info, *inferred.input, *inferred.output]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            types[info.name] = info.type.tensor_type.elem_type
    for tensor in model.graph.initializer:
        types[tensor.name] = tensor.data_type
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    types[node.output[0]] = attr.t.data_type
    return types


def _sort_nodes(graph: Any) -> None:
    """Put the nodes in topological order (ONNX requires it; the converter's input casts and
    the re-attached tail may break it)."""
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    nodes = list(graph.node)
    waiting = [{i for i in n.input if i not in known} for n in nodes]
    readers: dict[str, list[int]] = {}
    for index, missing in enumerate(waiting):
        for name in missing:
            readers.setdefault(name, []).append(index)
    ready = [i for i, missing in enumerate(waiting) if not missing]
    order: list[int] = []
    while ready:
        index = ready.pop()
        order.append(index)
        for name in nodes[index].output:
            for reader in readers.pop(name, []):
                waiting[reader].discard(name)
                if not waiting[reader]:
                    ready.append(reader)
    if len(order) != len(graph.node):
        raise ArtifactError(
            "the float16 graph has a cycle or reads a tensor nothing produces",
            hint="report this with the model; --mode dynamic or static may still work",
        )
    import copy

    ordered = [copy.deepcopy(nodes[i]) for i in order]
    del graph.node[:]
    graph.node.extend(ordered)


def grouped_matmuls(model: Any) -> list[str]:
    """MatMul nodes whose weight (an initializer) is not 2-D: a Hydra's grouped layers
    `[M, in, out]`. ONNX Runtime's per-channel int8 MatMul takes 2-D weights only."""
    ranks = {t.name: len(t.dims) for t in model.graph.initializer}
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "MatMul" and any(ranks.get(i, 2) != 2 for i in n.input)
    ]


# --- the drift gate ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """The drift gate: the quantized model against the float32 export."""

    min_agreement: float = 0.99
    max_ece_delta: float = 0.01
    max_nll_delta: float = 0.02
    max_auroc_drop: float = 0.01
    max_coverage_delta: float = 0.02
    max_entropy_shift: float = 0.1  # relative to the float32 mean, plus UNCERTAINTY_FLOOR
    max_mi_shift: float = 0.1


# Absolute slack (nats) of the entropy and MI gates: a single model's MI is 0 and a confident
# model's entropy near 0, where any relative bound alone would fail on rounding.
UNCERTAINTY_FLOOR = 0.01


@dataclass(frozen=True)
class Check:
    name: str  # "agreement", "ece_delta", ...
    value: float
    bound: str  # "agreement >= 0.99"
    passed: bool


@dataclass
class Drift:
    """The drift of a quantized model on the gate's data (written as `drift.json`)."""

    examples: int
    agreement: float
    max_abs_diff: dict[str, float]  # per contract output, over --data and --ood
    fp32: dict[str, float] = field(default_factory=dict)  # the float32 export's metrics
    quantized: dict[str, float] = field(default_factory=dict)
    # quantized - fp32; "ece": on the fp32 model's bins (metrics.ece_change), "ece_plain": of
    # the two ECEs
    deltas: dict[str, float] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # bounds that could not be measured
    flips: int = 0  # gate rows whose argmax changed
    allowed_flips: int = 0

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def describe(self) -> str:
        parts = [
            f"{c.name} {c.value:+.4f}"
            if c.name.endswith("delta") or c.name == "auroc_drop"
            else f"{c.name} {c.value:.4f}"
            for c in self.checks
        ]
        return (
            ", ".join(parts) + f", max |probs diff| {self.max_abs_diff.get('probs', 0.0):.2e} over "
            f"{self.examples} examples"
        )

    def to_dict(self) -> dict[str, Any]:
        raw = asdict(self)
        raw["passed"] = self.passed
        return raw


def allowed_flips(rows: int, min_agreement: float) -> int:
    """How many of `rows` may change their argmax at `min_agreement`."""
    return int(np.floor((1.0 - min_agreement) * rows + 1e-9))


def rows_for_one_flip(min_agreement: float) -> int:
    """The fewest gate rows on which `min_agreement` allows one flip (the bound means
    something only from there: below, any flip fails it)."""
    return int(np.ceil((1.0 - 1e-9) / (1.0 - min_agreement))) if min_agreement < 1 else 0


def _check(name: str, value: float, op: str, bound: float, what: str | None = None) -> Check:
    """`value op bound` as a gate check; `what` names the measured quantity in its bound
    (default: the check's name)."""
    ok = bool(np.isfinite(value)) and (value >= bound if op == ">=" else value <= bound)
    return Check(name, float(value), f"{what or name} {op} {bound:g}", ok)


def measure_drift(
    reference: Any,
    quantized: Any,
    inputs: list[dict[str, npt.NDArray[Any]]],
    labels: npt.NDArray[np.int64] | None,
    ood: dict[str, list[dict[str, npt.NDArray[Any]]]],
    bounds: Bounds,
) -> Drift:
    """Run both Predictors on the same encoded batches (a sampling model's noise drawn once
    and fed to both) and check the drift gate.

    `inputs`: batches of --data; `labels`: `[N]` class ids or None (then ECE and NLL are
    not checked); `ood`: batches per OOD set.
    """
    from uqcompress.uq import metrics as m
    from uqcompress.uq.calibration import abstain_scores, abstains

    def run_both(batches: list[dict[str, npt.NDArray[Any]]]) -> tuple[Any, Any]:
        ref_parts, got_parts = [], []
        for batch in batches:
            if reference.noise is not None and contract.NOISE_INPUT not in batch:
                batch = {**batch, contract.NOISE_INPUT: reference.draw_noise(batch)}
            ref_parts.append(reference.run(batch))
            got_parts.append(quantized.run(batch))
        return ref_parts, got_parts

    def stack(parts: list[Any], name: str) -> npt.NDArray[np.float64]:
        return np.concatenate([getattr(p, name) for p in parts]).astype(np.float64)

    max_abs = dict.fromkeys(contract.OUTPUT_NAMES, 0.0)

    def track(ref_parts: list[Any], got_parts: list[Any]) -> None:
        for name in contract.OUTPUT_NAMES:
            a, b = stack(ref_parts, name), stack(got_parts, name)
            diff = float(np.max(np.abs(a - b))) if a.size else 0.0
            max_abs[name] = max(max_abs[name], diff if np.isfinite(diff) else float("inf"))

    ref_parts, got_parts = run_both(inputs)
    track(ref_parts, got_parts)
    ref_probs, got_probs = stack(ref_parts, "probs"), stack(got_parts, "probs")
    n = len(ref_probs)
    flips = int(np.sum(np.argmax(ref_probs, 1) != np.argmax(got_probs, 1)))
    agreement = 1.0 - flips / n if n else 1.0
    drift = Drift(examples=n, agreement=agreement, max_abs_diff=max_abs)
    # As a count: `min_agreement` of n rows allows floor((1 - min_agreement) n) flips (the
    # epsilon keeps 0.99 x 100 from rounding to 0 allowed); 0 on fewer rows than 1 / (1 - it).
    drift.flips, drift.allowed_flips = flips, allowed_flips(n, bounds.min_agreement)
    drift.checks.append(
        Check(
            "agreement",
            agreement,
            f"flips <= {drift.allowed_flips} of {n} (agreement >= {bounds.min_agreement:g})",
            flips <= drift.allowed_flips,
        )
    )
    finite = bool(np.all(np.isfinite(got_probs)))
    if labels is not None and finite:
        for metric, fn in (("ece", m.ece), ("nll", m.nll)):
            drift.fp32[metric], drift.quantized[metric] = (
                fn(ref_probs, labels),
                fn(got_probs, labels),
            )
        # ECE's change is gated with both models binned by the float32 confidences: the plain
        # difference of two ECEs jumps by ~1/|bin| whenever a row crosses a bin edge, which on a
        # few hundred gate rows alone can pass 0.01 for an int8 model that changed nothing else
        # (kept in `ece_plain` for the reader)
        drift.deltas["ece"] = m.ece_change(ref_probs, got_probs, labels)
        drift.deltas["ece_plain"] = drift.quantized["ece"] - drift.fp32["ece"]
        drift.deltas["nll"] = drift.quantized["nll"] - drift.fp32["nll"]
        for metric, bound, what in (
            ("ece", bounds.max_ece_delta, "|ECE change, on the fp32 bins|"),
            ("nll", bounds.max_nll_delta, "|NLL change|"),
        ):
            value = abs(drift.deltas[metric])
            drift.checks.append(_check(f"{metric}_delta", value, "<=", bound, what))
    elif labels is None:
        drift.skipped += ["ece_delta", "nll_delta"]
    if finite:
        # The uncertainty the export exists to ship: int8 may keep the argmax and the
        # calibration yet flatten or sharpen the probabilities, and the ensemble's MI with it.
        for metric, output, bound in (
            ("mean_entropy", "entropy", bounds.max_entropy_shift),
            ("mean_mi", "mutual_info", bounds.max_mi_shift),
        ):
            before = float(np.mean(stack(ref_parts, output))) if n else 0.0
            after = float(np.mean(stack(got_parts, output))) if n else 0.0
            drift.fp32[metric], drift.quantized[metric] = before, after
            drift.deltas[metric] = after - before
            allowed = bound * abs(before) + UNCERTAINTY_FLOOR
            shift = abs(after - before)
            drift.checks.append(
                Check(
                    f"{metric}_shift",
                    shift,
                    f"|{metric} change| <= {bound:g} x {abs(before):.4g} + {UNCERTAINTY_FLOOR:g}",
                    bool(np.isfinite(shift)) and shift <= allowed,
                )
            )
    rule = reference.calibration.abstain if reference.calibration is not None else None
    if rule is not None:
        covered = []
        for parts in (ref_parts, got_parts):
            scores = abstain_scores(
                stack(parts, "probs"), stack(parts, "entropy"), stack(parts, "mutual_info")
            )
            covered.append(float(np.mean(~abstains(rule, scores))))
        drift.fp32["coverage"], drift.quantized["coverage"] = covered
        drift.deltas["coverage"] = covered[1] - covered[0]
        drift.checks.append(
            _check("coverage_delta", abs(covered[1] - covered[0]), "<=", bounds.max_coverage_delta)
        )
    worst = float("inf")
    for set_name, batches in ood.items():
        ood_ref, ood_got = run_both(batches)
        track(ood_ref, ood_got)
        for which, parts_in, parts_out in (
            ("fp32", ref_parts, ood_ref),
            ("quantized", got_parts, ood_got),
        ):
            scores_in = m.uncertainty_scores(m.softmax(stack(parts_in, "member_logits")))
            scores_out = m.uncertainty_scores(m.softmax(stack(parts_out, "member_logits")))
            for score in scores_in:
                key = f"ood.{set_name}.{score}.auroc"
                value = m.ood_detection(scores_in[score], scores_out[score])["auroc"]
                (drift.fp32 if which == "fp32" else drift.quantized)[key] = value
        for key in drift.fp32:
            if key.startswith(f"ood.{set_name}."):
                drift.deltas[key] = drift.quantized[key] - drift.fp32[key]
                worst = min(worst, drift.deltas[key])
    if ood:
        drift.checks.append(_check("auroc_delta", worst, ">=", -bounds.max_auroc_drop))
    drift.max_abs_diff = max_abs
    if not finite:
        drift.checks.append(Check("finite", 0.0, "probs finite", False))
    return drift
