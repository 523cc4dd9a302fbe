"""What does a DIRECTOR student cost on CPU next to its teacher, as S grows? One run.

For a BERT-base-shaped teacher (2 labels, sequence 128, bert-base-uncased's 30522-token
vocabulary) and a ViT-B/16-shaped one (10 labels, 3x224x224, 197 tokens), both random (the
shapes of `prune_speed.py`; costs do not depend on the weights' values, so nothing is trained),
and for S = 1, 5 and 10 samples (`--samples`), predictions are measured side by side from:

- teacher: the classifier itself, seed `--seed`;
- student S=s: `methods.director.build_student(teacher, replace_last=None, depth=--depth,
  samples=s, seed=--seed)`: the teacher's embeddings and head (its last MLP, pooler or final
  norm, classifier) around one shared DiT transition (adaLN-Zero, MLP ratio 4, the teacher's
  head count; a residual mean head and a softplus std head) that replaces every one of the
  teacher's L layers: K = L sampled steps, run for S roll-outs folded into the batch. One
  student per S, all built with the same seed, so they hold the same weights and differ in S
  only (S is fixed in an exported graph, so each S is its own ONNX file anyway).

Every configuration runs what `export.graph.graph_for` wraps around its model (member logits,
probabilities, entropy, mutual information), in torch and, exported at opset 18, in ONNX
Runtime. A student's graph takes its noise as an input, `noise` `[B, S, K, T, D]`, drawn here
with numpy's standard normal; torch and ONNX Runtime get the same array. Feeding it is part of
the student's cost: in torch the forward pass permutes and copies it to `[K, S*B, T, D]`.
Full mode's largest, ViT batch 8 at S = 10, is 8 x 10 x 12 x 197 x 768 floats, about 580 MB.
Per configuration:

1. parameters, from `methods.director.parameter_counts` (weights only, no buffers): the
   teacher's, the student's (embeddings, transition and head together) and the transition's;
2. analytic FLOPs per example (below);
3. torch eager CPU latency: median wall time of one batch under `torch.inference_mode`, over
   `--repeats` runs after `--warmup`, batch 1 and 8, `--threads` torch threads;
4. ONNX Runtime CPU latency: the same, CPUExecutionProvider with `--threads` intra-op threads.
   Within one engine and batch size, the teacher and all students of a model take turns of 5
   timed runs, so load spikes hit them alike; each turn starts with an untimed run (the first
   turn with the `--warmup` runs), so no configuration pays for the previous one's caches and
   thread pool (`hydra_cost.interleaved_medians`);
5. parity: the largest |member logit| difference between ONNX Runtime and torch on the same
   batch-1 input (and, for a student, the same noise); float32 rounding, about 1e-6, when
   the exported graph computes what torch does.

Ratios to the teacher are taken from numbers of the same run, and a note per model gives what
one more sample costs, in teacher passes: the difference between the largest and smallest S,
divided by their difference in S and by the teacher's number (FLOPs, batch-8 latencies).

FLOPs, counted as 2 x multiply-adds of the matrix products, per example with T tokens, hidden
size D, MLP size I (3072 = 4 D in both shapes), C_out labels, L teacher layers, K replaced
layers (here K = L), n DiT blocks (`--depth`) and S samples. LayerNorm, softmax, GELU, SiLU,
softplus, biases, the modulation's shift / scale / gate, the noise add and residual adds are
elementwise and left out:

    teacher (`prune_speed.forward_flops`):
        per layer:     4 T D^2 (Q, K, V, O) + 2 T^2 D (Q K^T, weights x V) + 2 T D I (MLP)
        embeddings:    0 for BERT (table lookups), ViT patch projection (T - 1) (C P^2) D
        classifier:    BERT pooler D^2 + D C_out, ViT D C_out (on the first token)
    student:
        embeddings:    as the teacher's
        prefix:        the L - K kept teacher layers, as the teacher's (none here)
        per sample (the S roll-outs are folded into the batch: everything below runs S times):
          per step (K of them):
            per DiT block (n of them):
              3 T D^2      qkv projection
              T D^2        output projection
              8 T D^2      MLP, ratio 4: D -> 4 D -> D
              2 T^2 D      attention: Q K^T and weights x V
              6 D^2        adaLN modulation (shift, scale, gate x 2), once per example and step
            2 T D^2        mean and std heads: one D x D linear each on every token
            256 D + D^2    timestep MLP, once per example and step (negligible, counted)
          head:            2 T D I (the teacher's last MLP, on every token: the student runs
                           it on all of them) + BERT pooler D^2 + D C_out, or ViT D C_out
                           (final norm and classifier on the first token)
        FLOPs = 2 x (embeddings + prefix + S x (K x per step + head))

A DiT block is a teacher layer (12 T D^2 + 2 T^2 D at I = 4 D) plus 6 D^2, and each step adds
the two 2 T D^2 heads; with K = L the student at S = 1 therefore does more than the teacher (its
K steps, plus the last MLP again in the head: about 1.22x at BERT-base's and ViT-B's 12 layers,
1.5x at quick mode's 2), and S samples cost S times that, more than a deep ensemble of S
teachers: DIRECTOR saves parameters (one shared block instead of L layers), not arithmetic.
With the attention terms left out, this formula gives exactly what
`torch.utils.flop_counter.FlopCounterMode` counts for both models (the counter does not count
CPU `scaled_dot_product_attention`).

`--quick` is a smoke run (about 80 s on 2 idle cores): 2 layers of the base shapes
(`num_hidden_layers` 2, so K = 2; per-step ratios are the real ones, embeddings and head weigh
more, and at 2 layers both students, the one-block transition being 0.3x (BERT) to 0.8x (ViT)
of the whole teacher, hold more parameters than their teachers), S = 1 and 5, 3 repeats after
1 warm-up. Full mode is the same code at 12 layers, S = 1, 5 and 10, 10 repeats after 2
warm-ups: a batch-8 pass of the S = 10 student is about 12 teacher batch-8 passes, so roughly
half an hour on 2 cores, extrapolated from quick mode. Timings depend on the machine and what
else runs on it; nothing here asserts on them.

    .venv/bin/python benchmarks/director_cost.py [--quick] [--markdown] [--threads 2]
        [--samples 1 5 10] [--chunks]

`--chunks` measures only the sample-chunk table: at batch 1 and 64, the student with S =
max(--samples) samples run in chunks (the automatic `sample_chunk`, uq/noise.py
AUTO_CHUNK_TOKENS) and in one pass, next to S times the latency of the same student at S = 1,
in torch (the Predictor feeds the exported graph slices of the batch the same way).
`--chunks --demo` does it for the demo-sized students instead of the base shapes: the demo's
ViT-small (4 layers, hidden 64, 8x8 digits: 17 tokens) and, for text, a BERT-small (4 layers,
hidden 256) at the sequence length of `--seq-len`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

# Run as a script, this file's folder is on sys.path: the sibling benchmarks import as modules.
from hydra_cost import interleaved_medians, ort_runner, ort_torch_gap, torch_runner
from prune_speed import (
    BATCHES,
    OPSET,
    Shape,
    Table,
    environment_line,
    forward_flops,
    num_tokens,
    ort_inputs,
    ort_session,
    print_report,
    pruning_shapes,
    stderr_logger,
)

if TYPE_CHECKING:
    from torch import nn

    from uqcompress.models.director_model import DirectorModel
    from uqcompress.models.loading import LoadedModel

SAMPLES_FULL = (1, 5, 10)
SAMPLES_QUICK = (1, 5)
TIMESTEP_FREQUENCIES = 256  # `models.director_model.TimestepEmbedder`'s sinusoidal features
DIT_MLP_RATIO = 4  # `models.director_model.DiTBlock`'s default
TEACHER, STUDENT = "teacher", "student"


@dataclass
class Config:
    """What one row runs: `graph`, exported from `loaded` to `path`; `student` is None for the
    teacher (its graph takes no noise)."""

    kind: str  # TEACHER or STUDENT
    samples: int  # S; 1 for the teacher
    params: int
    transition: int  # the student's transition parameters; 0 for the teacher
    flops: int
    graph: nn.Module
    loaded: LoadedModel
    path: Path
    student: DirectorModel | None = None


@dataclass
class CostRow:
    """One configuration of one model; latencies in seconds per batch size."""

    model: str
    kind: str
    samples: int
    params: int
    transition: int
    flops: int
    torch_latency: dict[int, float]
    ort_latency: dict[int, float]
    ort_gap: float  # max |member logits| ONNX Runtime vs torch, batch 1, same noise

    @property
    def name(self) -> str:
        return TEACHER if self.kind == TEACHER else f"{STUDENT} S={self.samples}"


# --------------------------------------------------------------------------- models


def student_config(teacher: LoadedModel, samples: int, args: argparse.Namespace) -> Config:
    """The student with `samples` roll-outs, wrapped as a `LoadedModel` the exporter takes
    (its config records the DIRECTOR spec, as `uqc distill-director` writes it)."""
    import copy

    from uqcompress.export.graph import graph_for
    from uqcompress.methods.director import build_student, parameter_counts
    from uqcompress.models.kind_base import DIRECTOR_KEY

    student = build_student(teacher, None, args.depth, samples, args.seed)
    config = copy.deepcopy(teacher.config)
    setattr(config, DIRECTOR_KEY, student.spec.to_dict())
    student.config = config
    loaded = teacher.derived(student, config)
    counts = parameter_counts(teacher.model, student)
    return Config(
        kind=STUDENT,
        samples=samples,
        params=counts["student"],
        transition=counts["transition"],
        flops=student_flops(teacher, student, num_tokens(teacher, args.seq_len)),
        graph=graph_for(student, teacher.input_kind),
        loaded=loaded,
        path=Path(),  # set by `build_configs`
        student=student,
    )


def build_configs(
    shape: Shape, args: argparse.Namespace, tmp: Path
) -> tuple[LoadedModel, list[Config]]:
    """The teacher (it also makes the inputs) and the configurations: teacher, then one
    student per S. Paths are where each graph will be exported, inside `tmp`."""
    from uqcompress.export.graph import graph_for

    log(f"{shape.name}: building the teacher")
    teacher = shape.build(args.seed)
    tokens = num_tokens(teacher, args.seq_len)
    configs = [
        Config(
            kind=TEACHER,
            samples=1,
            params=sum(p.numel() for p in teacher.model.parameters()),
            transition=0,
            flops=forward_flops(teacher, tokens),
            graph=graph_for(teacher.model, teacher.input_kind),
            loaded=teacher,
            path=tmp / "teacher.onnx",
        )
    ]
    for samples in args.samples:
        log(f"{shape.name}: building the student, S={samples}")
        config = student_config(teacher, samples, args)
        config.path = tmp / f"student-{samples}.onnx"
        configs.append(config)
    return teacher, configs


def feeds(
    teacher: LoadedModel, config: Config, batch: int, args: argparse.Namespace
) -> dict[str, np.ndarray]:
    """The exported graph's inputs for one batch: `ort_inputs`, plus standard-normal noise
    `[B, S, K, T, D]` for a student (drawn from its own seed, so every S gets its own draws)."""
    inputs = ort_inputs(teacher, batch, args.seq_len, args.seed)
    if config.student is not None:
        rng = np.random.default_rng([args.seed, config.samples, batch])
        shape = config.student.noise_shape(batch, num_tokens(teacher, args.seq_len))
        inputs["noise"] = rng.standard_normal(shape, dtype=np.float32)
    return inputs


# --------------------------------------------------------------------------- FLOPs


def student_flops(teacher: LoadedModel, student: DirectorModel, tokens: int) -> int:
    """FLOPs of one example's forward pass through the student with all its S roll-outs
    (formula in the module docstring)."""
    config = teacher.config
    hidden, inner = int(config.hidden_size), int(config.intermediate_size)
    classes, spec = len(teacher.labels), student.spec
    layers = int(config.num_hidden_layers)
    per_layer = 4 * tokens * hidden**2 + 2 * tokens**2 * hidden + 2 * tokens * hidden * inner
    macs = (layers - spec.replace_last) * per_layer  # kept prefix layers
    block = 3 * tokens * hidden**2  # qkv
    block += tokens * hidden**2  # output projection
    block += 2 * tokens * hidden * (DIT_MLP_RATIO * hidden)  # MLP
    block += 2 * tokens**2 * hidden  # Q K^T and weights x V
    block += 6 * hidden**2  # adaLN modulation, once per example
    step = spec.depth * block
    step += 2 * tokens * hidden**2  # mean and std heads
    step += TIMESTEP_FREQUENCIES * hidden + hidden**2  # timestep MLP, once per example
    head = 2 * tokens * hidden * inner  # the teacher's last MLP, on every token
    if teacher.input_kind == "text":
        head += hidden * hidden + hidden * classes  # pooler + classifier on [CLS]
    else:
        patch = int(config.num_channels) * int(config.patch_size) ** 2
        macs += (tokens - 1) * patch * hidden  # patch embedding, once per example
        head += hidden * classes  # classifier on [CLS]
    macs += spec.samples * (spec.replace_last * step + head)
    return 2 * macs


# --------------------------------------------------------------------------- one model


def time_torch(
    name: str, teacher: LoadedModel, configs: Sequence[Config], args: argparse.Namespace
) -> list[dict[int, float]]:
    """Per configuration, median torch seconds per batch size, all configurations interleaved."""
    import torch

    latency: list[dict[int, float]] = [{} for _ in configs]
    with torch.inference_mode():
        for batch in BATCHES:
            log(f"{name}: torch, batch {batch}, {len(configs)} configurations interleaved")
            runners = []
            for c in configs:
                inputs = {k: torch.from_numpy(v) for k, v in feeds(teacher, c, batch, args).items()}
                runners.append(torch_runner([c.graph], inputs))
            medians = interleaved_medians(runners, args.warmup, args.repeats)
            for per_config, seconds in zip(latency, medians, strict=True):
                per_config[batch] = seconds
            del runners  # the noise arrays go before the next batch size's
    return latency


def time_ort(
    name: str, teacher: LoadedModel, configs: Sequence[Config], args: argparse.Namespace
) -> tuple[list[dict[int, float]], list[float]]:
    """Per configuration, median ONNX Runtime seconds per batch size (all configurations
    interleaved) and the largest |member logits| difference to torch at batch 1."""
    sessions = [ort_session(c.path, args.threads) for c in configs]
    gaps = [
        ort_torch_gap(c.graph, session, feeds(teacher, c, 1, args))
        for c, session in zip(configs, sessions, strict=True)
    ]
    latency: list[dict[int, float]] = [{} for _ in configs]
    for batch in BATCHES:
        log(f"{name}: ONNX Runtime, batch {batch}, {len(configs)} configurations interleaved")
        runners = [
            ort_runner([session], feeds(teacher, c, batch, args))
            for c, session in zip(configs, sessions, strict=True)
        ]
        medians = interleaved_medians(runners, args.warmup, args.repeats)
        for per_config, seconds in zip(latency, medians, strict=True):
            per_config[batch] = seconds
        del runners
    del sessions  # release the files before the temp dir goes
    return latency, gaps


def measure_model(shape: Shape, args: argparse.Namespace) -> list[CostRow]:
    """All configurations of one shape: torch timing, export, ONNX Runtime timing, parity."""
    from uqcompress.export.onnx import export_graph

    with tempfile.TemporaryDirectory(prefix="director_cost-") as tmp:
        teacher, configs = build_configs(shape, args, Path(tmp))
        torch_latency = time_torch(shape.name, teacher, configs, args)
        for c in configs:
            log(f"{shape.name}: exporting {c.path.name}")
            export_graph(c.graph, c.loaded, c.path, OPSET)
        ort_latency, gaps = time_ort(shape.name, teacher, configs, args)
    return [
        CostRow(
            model=shape.name,
            kind=c.kind,
            samples=c.samples,
            params=c.params,
            transition=c.transition,
            flops=c.flops,
            torch_latency=t,
            ort_latency=o,
            ort_gap=gap,
        )
        for c, t, o, gap in zip(configs, torch_latency, ort_latency, gaps, strict=True)
    ]


# --------------------------------------------------------------------------- tables


def teacher_of(rows: Sequence[CostRow], row: CostRow) -> CostRow:
    return next(r for r in rows if r.model == row.model and r.kind == TEACHER)


def cost_table(rows: Sequence[CostRow], args: argparse.Namespace) -> Table:
    headers = ["model", "configuration", "params (M)", "transition (M)", "GFLOPs/example"]
    headers += [f"torch b{b} (ms)" for b in BATCHES]
    headers += [f"ORT b{b} (ms)" for b in BATCHES]
    headers.append("ORT vs torch")
    body = []
    for row in rows:
        cells = [
            row.model,
            row.name,
            f"{row.params / 1e6:.1f}",
            f"{row.transition / 1e6:.1f}" if row.kind == STUDENT else "",
            f"{row.flops / 1e9:.2f}",
        ]
        cells += [f"{row.torch_latency[b] * 1e3:.1f}" for b in BATCHES]
        cells += [f"{row.ort_latency[b] * 1e3:.1f}" for b in BATCHES]
        cells.append(f"{row.ort_gap:.1e}")
        body.append(cells)
    title = (
        f"DIRECTOR cost: torch eager and ONNX Runtime on CPU, {args.threads} threads, median of "
        f"{args.repeats} after {args.warmup} warm-up; BERT sequence {args.seq_len}, ViT 197 "
        f"tokens. Student: every layer replaced (K = L), {args.depth} DiT block(s), S samples, "
        f"noise fed as an input; last column: max abs member-logit difference, batch 1, "
        f"same noise"
    )
    return Table(title, headers, body, left=(0, 1))


def ratio_table(rows: Sequence[CostRow]) -> Table:
    headers = ["model", "configuration", "params", "transition", "FLOPs"]
    headers += [f"torch b{b}" for b in BATCHES]
    headers += [f"ORT b{b}" for b in BATCHES]
    body = []
    for row in rows:
        if row.kind == TEACHER:
            continue
        base = teacher_of(rows, row)
        values = [row.params / base.params, row.transition / base.params, row.flops / base.flops]
        values += [row.torch_latency[b] / base.torch_latency[b] for b in BATCHES]
        values += [row.ort_latency[b] / base.ort_latency[b] for b in BATCHES]
        body.append([row.model, row.name, *(f"{v:.2f}" for v in values)])
    title = (
        "Ratios to the teacher, all from this run (latency: ms / ms at the same batch size; "
        "transition: its parameters / the teacher's)"
    )
    return Table(title, headers, body, left=(0, 1))


def per_sample(high: float, low: float, extra: int, teacher: float) -> str:
    """Cost of one more sample, in teacher units: (high - low) / extra samples / teacher."""
    return f"{(high - low) / extra / teacher:.2f}"


def sample_note(rows: Sequence[CostRow]) -> str:
    """Per model: what one more sample costs, in teacher passes (module docstring)."""
    b = max(BATCHES)
    parts = []
    for model in dict.fromkeys(r.model for r in rows):
        students = [r for r in rows if r.model == model and r.kind == STUDENT]
        if len(students) < 2:
            continue
        low = min(students, key=lambda r: r.samples)
        high = max(students, key=lambda r: r.samples)
        base, extra = teacher_of(rows, low), high.samples - low.samples
        flops = per_sample(high.flops, low.flops, extra, base.flops)
        torch_b = per_sample(
            high.torch_latency[b], low.torch_latency[b], extra, base.torch_latency[b]
        )
        ort_b = per_sample(high.ort_latency[b], low.ort_latency[b], extra, base.ort_latency[b])
        parts.append(
            f"{model} (S={low.samples} -> {high.samples}): FLOPs {flops}, torch b{b} {torch_b}, "
            f"ORT b{b} {ort_b}"
        )
    if not parts:
        return "(One S only: no per-sample cost to give.)"
    return "One more sample costs, in teacher passes: " + "; ".join(parts) + "."


# --------------------------------------------------------------------------- main


# --------------------------------------------------------------------------- sample chunks

CHUNK_BATCHES = (1, 64)


def chunk_runner(
    model: DirectorModel, noise: object, chunk: int | None, inputs: dict[str, object]
) -> Callable[[], object]:
    """One forward pass of `model` with `chunk` samples per pass (None: automatic)."""

    def run() -> object:
        model.sample_chunk = chunk
        return model(noise=noise, **inputs)

    return run


def demo_shapes() -> list[Shape]:
    """The demo's image teacher (ViT-small on 8x8 digits) and a text teacher of the same
    4-layer depth (BERT-small)."""
    return [Shape("ViT-small (demo)", "vit", 10, "small"), Shape("BERT-small", "bert", 2, "small")]


def chunk_table(args: argparse.Namespace) -> Table:
    """`--chunks`: what S samples cost next to S times one sample, in torch, with the samples
    run in chunks (`DirectorModel.sample_chunk`, the automatic default) and in one pass.

    Per model (the shapes above) and batch size (1 and 64): the student at S = max(--samples)
    and the same student at S = 1 (same seed, same weights), the same explicit noise as the
    exported graph takes; medians of --repeats interleaved runs. `S x one` is S times the
    S = 1 student's latency; the ratios are S-sample latency over it."""
    import torch

    samples = max(args.samples)
    rows: list[list[str]] = []
    for shape in demo_shapes() if args.demo else pruning_shapes(args.quick):
        log(f"{shape.name}: building the teacher and the students S=1, S={samples}")
        teacher = shape.build(args.seed)
        tokens = num_tokens(teacher, args.seq_len)
        many = student_config(teacher, samples, args).student
        one = student_config(teacher, 1, args).student
        assert many is not None and one is not None
        many.eval()
        one.eval()
        with torch.inference_mode():
            for batch in CHUNK_BATCHES:
                log(f"{shape.name}: torch, batch {batch}, chunked / one pass / one sample")
                inputs = {
                    k: torch.from_numpy(v)
                    for k, v in ort_inputs(teacher, batch, args.seq_len, args.seed).items()
                }
                rng = np.random.default_rng([args.seed, batch])
                noise_many = torch.from_numpy(
                    rng.standard_normal(many.noise_shape(batch, tokens), dtype=np.float32)
                )
                noise_one = noise_many[:, :1].clone()

                many.sample_chunk = None  # the automatic chunk, as eval and predict use it
                chunk = many.chunk_samples(batch, tokens)
                single, chunked, whole = interleaved_medians(
                    [
                        chunk_runner(one, noise_one, None, inputs),
                        chunk_runner(many, noise_many, None, inputs),
                        chunk_runner(many, noise_many, samples, inputs),
                    ],
                    args.warmup,
                    args.repeats,
                )
                rows.append(
                    [
                        shape.name,
                        str(batch),
                        str(samples),
                        str(chunk),
                        f"{single * 1e3:.1f}",
                        f"{samples * single * 1e3:.1f}",
                        f"{chunked * 1e3:.1f}",
                        f"{chunked / (samples * single):.2f}",
                        f"{whole * 1e3:.1f}",
                        f"{whole / (samples * single):.2f}",
                    ]
                )
                del inputs, noise_many, noise_one
    return Table(
        title=(
            f"DIRECTOR samples in chunks: torch eager on CPU, {args.threads} threads, median of "
            f"{args.repeats} after {args.warmup} warm-up; ms per batch"
        ),
        headers=[
            "model",
            "batch",
            "S",
            "auto chunk",
            "1 sample",
            "S x 1 sample",
            "S, chunked",
            "ratio",
            "S, one pass",
            "ratio",
        ],
        rows=rows,
        left=(0,),
    )


