"""What does head pruning buy on CPU, and what does scoring the heads cost? Side by side, one run.

1. Pruning. Four classifiers with random weights and the real shapes: BERT-base (2 labels,
   sequence 128), RoBERTa-base (2 labels, sequence 128), ViT-B/16 (10 labels, 3x224x224, 197
   tokens) and DINOv2-small (10 labels, 3x224x224, patch 14: 256 patches + CLS = 257 tokens;
   384 hidden, 6 heads, layer scale, classifier on [CLS ; mean of patches]) are pruned at ratios
   0, 0.25 and 0.5 (scope "layer", `random_scores` with a fixed seed; of DINOv2-small's 6 heads
   a layer keeps 6, 4 or 3, of the others' 12 it keeps 12, 9 or 6), each from a fresh copy.
   `--models` picks some of them by name (comma-separated). Per model and ratio: parameters,
   analytic forward FLOPs for one example, and ONNX Runtime CPU latency (median of `--repeats`
   runs after `--warmup`, batch 1 and 8; the three ratios' sessions take turns of 5 runs), each
   also as a ratio to the unpruned model measured in the same run. The last column is the
   largest |probs| difference between ONNX Runtime and torch on the batch-1 input: a pruned
   graph that computes something else would show up there, not in timings.
2. Scoring. Seconds each scoring method takes on 32 synthetic examples of the BERT-base shape
   (random token ids, sequence 128, all-ones attention mask, random labels, batch size 8):
   taylor, hies, l2, random, headmap and greedy-circuit (both keeping 50% of heads per layer).
   HeadMap's search on BERT-base is L*H = 144 forward passes over all 32 examples; uqc's greedy
   search is `circuit_evaluations` = 684 (about 45 minutes on 2 cores), so full mode times
   each search's first `--circuit-evals` evaluations and extrapolates
   (every evaluation is the same forward pass, only gate values differ: the per-evaluation cost
   is constant); `--circuit-evals 0` runs the whole search.

FLOPs, counted as 2 x multiply-adds of the matrix products, per example with T tokens, hidden
size D, MLP size I, head size d and h_l kept heads in layer l (LayerNorm, softmax, GELU, layer
scale, biases, residual adds and DINOv2's mean over patches are elementwise and left out). The
same formula serves every family: D and I come from `family.sizes(config)` (DINOv2 has no
`intermediate_size`: I = mlp_ratio x D), T is the sequence length for text and
`family.fixed_tokens(config)` for images (N = (image / P)^2 patches plus the special tokens),
and the head follows `family.layout`:

    per layer l:  4 T D (h_l d)       Q, K, V (D -> h_l d) and O (h_l d -> D) projections
                + 2 h_l T^2 d         scores Q K^T and the attention-weighted sum of V
                + 2 T D I             MLP (D -> I -> D), unchanged by pruning
    embeddings:   0 for text (table lookups); images: patch projection N (C P^2) D
    head:         pooler D^2 where `layout.pooler_activation` is set (BERT's pooler, RoBERTa's
                  classification-head dense), then classifier (w D) C_out with
                  w = `layout.pooled_width` (1: the first token; 2: DINOv2's [CLS ; mean])
    FLOPs = 2 x (sum over layers + embeddings + head)

so pruning only shrinks the first two terms, and the FLOPs ratio is the latency ratio one could
hope for if time were proportional to arithmetic. It is not a hard bound: the uncounted softmax,
mask add and head reshapes over `[B, H, T, T]` / `[B, H, T, d]` shrink with the heads too, so
measured latency can drop a little below it. The text models use their checkpoints'
vocabularies (`create_model` overrides; the shipped tokenizer has 711 tokens):
bert-base-uncased's 30522 tokens and roberta-base's 50265, so that their parameter counts, and
therefore the parameter ratios, are the real ones; embeddings add no FLOPs.

`--quick` is a smoke run (about 2 minutes on 2 cores): 2 layers of each of the four shapes for
pruning, 3 repeats, and scoring (all six methods, circuit searches run in full) on the tiny
preset (2 layers, 4 heads, hidden 32) at sequence 128. Scoring always runs on BERT, whatever
`--models` picks. Timings depend on the machine and what else runs on it; nothing here asserts
on them.

    .venv/bin/python benchmarks/prune_speed.py [--quick] [--markdown] [--threads 2]
        [--models RoBERTa-base,DINOv2-small]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from uqcompress.models.loading import LoadedModel

RATIOS = (0.0, 0.25, 0.5)
BATCHES = (1, 8)
OPSET = 18
BERT_VOCAB = 30522  # bert-base-uncased, so parameter counts are BERT-base's
ROBERTA_VOCAB = 50265  # roberta-base, so parameter counts are RoBERTa-base's
SCORE_EXAMPLES = 32
SCORE_BATCH = 8
CIRCUIT_RATIO = 0.5
TURN_RUNS = 5  # timed runs per session before the next ratio's session takes over
CIRCUIT_EVALS_FULL = 12  # the first pick of layer 0: about a minute on 2 cores


@dataclass(frozen=True)
class Shape:
    """A model to build with `create_model`: always the same weights for the same seed."""

    name: str
    family: str
    num_labels: int
    preset: str
    overrides: dict[str, Any] = field(default_factory=dict)

    def build(self, seed: int) -> LoadedModel:
        from uqcompress.models.factory import create_model

        labels = [f"class{i}" for i in range(self.num_labels)]
        return create_model(self.family, labels, self.preset, self.overrides, seed=seed)


@dataclass
class PruneRow:
    """One model at one ratio; latency in seconds per batch size."""

    model: str
    ratio: float
    heads: int
    params: int
    flops: int
    latency: dict[int, float]
    parity: float
    tokens: int = 0  # per example


@dataclass
class ScoreRow:
    """Seconds one scoring method took; for circuit, its evaluation count, and how many of
    them ran when the time is extrapolated."""

    method: str
    seconds: float
    evaluations: int | None = None
    measured: int | None = None


# --------------------------------------------------------------------------- shapes


def pruning_shapes(
    quick: bool, names: Sequence[str] | None = None, extra: Sequence[Shape] = ()
) -> list[Shape]:
    """The benchmarked models, in table order (`extra` after the four encoders); with
    `names`, only those (in that order)."""
    # Quick keeps the base widths (so per-layer FLOPs ratios are the real ones) but 2 layers.
    layers = {"num_hidden_layers": 2} if quick else {}
    shapes = [
        Shape("BERT-base", "bert", 2, "base", {"vocab_size": BERT_VOCAB, **layers}),
        Shape("RoBERTa-base", "roberta", 2, "base", {"vocab_size": ROBERTA_VOCAB, **layers}),
        Shape("ViT-B/16", "vit", 10, "base", dict(layers)),
        Shape("DINOv2-small", "dinov2", 10, "small", dict(layers)),
        *extra,
    ]
    if not names:
        return shapes
    by_name = {shape.name.lower(): shape for shape in shapes}
    unknown = [name for name in names if name.lower() not in by_name]
    if unknown:
        known = ", ".join(shape.name for shape in shapes)
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; choose from {known}")
    return [by_name[name.lower()] for name in names]


def model_names(value: str) -> list[str]:
    """`--models`' comma-separated list of shape names."""
    return [name.strip() for name in value.split(",") if name.strip()]


