"""`uqc svd-ensemble`: Singular Value Ensembles (shared singular vectors, per-member values)."""

from __future__ import annotations

from typing import Annotated

import typer

from uqcompress.cli.options import (
    Augment,
    BatchSize,
    CheckpointEvery,
    Device,
    Ema,
    EmaEvery,
    EmaStart,
    Force,
    GradAccum,
    Json,
    LabelColumn,
    MaxLength,
    MaxSteps,
    Optimizer,
    Out,
    Patience,
    Resume,
    Schedule,
    Seed,
    SelectBest,
    TextColumn,
    TextPairColumn,
    Threads,
    Warmup,
    WeightDecay,
    Workers,
    resolve_input,
)


def svd_ensemble(
    model: Annotated[
        str,
        typer.Argument(
            help="A fine-tuned model artifact or transformers dir, or a pretrained backbone "
            "with --heads fresh ('-': stdin)."
        ),
    ],
    data: Annotated[
        str,
        typer.Option(
            "--data",
            help="Training data: builtin:NAME\\[@split], FILE.csv, a "
            "folder or hf:NAME\\[/CONFIG]@SPLIT.",
        ),
    ],
    val: Annotated[
        str | None,
        typer.Option(
            "--val", help="Validation data, scored after every epoch.", show_default=False
        ),
    ] = None,
    members: Annotated[int, typer.Option("--members", help="Ensemble members M.")] = 4,
    sigma_init: Annotated[
        float,
        typer.Option(
            "--sigma-init", help="Relative noise on each member's initial singular values."
        ),
    ] = 0.01,
    targets: Annotated[
        str,
        typer.Option(
            "--targets",
            help="Linears to decompose: default (attention Q/K/V/O and both MLP "
            "projections), attention, or comma-separated regular expressions over module names.",
        ),
    ] = "default",
    rank: Annotated[
        str, typer.Option("--rank", help="full, or N: keep the top N singular directions.")
    ] = "full",
    heads: Annotated[
        str,
        typer.Option(
            "--heads",
            help="The members' classifier heads: copy (each a copy of the model's trained "
            "head: SVE post hoc on a fine-tuned classifier), fresh (each member its own "
            "randomly initialised head for the data's classes, the model's head and labels "
            "discarded: SVE as fine-tuning from a pretrained backbone), or auto (fresh for a "
            "model without a trained head, else copy).",
        ),
    ] = "auto",
    extra_biases: Annotated[
        bool,
        typer.Option(
            "--extra-biases",
            help="Give every target layer per-member biases, also layers without a bias "
            "(Llama/Qwen projections); counted apart from the paper's overhead. Default: "
            "the paper's SVE, members' biases only where the model has biases.",
        ),
    ] = False,
    epochs: Annotated[int, typer.Option("--epochs", help="Passes over the data.")] = 3,
    lr: Annotated[
        float, typer.Option("--lr", help="Peak learning rate (singular values, biases, heads).")
    ] = 1e-3,
    weight_decay: WeightDecay = 0.01,
    batch_size: BatchSize = 32,
    seed: Seed = 0,
    max_length: MaxLength = None,
    text_column: TextColumn = "text",
    label_column: LabelColumn = "label",
    text_pair_column: TextPairColumn = None,
    precision: Annotated[
        str, typer.Option("--precision", help="fp32, or bf16 mixed precision (GPUs).")
    ] = "fp32",
    select_best: SelectBest = None,
    patience: Patience = None,
    grad_accum: GradAccum = 1,
    max_steps: MaxSteps = None,
    schedule: Schedule = "linear",
    warmup: Warmup = 0.1,
    optimizer: Optimizer = "adamw",
    ema: Ema = None,
    ema_every: EmaEvery = 1,
    ema_start: EmaStart = 0,
    checkpoint_every: CheckpointEvery = None,
    resume: Resume = False,
    augment: Augment = "none",
    workers: Workers = 0,
    device: Device = "auto",
    threads: Threads = None,
    out: Out = None,
    force: Force = False,
    json_out: Json = False,
) -> None:
    """Build and train a Singular Value Ensemble: each target W = U S V^T keeps U, V frozen;
    every member learns its own singular values, biases and head (mean of member
    cross-entropies, every member sees every batch). Post hoc on a fine-tuned classifier
    (members start from its head), or as fine-tuning from a pretrained backbone (--heads
    fresh: new, differently initialised heads)."""
    from uqcompress.cli.invoke import run_step

    options = {
        "model": resolve_input(model),
        "data": data,
        "val": val,
        "members": members,
        "sigma_init": sigma_init,
        "targets": targets,
        "rank": rank,
        "heads": heads,
        "extra_biases": extra_biases,
        "epochs": epochs,
        "lr": lr,
        "weight_decay": weight_decay,
        "batch_size": batch_size,
        "seed": seed,
        "max_length": max_length,
        "text_column": text_column,
        "label_column": label_column,
        "text_pair_column": text_pair_column,
        "precision": precision,
        "select_best": select_best,
        "patience": patience,
        "grad_accum": grad_accum,
        "max_steps": max_steps,
        "schedule": schedule,
        "warmup": warmup,
        "optimizer": optimizer,
        "ema": ema,
        "ema_every": ema_every,
        "ema_start": ema_start,
        "checkpoint_every": checkpoint_every,
        "resume": resume,
        "augment": augment,
        "workers": workers,
        "device": device,
        "threads": threads,
    }
    run_step("svd-ensemble", options, force, json_out, out)
