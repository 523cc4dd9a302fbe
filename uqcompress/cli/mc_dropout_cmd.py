"""`uqc mc-dropout`: MC Dropout, S dropout samples of one classifier averaged at inference."""

from __future__ import annotations

from typing import Annotated

import typer

from uqcompress.cli.options import Device, Force, Json, Out, Threads, resolve_input


def mc_dropout(
    model: Annotated[
        str, typer.Argument(help="A fine-tuned model artifact or transformers dir ('-': stdin).")
    ],
    samples: Annotated[
        int, typer.Option("--samples", help="Dropout samples S averaged per input (members).")
    ] = 10,
    rate: Annotated[
        float | None,
        typer.Option(
            "--rate",
            help="Drop probability p in [0, 1) at every site. Default: the model's own "
            "hidden_dropout_prob (0.1 for BERT).",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the per-example dropout masks.")] = 0,
    device: Device = "cpu",
    threads: Threads = None,
    out: Out = None,
    force: Force = False,
    json_out: Json = False,
) -> None:
    """Make an MC Dropout model: the classifier's weights, run S times with dropout kept on
    at inference (embeddings, attention and MLP outputs, BERT's classifier input; attention
    probabilities not), the S softmaxes averaged. Each example's masks come from the seed and
    its content, so its prediction does not depend on its batch; eval treats the samples as
    members, and export takes the draws as the graph input `noise` (bert and vit families).
    """
    from uqcompress.cli.invoke import run_step

    options = {
        "model": resolve_input(model),
        "samples": samples,
        "rate": rate,
        "seed": seed,
        "device": device,
        "threads": threads,
    }
    run_step("mc-dropout", options, force, json_out, out)