def scoring_shape(quick: bool) -> Shape:
    if quick:
        return Shape("BERT-tiny", "bert", 2, "tiny")
    return Shape("BERT-base", "bert", 2, "base", {"vocab_size": BERT_VOCAB})


def num_tokens(loaded: LoadedModel, seq_len: int) -> int:
    """Sequence length for text; for images the family's fixed count (patches plus special
    tokens: 197 for ViT-B/16, 257 for DINOv2-small at 224 pixels)."""
    fixed = loaded.family.fixed_tokens(loaded.config)
    if loaded.input_kind == "text" or fixed is None:
        return seq_len
    return int(fixed)


# --------------------------------------------------------------------------- FLOPs


def block_widths(loaded: LoadedModel) -> tuple[int, int, int]:
    """(hidden D, MLP width I, head size d) from the family, whatever its config calls them."""
    from uqcompress.models.head_gates import head_dim

    sizes = loaded.family.sizes(loaded.config)
    return int(sizes.hidden), int(sizes.intermediate), head_dim(loaded)


def layer_macs(loaded: LoadedModel, tokens: int, heads: int, kv_heads: int | None = None) -> int:
    """Multiply-adds of one block with `heads` query heads reading `kv_heads` key/value heads
    (grouped-query attention; default `heads`) on one example of `tokens` tokens."""
    hidden, inner, d_head = block_widths(loaded)
    kv = heads if kv_heads is None else kv_heads
    macs = 2 * tokens * hidden * (heads + kv) * d_head  # Q and O, K and V projections
    macs += 2 * heads * tokens * tokens * d_head  # Q K^T and probs @ V
    gated = loaded.family.sizes(loaded.config).gated_mlp  # SwiGLU: gate, up and down
    macs += (3 if gated else 2) * tokens * hidden * inner
    return macs


