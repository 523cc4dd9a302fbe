"""Export to ONNX and prove it: the parity gate runs ONNX Runtime against PyTorch.

The gate feeds *raw* examples through both deployment paths, the torch pipeline (our
tokeniser/preprocessing + the model) and the torch-free Predictor (tokenizers/numpy + ONNX
Runtime), in batches of a different size, length and padding than the trace example, so it
catches graph, dynamic-axis and preprocessing drift alike.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from uqcompress.data.dataset import LabeledData
from uqcompress.engine.modality import DEFAULT_MAX_LENGTH, modality_of, synthetic_examples
from uqcompress.errors import ConfigError
from uqcompress.export import contract
from uqcompress.export.onnx_file import write_model
from uqcompress.export.parity import Parity, describe_tolerances, logit_tolerances
from uqcompress.models.loading import LoadedModel

TRACE_BATCH = 2
TRACE_LENGTH = 8
PARITY_BATCH = 5  # differs from TRACE_BATCH on purpose
PARITY_EXAMPLES = 64
MIN_OPSET = 18  # the dynamo exporter's floor


@dataclass
class ParityReport:
    """The export gate's outcome: the shared `Parity` check of all four contract outputs
    (`export/parity.py`) plus what only the export measures (argmax agreement, the batch
    shapes and padding the gate exercised). Written as `parity.json`."""

    atol: float
    examples: int
    batch_size: int
    # output -> its own tolerance where it is not atol: a calibrated model's logit outputs
    # at atol / T when T < 1 (`export.parity.logit_tolerances`)
    tolerances: dict[str, float] = field(default_factory=dict)
    shapes: list[str] = field(default_factory=list)  # first input's shape per batch, "BxT"
    padded_batches: int = 0
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # NaN/inf, shape mismatches
    argmax_agreement: float = 1.0
    passed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        diffs = ", ".join(f"{k} {v:.2e}" for k, v in self.max_abs_diff.items())
        head = "".join(f"{p}; " for p in self.problems)
        return (
            f"{head}max |diff| {diffs}; argmax agreement {self.argmax_agreement:.4f} over "
            f"{self.examples} examples ({describe_tolerances(self)})"
        )


def _trace_inputs(loaded: LoadedModel) -> tuple[Any, ...]:
    """The example the exporter traces: TRACE_BATCH examples of TRACE_LENGTH tokens (and a
    sampling model's zero noise), positionally in the graph's input order."""
    import torch

    from uqcompress.export.graph import takes_noise

    modality = modality_of(loaded.input_kind)
    model: Any = loaded.model
    inputs: tuple[Any, ...] = tuple(
        modality.example_inputs(loaded, TRACE_BATCH, TRACE_LENGTH).values()
    )
    if takes_noise(model):
        tokens = modality.noise_tokens(model, TRACE_LENGTH)
        inputs += (torch.zeros(model.noise_shape(TRACE_BATCH, tokens)),)
    return inputs


# Weights above this go to an external-data file beside the graph (`model.onnx.data`): one
# protobuf message cannot exceed 2 GiB, and the graph itself needs some room.
EXTERNAL_DATA_BYTES = 1_800_000_000


def weight_bytes(model: Any) -> int:
    """Bytes of a module's parameters and floating-point buffers (what the graph stores)."""
    tensors = [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())]
    return sum(t.numel() * t.element_size() for t in tensors)


