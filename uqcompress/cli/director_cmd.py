"""`uqc distill-director`: a sampling DiT transition distilled from a classifier's blocks."""

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


def distill_director(
    model: Annotated[
        str, typer.Argument(help="The teacher: a fine-tuned model artifact or transformers dir.")
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
            "--val", help="Validation data (accuracy, ECE per epoch).", show_default=False
        ),
    ] = None,
    depth: Annotated[int, typer.Option("--depth", help="DiT blocks in the shared transition.")] = 1,
    samples: Annotated[
        int, typer.Option("--samples", help="Roll-outs S averaged at inference (stored).")
    ] = 10,
    replace_last: Annotated[
        int | None,
        typer.Option(
            "--replace-last",
            help="Replace only the last K blocks (the first L-K stay); default: all.",
            show_default=False,
        ),
    ] = None,
    loss: Annotated[
        str,
        typer.Option(
            "--loss",
            help="Per-step distillation: kl (Gaussian KL; the NLL of the teacher's state when "
            "the teacher is deterministic), nll, or mse (the research code's).",
        ),
    ] = "kl",
    lambda_mean: Annotated[float, typer.Option("--lambda-mean", help="Weight of L1.")] = 1.0,
    lambda_std: Annotated[
        float | None,
        typer.Option(
            "--lambda-std",
            help="Weight of the std term; only with --loss mse (default there: 0.1).",
            show_default=False,
        ),
    ] = None,
    lambda_ce: Annotated[
        float, typer.Option("--lambda-ce", help="Weight of the sampled roll-out's CE (L2).")
    ] = 1.0,
    freeze_head: Annotated[
        bool,
        typer.Option("--freeze-head", help="Keep the teacher's last MLP, norm and classifier."),
    ] = False,
    epochs: Annotated[int, typer.Option("--epochs", help="Passes over the data.")] = 10,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.")] = 1e-3,
    weight_decay: WeightDecay = 0.01,
    batch_size: BatchSize = 32,
    seed: Seed = 0,
    max_length: MaxLength = None,
    text_column: TextColumn = "text",
    label_column: LabelColumn = "label",
    text_pair_column: TextPairColumn = None,
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
    """Distil the teacher's blocks into one time-conditioned DiT transition that samples:
    S roll-outs per input, averaged, for calibrated uncertainty."""
    from uqcompress.cli.invoke import run_step

    options = {
        "model": resolve_input(model),
        "data": data,
        "val": val,
        "depth": depth,
        "samples": samples,
        "replace_last": replace_last,
        "loss": loss,
        "lambda_mean": lambda_mean,
        "lambda_std": lambda_std,
        "lambda_ce": lambda_ce,
        "freeze_head": freeze_head,
        "epochs": epochs,
        "lr": lr,
        "weight_decay": weight_decay,
        "batch_size": batch_size,
        "seed": seed,
        "max_length": max_length,
        "text_column": text_column,
        "label_column": label_column,
        "text_pair_column": text_pair_column,
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
    run_step("distill-director", options, force, json_out, out)