def embedding_macs(loaded: LoadedModel) -> int:
    """Multiply-adds of the embeddings: 0 for text (lookups), the patch projection (a strided
    conv, C P^2 -> D per patch) for images."""
    if loaded.input_kind == "text":
        return 0
    config = loaded.config
    patches = (int(config.image_size) // int(config.patch_size)) ** 2
    patch = int(config.num_channels) * int(config.patch_size) ** 2
    return patches * patch * block_widths(loaded)[0]


def head_macs(loaded: LoadedModel) -> int:
    """Multiply-adds of the head after the last block (one member's), from the family's
    layout: a D x D pooler dense where it has one, then the classifier on `pooled_width` x D
    features."""
    layout = loaded.family.layout
    hidden = block_widths(loaded)[0]
    macs = hidden * hidden if layout.pooler_activation is not None else 0
    return macs + layout.pooled_width * hidden * len(loaded.labels)


def forward_flops(loaded: LoadedModel, tokens: int) -> int:
    """FLOPs of one example's forward pass (formula in the module docstring).

    Reads each layer's current head count from the model, so uneven pruning counts right.
    """
    from uqcompress.models.head_gates import heads_per_layer

    macs = sum(layer_macs(loaded, tokens, heads) for heads in heads_per_layer(loaded))
    macs += embedding_macs(loaded) + head_macs(loaded)
    return 2 * macs


# --------------------------------------------------------------------------- pruning + ORT


def prune_copy(shape: Shape, ratio: float, seed: int) -> LoadedModel:
    """A fresh model with `ratio` of each layer's heads removed, chosen by seeded random scores."""
    from uqcompress.methods.pruning import select_heads
    from uqcompress.methods.scoring import random_scores
    from uqcompress.models.head_gates import heads_per_layer
    from uqcompress.models.surgery import prune_heads

    loaded = shape.build(seed)
    counts = heads_per_layer(loaded)
    scores = random_scores(len(counts), counts[0], seed)
    prune_heads(loaded, select_heads(scores, ratio, "layer"))
    return loaded


def ort_inputs(loaded: LoadedModel, batch: int, seq_len: int, seed: int) -> dict[str, np.ndarray]:
    """Synthetic inputs with the exported graph's names: token ids with an all-ones mask, or
    standard-normal pixels (what preprocessing produces)."""
    rng = np.random.default_rng(seed)
    config = loaded.config
    if loaded.input_kind == "text":
        ids = rng.integers(5, int(config.vocab_size), size=(batch, seq_len), dtype=np.int64)
        return {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids),
        }
    size, channels = int(config.image_size), int(config.num_channels)
    pixels = rng.standard_normal((batch, channels, size, size), dtype=np.float32)
    return {"pixel_values": pixels}


