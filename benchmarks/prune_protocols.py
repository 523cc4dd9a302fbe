"""The papers' pruning protocols side by side on the demo's data, with HIES's stability measure.

One ViT is trained on builtin:digits exactly as the demo trains its first one (ViT-small, 60
epochs, lr 2e-3, batch 64, seed 0, the last epoch kept; `--quick`: the tiny preset, 2 epochs).
From it, each configuration below prunes `--ratio` of the heads once per calibration seed
(`uqc score --seed s`, s = 0..`--seeds`-1: a different seeded calibration subset, or for
headmap a different seeded 256-example pool), without fine-tuning after pruning (HIES's
protocol), and evaluates the pruned model on digits@test with builtin:photo-patches as OOD:

    hies a=A global  HIES, alpha A, the lowest scores across all layers go (the paper's
                     selection, uqc prune's default), every layer keeps at least one head
    hies a=0.5 layer HIES, alpha 0.5, the same share of every layer
    taylor global / taylor layer   Michel et al.'s Taylor importance, either selection
    headmap          HeadMap's layer-conditioned locating (Hydra-Circ's search): per layer
                     k = H - round(ratio * H) heads, 32 lowest-loss examples of a pool of 256
    greedy-circuit   uqc's own greedy forward search (objective -NLL), k heads per layer

Per configuration: the search's cost (`evaluations`: loss evaluations of the calibration set
for the searches, 1 backward pass per batch for the gradient scores; seconds: the score step's
own timer, mean over seeds), and over the seeds the mean of test accuracy, NLL, ECE and OOD
AUROC (predictive entropy), and the **stability**: the standard deviation (population, over
seeds) of the pruned model's test accuracy, in points, the spread HIES reports as stability
across calibration sets (lower is more stable; the paper's own table gives a percentage whose
definition its text omits, so this is our reading).

    .venv/bin/python benchmarks/prune_protocols.py [--quick] [--seeds 3] [--ratio 0.5]
        [--alphas 0.1,0.3,0.5,0.7,0.9] [--only hies,headmap] [--base MODEL] [--out DIR]
        [--markdown] [--json FILE]

`--base MODEL` prunes an existing model artifact instead (e.g. the demo's
artifacts/demo/model-seed0). Artifacts go to `--out` (default
artifacts/prune-protocols[-quick]); a rerun reuses them (same ids), so only new
configurations cost time. Use `--threads 1` on a busy machine. Timings depend on the
machine and what else runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRAIN = "builtin:digits@train"
VAL = "builtin:digits@val"
TEST = "builtin:digits@test"
OOD = "builtin:photo-patches"
DIGITS = [str(d) for d in range(10)]
OOD_AUROC = "ood.photo-patches.entropy.auroc"


@dataclass(frozen=True)
class Protocol:
    """One way to choose the heads: a score method and its options, then a prune scope."""

    label: str
    method: str
    scope: str | None = None  # None: a searched circuit, kept as searched
    alpha: float = 0.5
    extra: dict[str, Any] = field(default_factory=dict)


def protocols(alphas: Sequence[float]) -> list[Protocol]:
    rows = [Protocol(f"hies a={a:g} global", "hies", "global", alpha=a) for a in alphas]
    rows += [
        Protocol("hies a=0.5 layer", "hies", "layer", alpha=0.5),
        Protocol("taylor global", "taylor", "global"),
        Protocol("taylor layer", "taylor", "layer"),
        Protocol("headmap", "headmap", extra={"calib_pool": 256}),
        Protocol("greedy-circuit", "greedy-circuit"),
    ]
    return rows


def base_model(out: Path, quick: bool, threads: int) -> Path:
    """The demo's first ViT (the same configs, so the same artifact ids as the demo's)."""
    from uqcompress.steps import finetune as finetune_step
    from uqcompress.steps import init as init_step
    from uqcompress.steps.registry import step

    preset, epochs = ("tiny", 2) if quick else ("small", 60)
    init = step("init").run(
        {},
        init_step.InitConfig(family="vit", preset=preset, labels=DIGITS, seed=0),
        out / "model-init-seed0",
        False,
    )
    tuned = step("finetune").run(
        {"model": init.artifact.path},
        finetune_step.FinetuneConfig(
            data=TRAIN,
            val=VAL,
            epochs=epochs,
            lr=2e-3,
            batch_size=64,
            select_best="none",
            seed=0,
            threads=threads,
        ),
        out / "model-seed0",
        False,
    )
    return tuned.artifact.path


def evaluate(model: Path, out: Path, threads: int) -> dict[str, Any]:
    from uqcompress.steps import eval as eval_step
    from uqcompress.steps.registry import step

    cfg = eval_step.EvalConfig(data=TEST, ood=[OOD], threads=threads)
    result = step("eval").run({"models": [model]}, cfg, out, False)
    return dict(result.artifact.manifest.summary)


def run_protocol(
    base: Path, protocol: Protocol, seed: int, ratio: float, calib: int, out: Path, threads: int
) -> dict[str, Any]:
    """score -> prune -> eval for one protocol and calibration seed; the numbers of one run."""
    from uqcompress.methods.scoring import registry as scorers
    from uqcompress.steps import prune as prune_step
    from uqcompress.steps import score as score_step
    from uqcompress.steps.registry import step

    searched = scorers.is_searched(protocol.method)
    name = protocol.label.replace(" ", "-").replace("=", "")
    cfg = score_step.ScoreConfig(
        method=protocol.method,
        data=TRAIN,
        calib_size=calib,
        alpha=protocol.alpha,
        ratio=ratio if searched else None,
        seed=seed,
        threads=threads,
        **protocol.extra,
    )
    scores = step("score").run({"model": base}, cfg, out / f"scores-{name}-seed{seed}", False)
    pruned = step("prune").run(
        {"input": scores.artifact.path},
        prune_step.PruneConfig(ratio=ratio, scope=protocol.scope, threads=threads),
        out / f"pruned-{name}-seed{seed}",
        False,
    )
    metrics = evaluate(pruned.artifact.path, out / f"eval-{name}-seed{seed}", threads)
    summary = scores.artifact.manifest.summary
    return {
        "seed": seed,
        "seconds": float(summary["seconds"]),
        "evaluations": summary.get("evaluations"),
        "heads_per_layer": pruned.artifact.manifest.summary["heads_per_layer"],
        "acc": float(metrics["acc"]),
        "nll": float(metrics["nll"]),
        "ece": float(metrics["ece"]),
        "auroc": float(metrics[OOD_AUROC]),
    }


def aggregate(label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over seeds, and the stability: the population std of accuracy, in points."""

    def mean(key: str) -> float:
        return statistics.fmean(float(r[key]) for r in runs)

    accs = [float(r["acc"]) for r in runs]
    return {
        "protocol": label,
        "seeds": len(runs),
        "evaluations": runs[0]["evaluations"],
        "seconds": mean("seconds"),
        "acc": mean("acc"),
        "acc_std_points": 100 * statistics.pstdev(accs),
        "acc_min": min(accs),
        "acc_max": max(accs),
        "nll": mean("nll"),
        "ece": mean("ece"),
        "auroc": mean("auroc"),
        "heads_per_layer": [r["heads_per_layer"] for r in runs],
    }