def export_graph(
    graph: Any,
    loaded: LoadedModel,
    path: Path,
    opset: int,
    metadata: dict[str, str] | None = None,
    member_gemms: bool = True,
) -> bool:
    """Trace ``graph`` with the dynamo exporter into `path`: one self-contained `.onnx` file,
    or, for weights over `EXTERNAL_DATA_BYTES`, the graph plus `<path>.data` beside it
    (ONNX external data, which ONNX Runtime reads from the graph's folder), with `metadata`
    as its metadata_props (in key order; the exporter's own are replaced). Returns whether
    the weights went to external data. An ensemble's member-wise maps in `graph` are laid out
    for ONNX Runtime first, in place (`models.grouped.split_grouped_linears`);
    `member_gemms=False` keeps them batched (`benchmarks/hydra_cost.py` times both)."""
    import torch
    from torch.export import Dim

    if opset < MIN_OPSET:
        raise ConfigError(f"--opset {opset} is below {MIN_OPSET}", hint=f"pass --opset {MIN_OPSET}")
    from uqcompress.export.graph import takes_noise

    batch = Dim("batch", min=1, max=1 << 16)
    modality = modality_of(loaded.input_kind)
    sequence = Dim("sequence", min=1, max=loaded.max_length or DEFAULT_MAX_LENGTH)
    axes, noise_axes = modality.varying_axes(batch, sequence)
    names: tuple[str, ...] = modality.inputs
    dynamic: tuple[dict[int, Any], ...] = tuple(axes for _ in names)
    if takes_noise(loaded.model):
        names += (contract.NOISE_INPUT,)
        dynamic += (noise_axes,)
    graph.eval()
    # Ensembles' member-wise maps as one 2-D GEMM per member: ONNX Runtime pre-packs those
    # (see models/grouped.py). In place: `graph` computes the same, now in that layout.
    example = _trace_inputs(loaded)
    if member_gemms:
        _split_checked(graph, example)
    external = weight_bytes(graph) > EXTERNAL_DATA_BYTES
    # The exporter narrates on stdout, which carries only our result: send it to stderr.
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            graph,
            example,
            input_names=list(names),
            output_names=list(contract.GRAPH_OUTPUTS),
            dynamic_shapes=dynamic,
            opset_version=opset,
            dynamo=True,
            external_data=external,
            verbose=False,
        )
        assert program is not None
        if metadata is not None:
            # Set before saving: loading the saved file again to add them held a second copy
            # of the weights of a graph without external data (1x more peak memory).
            program.model.metadata_props.clear()
            program.model.metadata_props.update(sorted(metadata.items()))
        if external:
            program.save(str(path), external_data=True)
        else:
            # onnx's own save held the weights three more times (a proto, its bytes)
            write_model(program.model, path)
        # onnxscript's rewrite rules keep a reference to the last graph they matched, whose
        # initializers alias the model's weights: without this (and the parameters emptied
        # by the export step) the weights stayed alive after the export (measured)
        for value in program.model.graph.initializers.values():
            value.const_value = None
    return external


# How far the per-member layout may move an output from the batched one (float rounding of
# the same products; a wrong swap moves logits by their own size)
SPLIT_TOLERANCE = 1e-4


def _split_checked(graph: Any, example: tuple[Any, ...]) -> None:
    """`split_grouped_linears(graph)`, checked: the trace example's outputs before and after
    must agree to SPLIT_TOLERANCE (relative to the largest output), so the parity gate,
    which then runs this same module, compares the graph with the model as it was saved."""
    import torch

    from uqcompress.models.grouped import GroupedLinear, split_grouped_linears

    if not any(isinstance(m, GroupedLinear) for m in graph.modules()):
        return
    # no_grad, not inference_mode: the new weights must stay ordinary tensors for the tracer
    with torch.no_grad():
        before = graph(*example)
    split_grouped_linears(graph)
    with torch.no_grad():
        after = graph(*example)
    for name, old, new in zip(contract.GRAPH_OUTPUTS, before, after, strict=True):
        scale = max(1.0, float(old.abs().max()))
        gap = float((old - new).abs().max())
        if not gap <= SPLIT_TOLERANCE * scale:
            raise RuntimeError(
                f"laying out the member-wise layers for ONNX changed {name} by {gap:.2e}: a "
                "bug in models/grouped.py (export with member_gemms=False to compare)"
            )