def ort_session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    # One graph, run sequentially: inter-op threads would only compete for the same cores.
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def median_latencies(
    sessions: Sequence[Any], inputs: dict[str, np.ndarray], warmup: int, repeats: int
) -> list[float]:
    """Median wall seconds of one `session.run`, per session, on the same inputs.

    The sessions take turns in rounds of TURN_RUNS timed runs, so a load spike or clock change
    on the machine hits every ratio alike instead of skewing whichever one ran then. Each turn
    starts with an untimed run: switching sessions every run measured cold caches and the
    previous session's still-spinning thread pool (batch 1 came out 2x slower), which a
    deployed model never sees. The median shrugs off single scheduler hiccups.
    """
    for session in sessions:
        for _ in range(warmup):
            session.run(None, inputs)
    times: list[list[float]] = [[] for _ in sessions]
    while len(times[0]) < repeats:
        turn = min(TURN_RUNS, repeats - len(times[0]))
        for session, samples in zip(sessions, times, strict=True):
            session.run(None, inputs)
            for _ in range(turn):
                start = time.perf_counter()
                session.run(None, inputs)
                samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


def ort_torch_gap(graph: Any, session: Any, inputs: dict[str, np.ndarray]) -> float:
    """Largest |probs| difference between ONNX Runtime and torch on the same inputs."""
    import torch

    with torch.inference_mode():
        reference = graph(**{k: torch.from_numpy(v) for k, v in inputs.items()})[1]
    probs = session.run(["probs"], inputs)[0]
    return float(np.max(np.abs(reference.float().numpy() - probs)))


def measure_model(shape: Shape, args: argparse.Namespace) -> list[PruneRow]:
    """One row per ratio in RATIOS; all ratios' sessions are open at once for interleaved timing."""
    from uqcompress.export.graph import graph_for
    from uqcompress.export.onnx import export_graph
    from uqcompress.models.head_gates import heads_per_layer

    models = [prune_copy(shape, ratio, args.seed) for ratio in RATIOS]
    graphs = [graph_for(loaded.model, loaded.input_kind) for loaded in models]
    latency: list[dict[int, float]] = [{} for _ in RATIOS]
    with tempfile.TemporaryDirectory(prefix="prune_speed-") as tmp:
        sessions = []
        for ratio, loaded, graph in zip(RATIOS, models, graphs, strict=True):
            log(f"{shape.name} ratio {ratio}: exporting")
            path = Path(tmp) / f"ratio-{ratio}.onnx"
            export_graph(graph, loaded, path, OPSET)
            sessions.append(ort_session(path, args.ort_threads))
        # Inputs depend only on the shape (vocabulary, image size), not on the heads kept.
        for batch in BATCHES:
            log(f"{shape.name}: timing batch {batch}, ratios {RATIOS} interleaved")
            inputs = ort_inputs(models[0], batch, args.seq_len, args.seed)
            medians = median_latencies(sessions, inputs, args.warmup, args.repeats)
            for per_ratio, seconds in zip(latency, medians, strict=True):
                per_ratio[batch] = seconds
        check = ort_inputs(models[0], 1, args.seq_len, args.seed)
        parity = [
            ort_torch_gap(graph, session, check)
            for graph, session in zip(graphs, sessions, strict=True)
        ]
        del sessions  # release the files before the temp dir goes
    return [
        PruneRow(
            model=shape.name,
            ratio=ratio,
            heads=sum(heads_per_layer(loaded)),
            params=loaded.num_parameters(),
            flops=forward_flops(loaded, num_tokens(loaded, args.seq_len)),
            latency=times,
            parity=gap,
            tokens=num_tokens(loaded, args.seq_len),
        )
        for ratio, loaded, times, gap in zip(RATIOS, models, latency, parity, strict=True)
    ]


