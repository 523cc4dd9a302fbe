"""`uqc finetune`: train a model on labelled data."""

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


def finetune(
    model: Annotated[str, typer.Argument(help="Model artifact or transformers dir ('-': stdin).")],
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
    epochs: Annotated[int, typer.Option("--epochs", help="Passes over the data.")] = 3,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.")] = 5e-4,
    weight_decay: WeightDecay = 0.01,
    batch_size: BatchSize = 32,
    seed: Seed = 0,
    max_length: MaxLength = None,
    text_column: TextColumn = "text",
    label_column: LabelColumn = "label",
    text_pair_column: TextPairColumn = None,
    precision: Annotated[
        str,
        typer.Option(
            "--precision", help="fp32, or bf16 mixed precision (for GPUs; through accelerate)."
        ),
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
    """Fine-tune a classifier (--optimizer, warm-up then --schedule) and write a new model artifact;
    with --val, the best epoch's weights (--select-best) and a history of every epoch."""
    from uqcompress.cli.invoke import run_step

    options = {
        "model": resolve_input(model),
        "data": data,
        "val": val,
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
    run_step("finetune", options, force, json_out, out)