log = stderr_logger("director_cost")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 layers, S 1 and 5")
    parser.add_argument(
        "--demo", action="store_true", help="--chunks: the demo-sized students, not base shapes"
    )
    parser.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch threads and ONNX Runtime intra-op threads (default: os.cpu_count())",
    )
    parser.add_argument("--repeats", type=int, help="timed runs per latency (default 10, quick 3)")
    parser.add_argument("--warmup", type=int, help="untimed runs first (default 2, quick 1)")
    parser.add_argument(
        "--samples", type=int, nargs="+", help="student samples S (default 1 5 10, quick 1 5)"
    )
    parser.add_argument("--depth", type=int, default=1, help="DiT blocks per step (default 1)")
    parser.add_argument("--seq-len", type=int, default=128, help="BERT tokens (default 128)")
    parser.add_argument("--seed", type=int, default=0, help="weights and inputs (default 0)")
    parser.add_argument(
        "--chunks",
        action="store_true",
        help="only the sample-chunk table: S samples (chunked, one pass) vs S x one sample",
    )
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 3 if args.quick else 10
    if args.warmup is None:
        args.warmup = 1 if args.quick else 2
    if args.samples is None:
        args.samples = list(SAMPLES_QUICK if args.quick else SAMPLES_FULL)
    if min(args.samples) < 1 or args.depth < 1 or args.repeats < 1:
        parser.error("--samples, --depth and --repeats must be at least 1")
    args.samples = sorted(set(args.samples))
    return args


def setup_line(args: argparse.Namespace, seconds: float) -> str:
    mode = "quick (2 layers of the base shapes)" if args.quick else "full"
    return environment_line(mode, seconds)


def main() -> None:
    args = parse_args()

    import torch

    from uqcompress.models.loading import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    if args.chunks:
        table = chunk_table(args)
        print_report(setup_line(args, time.perf_counter() - start), [table], args.markdown)
        return
    rows = [row for shape in pruning_shapes(args.quick) for row in measure_model(shape, args)]
    tables = [cost_table(rows, args), ratio_table(rows)]
    note = sample_note(rows)
    setup = setup_line(args, time.perf_counter() - start)
    print_report(setup, tables, args.markdown, note)


if __name__ == "__main__":
    main()