# --------------------------------------------------------------------------- scoring


def synthetic_batches(loaded: LoadedModel, seq_len: int, seed: int) -> list[dict[str, Any]]:
    """SCORE_EXAMPLES labelled text examples in batches of SCORE_BATCH, as `collate` builds them.

    Shape: input_ids / attention_mask / token_type_ids `[B, T]`, labels `[B]`.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    vocab, classes = int(loaded.config.vocab_size), len(loaded.labels)
    batches = []
    for _ in range(SCORE_EXAMPLES // SCORE_BATCH):
        ids = torch.randint(5, vocab, (SCORE_BATCH, seq_len), generator=generator)
        batches.append(
            {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "token_type_ids": torch.zeros_like(ids),
                "labels": torch.randint(0, classes, (SCORE_BATCH,), generator=generator),
            }
        )
    return batches


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class _EnoughEvaluations(Exception):
    """Raised from circuit search's progress callback to stop after the sampled evaluations."""


def time_circuit(
    loaded: LoadedModel, batches: list[dict[str, Any]], limit: int, method: str = "greedy-circuit"
) -> tuple[float, int, int]:
    """(seconds, evaluations, evaluations run) of a circuit search at CIRCUIT_RATIO:
    `greedy-circuit` (uqc's greedy forward search) or `headmap` (HeadMap's locating).

    With `0 < limit < evaluations`, only the first `limit` evaluations run and the seconds
    are extrapolated linearly to the whole search.
    """
    from uqcompress.methods.scoring import (
        circuit_evaluations,
        circuit_scores,
        headmap_evaluations,
        headmap_scores,
    )
    from uqcompress.models.head_gates import heads_per_layer

    counts = heads_per_layer(loaded)
    keep = [h - round(CIRCUIT_RATIO * h) for h in counts]
    if method == "headmap":
        search, total = headmap_scores, headmap_evaluations(counts)
    else:
        search, total = circuit_scores, circuit_evaluations(keep, counts[0])
    done = 0

    def progress(count: int, _total: int) -> None:
        nonlocal done
        done = count
        if 0 < limit <= count < total:
            raise _EnoughEvaluations

    start = time.perf_counter()
    with contextlib.suppress(_EnoughEvaluations):  # the sampled evaluations are done
        search(loaded, batches, keep, progress=progress)
    seconds = time.perf_counter() - start
    return seconds * total / max(done, 1), total, done


def measure_scoring(args: argparse.Namespace) -> tuple[Shape, list[ScoreRow]]:
    import torch

    from uqcompress.methods.scoring import hies_scores, l2_scores, random_scores, taylor_scores
    from uqcompress.models.head_gates import heads_per_layer

    shape = scoring_shape(args.quick)
    loaded = shape.build(args.seed)
    batches = synthetic_batches(loaded, args.seq_len, args.seed)
    counts = heads_per_layer(loaded)
    # One untimed forward first: lazy kernel/allocator setup would otherwise bill the first
    # method in the table.
    with torch.inference_mode():
        loaded.model(**{k: v for k, v in batches[0].items() if k != "labels"})
    methods: list[tuple[str, Callable[[], object]]] = [
        ("taylor", lambda: taylor_scores(loaded, batches)),
        ("hies", lambda: hies_scores(loaded, batches)),
        ("l2", lambda: l2_scores(loaded)),
        ("random", lambda: random_scores(len(counts), counts[0], args.seed)),
    ]
    rows = []
    for name, fn in methods:
        log(f"scoring: {name}")
        rows.append(ScoreRow(name, timed(fn)))
    limit = 0 if args.quick else args.circuit_evals
    for method in ("headmap", "greedy-circuit"):
        log(f"scoring: {method} ({'all' if limit == 0 else limit} evaluations)")
        seconds, total, done = time_circuit(loaded, batches, limit, method)
        rows.append(ScoreRow(method, seconds, total, done if done < total else None))
    return shape, rows


