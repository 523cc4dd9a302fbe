"""`uqc quantize`: int8 or float16 ONNX that keeps its uncertainty, behind a drift gate."""

from __future__ import annotations

from typing import Annotated

import typer

from uqcompress.cli.options import (
    BatchSize,
    Device,
    Force,
    Json,
    LabelColumn,
    Out,
    TextColumn,
    TextPairColumn,
    Threads,
    resolve_input,
)


def quantize(
    model: Annotated[str, typer.Argument(help="ONNX artifact written by uqc export ('-': stdin).")],
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            help="dynamic (int8 weights, activations quantized at run time), static (int8 "
            "QDQ, activation ranges calibrated on --data) or fp16 (float16 weights and "
            "compute, float32 inputs/outputs; for GPU execution providers).",
        ),
    ] = "dynamic",
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            help="Examples for the drift gate (labelled, for the ECE and NLL deltas) and, "
            "with --mode static, for calibration: builtin:NAME\\[@split], FILE.csv, a "
            "folder or hf:NAME\\[/CONFIG]@SPLIT.",
            show_default=False,
        ),
    ] = None,
    gate_data: Annotated[
        str | None,
        typer.Option(
            "--gate-data",
            help="Separate examples for the drift gate: then the gate runs on all of them and "
            "--data only calibrates (--mode static: a seeded sample of --calib-size rows).",
            show_default=False,
        ),
    ] = None,
    ood: Annotated[
        list[str] | None,
        typer.Option(
            "--ood",
            help="Out-of-distribution data (repeatable; labels not needed): the gate also "
            "bounds the drop of OOD AUROC (msp, entropy, and mi for ensembles).",
            show_default=False,
        ),
    ] = None,
    per_channel: Annotated[
        bool | None,
        typer.Option(
            "--per-channel/--per-tensor",
            help="int8: one scale per output channel, or one per weight tensor. Neither: per "
            "channel first (on a real MiniLM it passed the gate where per tensor failed), per "
            "tensor if that fails the gate (on small models it drifts less).",
            show_default=False,
        ),
    ] = None,
    exclude: Annotated[
        str | None,
        typer.Option(
            "--exclude",
            help="Regular expression over ONNX node names to keep in float32 (the "
            "uncertainty tail always is).",
            show_default=False,
        ),
    ] = None,
    calib_size: Annotated[
        int,
        typer.Option(
            "--calib-size",
            help="--mode static: calibration examples, a seeded random sample of at most "
            "half of --data (the other rows gate); 1 to 4096.",
        ),
    ] = 128,
    seed: Annotated[
        int, typer.Option("--seed", help="--mode static: which rows of --data calibrate.")
    ] = 0,
    calib_method: Annotated[
        str,
        typer.Option(
            "--calib-method", help="--mode static: minmax, entropy or percentile (ONNX Runtime)."
        ),
    ] = "minmax",
    min_agreement: Annotated[
        float,
        typer.Option("--min-agreement", help="Gate: smallest fraction of argmax predictions kept."),
    ] = 0.99,
    max_ece_delta: Annotated[
        float, typer.Option("--max-ece-delta", help="Gate: largest |ECE change| (15 bins).")
    ] = 0.01,
    max_nll_delta: Annotated[
        float, typer.Option("--max-nll-delta", help="Gate: largest |NLL change| (nats).")
    ] = 0.02,
    max_auroc_drop: Annotated[
        float | None,
        typer.Option(
            "--max-auroc-drop",
            help="Gate, with --ood only: largest drop of OOD AUROC \\[default: 0.01].",
            show_default=False,
        ),
    ] = None,
    max_coverage_delta: Annotated[
        float,
        typer.Option(
            "--max-coverage-delta",
            help="Gate, calibrated models with an abstention rule: largest |coverage change| "
            "at the stored threshold.",
        ),
    ] = 0.02,
    max_entropy_shift: Annotated[
        float,
        typer.Option(
            "--max-entropy-shift",
            help="Gate: largest |change of the mean predictive entropy| over the gate rows, "
            "relative to the float32 export's (plus 0.01 nats).",
        ),
    ] = 0.1,
    max_mi_shift: Annotated[
        float,
        typer.Option(
            "--max-mi-shift",
            help="Gate: largest |change of the mean mutual information| (ensembles), relative "
            "to the float32 export's (plus 0.01 nats).",
        ),
    ] = 0.1,
    batch_size: BatchSize = 64,
    text_column: TextColumn = "text",
    label_column: LabelColumn = "label",
    text_pair_column: TextPairColumn = None,
    device: Device = "cpu",
    threads: Threads = None,
    out: Out = None,
    force: Force = False,
    json_out: Json = False,
) -> None:
    """Quantize an ONNX export; written only if it stays within the drift gate against the
    float32 export (exit 3 and nothing written otherwise)."""
    from uqcompress.cli.invoke import run_step

    options = {
        "model": resolve_input(model),
        "mode": mode,
        "data": data,
        "gate_data": gate_data,
        "ood": ood,
        "per_channel": per_channel,
        "exclude": exclude,
        "calib_size": calib_size,
        "seed": seed,
        "calib_method": calib_method,
        "min_agreement": min_agreement,
        "max_ece_delta": max_ece_delta,
        "max_nll_delta": max_nll_delta,
        "max_auroc_drop": max_auroc_drop,
        "max_coverage_delta": max_coverage_delta,
        "max_entropy_shift": max_entropy_shift,
        "max_mi_shift": max_mi_shift,
        "batch_size": batch_size,
        "text_column": text_column,
        "label_column": label_column,
        "text_pair_column": text_pair_column,
        "device": device,
        "threads": threads,
    }
    run_step("quantize", options, force, json_out, out)