def table(rows: list[dict[str, Any]], unpruned: dict[str, Any]) -> str:
    head = (
        "| protocol | evaluations | score s | acc (mean) | acc std (pts) | acc min..max | NLL "
        "| ECE | OOD AUROC |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| unpruned | - | - | {unpruned['acc']:.3f} | - | - | {unpruned['nll']:.3f} "
        f"| {unpruned['ece']:.3f} | {unpruned[OOD_AUROC]:.3f} |"
    ]
    for r in rows:
        evals = "grad" if r["evaluations"] is None else str(r["evaluations"])
        lines.append(
            f"| {r['protocol']} | {evals} | {r['seconds']:.2f} | {r['acc']:.3f} | "
            f"{r['acc_std_points']:.2f} | {r['acc_min']:.3f}..{r['acc_max']:.3f} | "
            f"{r['nll']:.3f} | {r['ece']:.3f} | {r['auroc']:.3f} |"
        )
    return head + "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny ViT, 2 epochs")
    parser.add_argument("--seeds", type=int, default=3, help="calibration seeds per protocol")
    parser.add_argument("--ratio", type=float, default=0.5, help="fraction of heads removed")
    parser.add_argument("--calib-size", type=int, default=32, help="calibration examples")
    parser.add_argument("--alphas", default="0.1,0.3,0.5,0.7,0.9", help="HIES alphas (global)")
    parser.add_argument("--only", default=None, help="comma-separated methods to run")
    parser.add_argument("--out", type=Path, default=None, help="artifact folder")
    parser.add_argument(
        "--base", type=Path, default=None, help="an already trained model artifact to prune"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--markdown", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    import torch

    torch.set_num_threads(args.threads)
    out = args.out or Path("artifacts") / (
        "prune-protocols-quick" if args.quick else "prune-protocols"
    )
    alphas = [float(a) for a in args.alphas.split(",") if a.strip()]
    chosen = protocols(alphas)
    if args.only:
        keep = {m.strip() for m in args.only.split(",")}
        chosen = [p for p in chosen if p.method in keep]
    base = args.base or base_model(out, args.quick, args.threads)
    unpruned = evaluate(base, out / "eval-unpruned", args.threads)
    rows = []
    for protocol in chosen:
        runs = [
            run_protocol(base, protocol, s, args.ratio, args.calib_size, out, args.threads)
            for s in range(args.seeds)
        ]
        rows.append(aggregate(protocol.label, runs))
        print(f"{protocol.label}: done", file=sys.stderr)
    result = {
        "ratio": args.ratio,
        "seeds": args.seeds,
        "base": str(base),
        "unpruned": {k: unpruned[k] for k in ("acc", "nll", "ece", OOD_AUROC)},
        "rows": rows,
    }
    text = table(rows, unpruned)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.markdown:
        print(text)
    else:
        print(f"ratio {args.ratio}, {args.seeds} calibration seeds, base {base}\n{text}")
    return result


if __name__ == "__main__":
    main()