# --------------------------------------------------------------------------- tables


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    left: tuple[int, ...] = (0,)  # text columns, left-aligned; the rest are numbers


def render_plain(table: Table) -> str:
    columns = list(zip(table.headers, *table.rows, strict=True))
    widths = [max(len(cell) for cell in column) for column in columns]
    lines = [table.title]
    for cells in (table.headers, *table.rows):
        padded = [
            cell.ljust(w) if i in table.left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        ]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def render_markdown(table: Table) -> str:
    lines = [f"**{table.title}**", ""]
    lines.append("| " + " | ".join(table.headers) + " |")
    align = [":---" if i in table.left else "---:" for i in range(len(table.headers))]
    lines.append("|" + "|".join(align) + "|")
    lines.extend("| " + " | ".join(row) + " |" for row in table.rows)
    return "\n".join(lines)


def baseline(rows: Sequence[PruneRow], row: PruneRow) -> PruneRow:
    return next(r for r in rows if r.model == row.model and r.ratio == 0.0)


def pruning_table(rows: Sequence[PruneRow], args: argparse.Namespace) -> Table:
    headers = ["model", "pruned", "heads", "params (M)", "x", "GFLOPs/example", "x"]
    for batch in BATCHES:
        headers += [f"ORT b{batch} (ms)", "x"]
    headers.append("ORT vs torch max abs dp")  # no "|": it would split a Markdown cell
    body = []
    for row in rows:
        base = baseline(rows, row)
        cells = [
            row.model,
            f"{row.ratio:.0%}",
            str(row.heads),
            f"{row.params / 1e6:.1f}",
            f"{row.params / base.params:.2f}",
            f"{row.flops / 1e9:.2f}",
            f"{row.flops / base.flops:.2f}",
        ]
        for batch in BATCHES:
            cells += [
                f"{row.latency[batch] * 1e3:.1f}",
                f"{row.latency[batch] / base.latency[batch]:.2f}",
            ]
        cells.append(f"{row.parity:.1e}")
        body.append(cells)
    title = (
        f"Head pruning (scope layer, random scores, seed {args.seed}): ONNX Runtime CPU, "
        f"{args.ort_threads} threads, median of {args.repeats} after {args.warmup} warm-up; "
        f"tokens per example: {tokens_line(rows)}; x = pruned / unpruned"
    )
    return Table(title, headers, body)


def tokens_line(rows: Sequence[Any]) -> str:
    """ "BERT-base 128, ViT-B/16 197, ...": each model's tokens per example, in table order."""
    tokens = {row.model: row.tokens for row in rows}
    return ", ".join(f"{model} {count}" for model, count in tokens.items())


def scoring_table(shape: Shape, rows: Sequence[ScoreRow], args: argparse.Namespace) -> Table:
    body = []
    for row in rows:
        evaluations = "" if row.evaluations is None else str(row.evaluations)
        if row.measured is None:
            # Two decimals, except for the near-instant methods (l2, random).
            seconds = f"{row.seconds:.2f}" if row.seconds >= 0.01 else f"{row.seconds:.1e}"
            note = ""
        else:
            seconds = f"~{row.seconds:.0f}"
            note = f"extrapolated from the first {row.measured} evaluations"
        body.append([row.method, evaluations, seconds, note])
    title = (
        f"Head scoring on {shape.name} ({SCORE_EXAMPLES} examples, sequence {args.seq_len}, "
        f"batch {SCORE_BATCH}, torch {args.threads} threads; the circuit searches keep "
        f"{1 - CIRCUIT_RATIO:.0%} of heads per layer, and each of their evaluations is a "
        f"forward pass over all {SCORE_EXAMPLES} examples)"
    )
    return Table(title, ["method", "evaluations", "seconds", "note"], body, left=(0, 3))


