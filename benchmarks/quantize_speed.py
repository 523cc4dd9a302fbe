"""What does `uqc quantize` buy on CPU? fp32 vs int8 (dynamic, static QDQ) vs fp16, one run.

For a BERT-base-shaped classifier (2 labels, sequence 128, bert-base-uncased's 30522-token
vocabulary) and a ViT-B/16-shaped one (10 labels, 3x224x224, 197 tokens), all random, three
models per shape:

- single: one dense model, seed `--seed`;
- pruned 50%: the same shape with half of each layer's heads removed (seeded random scores,
  as `prune_speed.py`);
- Hydra M=3: `methods.hydra.fuse` of 3 members partition-pruned from the single model (member
  m keeps heads h with h % 3 == m), as `hydra_cost.py`;

each exported at opset 18 with the uncertainty outputs in the graph (`export.graph.graph_for`)
and then quantized by `export.quantize.quantize_graph`, exactly as `uqc quantize` does:
dynamic int8, static int8 QDQ (MinMax ranges calibrated on `--calib` synthetic examples) and
fp16 (float16 weights and compute, float32 inputs/outputs; for GPU execution providers: on
the CPU it is here for the record). The fp32 deep ensemble of 3 (the single model's session
run 3 times) is timed too, since the Hydra int8 floor is stated against it.

Per variant: ONNX Runtime CPU latency (median of one batch, `--threads` intra-op threads, batch
1 and 8), with every variant of a shape taking turns of 5 timed runs (each turn after one
untimed run), so load spikes hit them alike; the ONNX file size; and the largest |probs|
difference to the fp32 export of the same model on a batch-8 input (random weights give
near-uniform probabilities, so this is a weak check of accuracy; the drift gate of
`uqc quantize` on real data is the real one). Ratios are to the fp32 export of the same model,
from numbers of this run.

`--quick` is a smoke run: 2 layers of the base shapes, 3 repeats after 1 warm-up, 8
calibration examples. Timings depend on the machine and what else runs on it; nothing here
asserts on them.

    .venv/bin/python benchmarks/quantize_speed.py [--quick] [--markdown] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

# Run as a script, this file's folder is on sys.path: the sibling benchmarks import as modules.
from hydra_cost import build_hydra, interleaved_medians, ort_runner, torch_inputs
from prune_speed import (
    BATCHES,
    OPSET,
    Shape,
    Table,
    environment_line,
    ort_inputs,
    ort_session,
    print_report,
    prune_copy,
    pruning_shapes,
    stderr_logger,
)

if TYPE_CHECKING:
    from uqcompress.models.loading import LoadedModel

MODES = ("fp32", "dynamic", "static", "fp16")
HYDRA_MEMBERS = 3
ENSEMBLE = "deep ensemble M=3 (fp32)"
log = stderr_logger("quantize_speed")


@dataclass
class Row:
    model: str  # the shape
    config: str  # single, pruned 50%, Hydra M=3, deep ensemble
    mode: str
    bytes: int
    latency: dict[int, float] = field(default_factory=dict)
    probs_gap: float = 0.0  # max |probs - fp32 probs|, batch 8


def calibration_batches(
    loaded: LoadedModel, count: int, seq_len: int, seed: int
) -> list[dict[str, np.ndarray]]:
    """`count` synthetic examples in batches of 8 (what `ort_inputs` makes)."""
    return [
        ort_inputs(loaded, min(8, count - start), seq_len, seed + 1 + start)
        for start in range(0, count, 8)
    ]


def measure_shape(shape: Shape, args: argparse.Namespace) -> list[Row]:
    from uqcompress.export.graph import graph_for
    from uqcompress.export.onnx import export_graph
    from uqcompress.export.quantize import quantize_graph

    rows: list[Row] = []
    sessions: list[list[Any]] = []
    with tempfile.TemporaryDirectory(prefix="quantize_speed-") as tmp:
        root = Path(tmp)
        log(f"{shape.name}: building single, pruned 50% and Hydra M={HYDRA_MEMBERS}")
        dense = shape.build(args.seed)
        check = torch_inputs(dense, 1, args.seq_len, args.seed)
        hydra, _ = build_hydra(dense, HYDRA_MEMBERS, check)
        models = [
            ("single", dense),
            ("pruned 50%", prune_copy(shape, 0.5, args.seed)),
            (f"Hydra M={HYDRA_MEMBERS}", hydra),
        ]
        calibration = calibration_batches(dense, args.calib, args.seq_len, args.seed)
        probe = ort_inputs(dense, 8, args.seq_len, args.seed)
        for index, (config, loaded) in enumerate(models):
            fp32 = root / f"m{index}-fp32.onnx"
            log(f"{shape.name}: exporting {config}")
            export_graph(graph_for(loaded.model, loaded.input_kind), loaded, fp32, OPSET)
            reference = None
            for mode in MODES:
                path = fp32 if mode == "fp32" else root / f"m{index}-{mode}.onnx"
                if mode != "fp32":
                    log(f"{shape.name}: {config}: quantizing ({mode})")
                    quantize_graph(
                        fp32,
                        path,
                        mode,
                        calibration=calibration if mode == "static" else None,
                        work_dir=root,
                    )
                session = ort_session(path, args.threads)
                probs = session.run(["probs"], probe)[0]
                if reference is None:
                    reference = probs
                rows.append(
                    Row(
                        shape.name,
                        config,
                        mode,
                        path.stat().st_size,
                        probs_gap=float(np.max(np.abs(probs - reference))),
                    )
                )
                sessions.append([session])
            if config == "single":  # the fp32 deep ensemble: the dense session run M times
                rows.append(Row(shape.name, ENSEMBLE, "fp32", HYDRA_MEMBERS * fp32.stat().st_size))
                sessions.append([sessions[0][0]] * HYDRA_MEMBERS)
        for batch in BATCHES:
            log(f"{shape.name}: ONNX Runtime, batch {batch}, {len(rows)} variants interleaved")
            inputs = ort_inputs(dense, batch, args.seq_len, args.seed)
            runners = [ort_runner(s, inputs) for s in sessions]
            for row, seconds in zip(
                rows, interleaved_medians(runners, args.warmup, args.repeats), strict=True
            ):
                row.latency[batch] = seconds
    return rows


def fp32_of(rows: Sequence[Row], row: Row) -> Row:
    return next(
        r for r in rows if r.model == row.model and r.config == row.config and r.mode == "fp32"
    )


def speed_table(rows: Sequence[Row], args: argparse.Namespace) -> Table:
    headers = ["model", "configuration", "mode", "file (MB)", "x"]
    for batch in BATCHES:
        headers += [f"ORT b{batch} (ms)", "x"]
    headers.append("max abs dprobs")
    body = []
    for row in rows:
        base = fp32_of(rows, row)
        cells = [
            row.model,
            row.config,
            row.mode,
            f"{row.bytes / 1e6:.1f}",
            f"{row.bytes / base.bytes:.2f}",
        ]
        for batch in BATCHES:
            cells += [
                f"{row.latency[batch] * 1e3:.1f}",
                f"{row.latency[batch] / base.latency[batch]:.2f}",
            ]
        cells.append("" if row.config == ENSEMBLE else f"{row.probs_gap:.1e}")
        body.append(cells)
    title = (
        f"uqc quantize: ONNX Runtime CPU, {args.threads} threads, median of {args.repeats} after "
        f"{args.warmup} warm-up; BERT sequence {args.seq_len}, ViT 197 tokens; static int8 "
        f"calibrated on {args.calib} synthetic examples; x = / the fp32 export of the same "
        "model; max abs dprobs vs that fp32 export, batch 8"
    )
    return Table(title, headers, body, left=(0, 1, 2))


def floors_note(rows: Sequence[Row]) -> str:
    """The issue's floors, measured: dynamic int8 BERT-base latency and size, Hydra int8 vs
    the fp32 deep ensemble, and static vs dynamic."""

    def find(model: str, config: str, mode: str) -> Row | None:
        return next(
            (r for r in rows if r.model == model and r.config == config and r.mode == mode), None
        )

    b = max(BATCHES)
    parts = []
    bert = [r.model for r in rows if r.model.startswith("BERT")]
    if bert:
        single, dynamic = find(bert[0], "single", "fp32"), find(bert[0], "single", "dynamic")
        if single and dynamic:
            parts.append(
                f"{bert[0]} dynamic int8: {dynamic.latency[b] / single.latency[b]:.2f}x fp32 "
                f"latency at batch {b} (floor 0.65x), {dynamic.bytes / single.bytes:.2f}x the "
                "file size (floor 0.30x)"
            )
    for model in dict.fromkeys(r.model for r in rows):
        hydra = find(model, f"Hydra M={HYDRA_MEMBERS}", "dynamic")
        static = find(model, f"Hydra M={HYDRA_MEMBERS}", "static")
        ensemble = find(model, ENSEMBLE, "fp32")
        if hydra and ensemble:
            parts.append(
                f"{model} Hydra M={HYDRA_MEMBERS} dynamic int8: "
                f"{hydra.latency[b] / ensemble.latency[b]:.2f}x the fp32 deep ensemble's latency "
                f"at batch {b} (floor 0.55x)"
                + (
                    f", static int8 {static.latency[b] / ensemble.latency[b]:.2f}x"
                    if static
                    else ""
                )
            )
        single_static, single_dynamic = (
            find(model, "single", "static"),
            find(model, "single", "dynamic"),
        )
        if single_static and single_dynamic:
            ratio = single_static.latency[b] / single_dynamic.latency[b]
            verdict = "slower" if ratio > 1 else "faster"
            parts.append(
                f"{model} single: static int8 is {verdict} than dynamic at batch {b} "
                f"({single_static.latency[b] * 1e3:.1f} vs "
                f"{single_dynamic.latency[b] * 1e3:.1f} ms)"
            )
    return "Floors: " + "; ".join(parts) + "."


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 layers, 3 repeats")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="ONNX Runtime intra-op threads and torch threads (default: os.cpu_count())",
    )
    parser.add_argument("--repeats", type=int, help="timed runs per latency (default 10, quick 3)")
    parser.add_argument("--warmup", type=int, help="untimed runs first (default 2, quick 1)")
    parser.add_argument("--calib", type=int, help="static calibration examples (64, quick 8)")
    parser.add_argument("--seq-len", type=int, default=128, help="BERT tokens (default 128)")
    parser.add_argument("--seed", type=int, default=0, help="weights and inputs (default 0)")
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 3 if args.quick else 10
    if args.warmup is None:
        args.warmup = 1 if args.quick else 2
    if args.calib is None:
        args.calib = 8 if args.quick else 64
    return args


def main() -> None:
    args = parse_args()
    import torch

    from uqcompress.models.loading import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    rows = [row for shape in pruning_shapes(args.quick) for row in measure_shape(shape, args)]
    mode = "quick (2 layers of the base shapes)" if args.quick else "full"
    setup = environment_line(mode, time.perf_counter() - start)
    print_report(setup, [speed_table(rows, args)], args.markdown, floors_note(rows))


if __name__ == "__main__":
    main()