def metadata_for(
    loaded: LoadedModel,
    source_id: str,
    source_kind: str,
    members: int = 1,
    max_length: int | None = None,
) -> dict[str, str]:
    """The graph's metadata_props; `max_length` (text): the length the Predictor truncates
    to (default: the model's position table)."""
    from uqcompress.data.encoding import recorded_text_input, uses_token_types
    from uqcompress.uq.noise import NOISE_SCHEME

    if loaded.input_kind == "text":
        assert loaded.tokenizer is not None
        preprocessing: dict[str, Any] = {
            "type": "text",
            "tokenizer": contract.TOKENIZER_FILE,
            "max_length": max_length or loaded.max_length or DEFAULT_MAX_LENGTH,
            "pad_token_id": int(loaded.tokenizer.pad_token_id or 0),
            # a pair's second text has token type 1 (BERT, ELECTRA); else all types are 0
            "token_types": uses_token_types(loaded),
        }
        recorded = recorded_text_input(loaded.config)
        if recorded is not None:  # trained on pairs or single texts: the Predictor checks
            preprocessing["text_pair"] = bool(recorded["pair"])
    else:
        assert loaded.preprocessing is not None
        p = loaded.preprocessing
        preprocessing = {
            "type": "image",
            "image_size": p.image_size,
            "num_channels": p.num_channels,
            "rescale_factor": p.rescale_factor,
            "image_mean": list(p.image_mean),
            "image_std": list(p.image_std),
            "pixel_scale": "0..255",
            # the image processor's config: resize/crop images of any size before the above
            "processor": p.to_config(),
        }
    names = list(modality_of(loaded.input_kind).inputs)
    noise: dict[str, str] = {}
    model: Any = loaded.model
    if hasattr(model, "noise_shape"):
        names.append(contract.NOISE_INPUT)
        _, samples, steps, _, hidden = model.noise_shape(1, 1)
        noise[contract.META_NOISE] = json.dumps(
            {
                "samples": samples,
                "steps": steps,
                "hidden": hidden,
                "tokens": model.image_tokens(),
                "seed": int(model.spec.seed),
                "scheme": NOISE_SCHEME,  # how the Predictor draws per example (uq/noise.py)
            }
        )
    if loaded.calibration is not None:
        noise[contract.META_CALIBRATION] = json.dumps(loaded.calibration.to_dict())
    return {
        **noise,
        contract.META_FORMAT: contract.FORMAT_VERSION,
        contract.META_SOURCE_ID: source_id,
        contract.META_SOURCE_KIND: source_kind,
        contract.META_LABELS: json.dumps(loaded.labels),
        contract.META_INPUT_KIND: loaded.input_kind,
        contract.META_INPUT_NAMES: json.dumps(names),
        contract.META_PREPROCESSING: json.dumps(preprocessing),
        contract.META_MEMBERS: str(members),
        contract.META_AGGREGATION: contract.AGGREGATION,
    }


@dataclass
class ParityCase:
    """One batch of the parity check: the graph's inputs as the Predictor encodes them (a
    sampling model's noise included) and torch's outputs for the same examples."""

    inputs: dict[str, Any]
    reference: list[Any]


@dataclass
class ParityReference:
    """torch's side of the parity check, computed before ONNX Runtime opens the graph so
    that the two never hold the weights at the same time."""

    cases: list[ParityCase]
    examples: int
    temperature: float
    padded_batches: int = 0
    shapes: list[str] = field(default_factory=list)