def latency_note(rows: Sequence[PruneRow]) -> str:
    """One line: measured latency ratio at 50% heads against the FLOPs ratio, per model."""
    parts = []
    for row in rows:
        if row.ratio != 0.5:
            continue
        base = baseline(rows, row)
        measured = " / ".join(f"{row.latency[b] / base.latency[b]:.2f}x (b{b})" for b in BATCHES)
        parts.append(
            f"{row.model} latency ratio {measured} vs FLOPs bound {row.flops / base.flops:.2f}x"
        )
    return "At 50% heads: " + "; ".join(parts) + "."


# --------------------------------------------------------------------------- main


def stderr_logger(name: str) -> Callable[[str], None]:
    """Progress goes to stderr, prefixed with the benchmark's name, so stdout holds only the
    tables."""

    def log(message: str) -> None:
        print(f"[{name}] {message}", file=sys.stderr, flush=True)

    return log


log = stderr_logger("prune_speed")


def environment_line(mode: str, seconds: float, extra: str = "") -> str:
    """The run's mode, duration, machine and library versions, printed above the tables."""
    import onnxruntime
    import torch
    import transformers

    extra = f", {extra}" if extra else ""
    return (
        f"{mode} run, {seconds:.0f} s{extra}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, onnxruntime {onnxruntime.__version__}"
    )


def print_report(
    setup: str, tables: Sequence[Table], markdown: bool, note: str | None = None
) -> None:
    """The set-up line, the tables as plain text and, with `markdown`, again as Markdown."""
    print(setup + "\n")
    print("\n\n".join(render_plain(t) for t in tables))
    if note is not None:
        print("\n" + note)
    if markdown:
        print("\n" + "-" * 40 + " Markdown\n")
        print(f"_{setup}_\n")
        print("\n\n".join(render_markdown(t) for t in tables))
        if note is not None:
            print("\n" + note)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small shapes, 3 repeats")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument(
        "--ort-threads",
        type=int,
        default=os.cpu_count() or 1,
        help="ONNX Runtime intra-op threads (default: os.cpu_count())",
    )
    parser.add_argument("--repeats", type=int, help="timed runs per latency (default 20, quick 3)")
    parser.add_argument("--warmup", type=int, help="untimed runs first (default 3, quick 1)")
    parser.add_argument(
        "--seq-len", type=int, default=128, help="text models' tokens (default 128)"
    )
    parser.add_argument("--seed", type=int, default=0, help="weights, scores and data (default 0)")
    parser.add_argument(
        "--models",
        type=model_names,
        help="comma-separated models to prune (default all: BERT-base,RoBERTa-base,ViT-B/16,"
        "DINOv2-small); scoring runs on BERT regardless",
    )
    parser.add_argument(
        "--circuit-evals",
        type=int,
        default=CIRCUIT_EVALS_FULL,
        help=f"full mode: circuit evaluations to time before extrapolating, 0 = run all "
        f"(default {CIRCUIT_EVALS_FULL}); quick mode always runs all",
    )
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 3 if args.quick else 20
    if args.warmup is None:
        args.warmup = 1 if args.quick else 3
    return args


def setup_line(args: argparse.Namespace, seconds: float) -> str:
    mode = "quick (2 layers of each shape; scoring on the tiny preset)" if args.quick else "full"
    return environment_line(mode, seconds)


def main() -> None:
    import torch

    from uqcompress.models.loading import quiet_transformers

    args = parse_args()
    quiet_transformers()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    shapes = pruning_shapes(args.quick, args.models)
    prune_rows = [row for shape in shapes for row in measure_model(shape, args)]
    score_shape, score_rows = measure_scoring(args)
    tables = [pruning_table(prune_rows, args), scoring_table(score_shape, score_rows, args)]
    note = latency_note(prune_rows)
    setup = setup_line(args, time.perf_counter() - start)
    print_report(setup, tables, args.markdown, note)


if __name__ == "__main__":
    main()