def parity_reference(
    graph: Any,
    loaded: LoadedModel,
    predictor: Any,
    data: LabeledData,
    max_length: int | None = None,
) -> ParityReference:
    """Run torch on up to PARITY_EXAMPLES raw examples in batches of PARITY_BATCH, and keep
    the ONNX inputs the Predictor encodes for them (it needs its tokenizer and metadata,
    not its session: open it with ``open_session=False``).

    Synthetic examples of mixed lengths are always appended, so that padding and lengths
    other than the trace example's are exercised even when the real data is uniform.
    """
    import torch

    from uqcompress.data.encoding import collate, encode, encode_images

    head = _head(data, PARITY_EXAMPLES)
    pairs = head.text_pairs is not None if head.input_kind == "text" else None
    subset = _concat(head, synthetic_examples(loaded, pairs=pairs))
    n = len(subset)
    # the torch side truncates as the Predictor does (the metadata's max_length)
    encoded = encode(subset, loaded, np.zeros(n, dtype=np.int64), max_length)
    raw = None
    if subset.input_kind == "image":
        raw = encode_images(subset, loaded.preprocessing, encoded.labels, normalise=False)
    temperature = loaded.calibration.temperature if loaded.calibration is not None else 1.0
    reference = ParityReference(cases=[], examples=n, temperature=temperature)
    graph.eval()
    for start in range(0, n, PARITY_BATCH):
        index = list(range(start, min(n, start + PARITY_BATCH)))
        batch = {k: v for k, v in collate(encoded, index).items() if k != "labels"}
        if subset.input_kind == "text":
            assert subset.texts is not None
            pair = subset.text_pairs
            onnx_inputs = predictor.encode_texts(
                [subset.texts[i] for i in index],
                [pair[i] for i in index] if pair is not None else None,
            )
            reference.padded_batches += int((onnx_inputs["attention_mask"] == 0).any())
        else:
            # The Predictor takes the processor's resized pixels and rescales and normalises
            # them itself, from its own metadata: that is what this compares.
            assert raw is not None
            onnx_inputs = predictor.encode_pixels(collate(raw, index)["pixel_values"].numpy())
        first = next(iter(onnx_inputs.values()))
        reference.shapes.append("x".join(str(d) for d in first.shape))
        if predictor.noise is not None:  # both sides draw the same samples
            onnx_inputs[contract.NOISE_INPUT] = predictor.draw_noise(onnx_inputs)
            batch[contract.NOISE_INPUT] = torch.from_numpy(onnx_inputs[contract.NOISE_INPUT])
        with torch.inference_mode():
            outputs = [t.float().numpy() for t in graph(**batch)]
        reference.cases.append(ParityCase(onnx_inputs, outputs))
    return reference


def check_parity(reference: ParityReference, predictor: Any, atol: float) -> ParityReport:
    """Run the graph on the reference's inputs and compare every output with torch's.

    Passes when the shared `Parity` check passes (every graph output within `atol`, a
    calibrated model's logits within atol / T when T < 1; shapes equal, no NaN/inf on either
    side) and every argmax agrees.
    """
    tolerances = logit_tolerances(atol, reference.temperature)
    report = ParityReport(
        atol=atol,
        examples=reference.examples,
        batch_size=PARITY_BATCH,
        tolerances=tolerances,
        padded_batches=reference.padded_batches,
        shapes=list(reference.shapes),
    )
    # every graph output: `logits` for Hugging Face loaders too
    parity = Parity(atol, names=contract.GRAPH_OUTPUTS, tolerances=tolerances)
    agree = 0
    for case in reference.cases:
        got = predictor.run(case.inputs)
        produced = [*got.arrays(), predictor.loader_logits(case.inputs)]
        parity.compare(case.reference, produced)
        if case.reference[1].shape == got.probs.shape:
            agree += int(
                np.sum(np.argmax(case.reference[1], axis=1) == np.argmax(got.probs, axis=1))
            )
    report.max_abs_diff = dict(parity.max_abs_diff)
    report.problems = list(parity.problems.values())
    report.argmax_agreement = agree / reference.examples
    report.passed = parity.passed and agree == reference.examples
    return report


def _concat(a: LabeledData, b: LabeledData) -> LabeledData:
    if a.spec == b.spec:
        return a
    return LabeledData(
        spec=f"{a.spec} + {b.spec}",
        input_kind=a.input_kind,
        labels=None,
        fingerprint=a.fingerprint,
        texts=(a.texts or []) + (b.texts or []) if a.input_kind == "text" else None,
        text_pairs=a.text_pairs + b.text_pairs
        if a.text_pairs is not None and b.text_pairs is not None
        else None,
        columns=a.columns,
        images=a.images.concat(b.images) if a.images is not None and b.images is not None else None,
    )


def _head(data: LabeledData, n: int) -> LabeledData:
    return LabeledData(
        spec=data.spec,
        input_kind=data.input_kind,
        labels=None,
        fingerprint=data.fingerprint,
        texts=data.texts[:n] if data.texts is not None else None,
        text_pairs=data.text_pairs[:n] if data.text_pairs is not None else None,
        columns=data.columns,
        images=data.images.subset(range(min(n, len(data.images))))
        if data.images is not None
        else None,
    )
