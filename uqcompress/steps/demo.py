"""`uqc demo`: init a small ViT, fine-tune it on scikit-learn's digits, evaluate on @test."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uqcompress.steps import eval as eval_step
from uqcompress.steps import finetune as finetune_step
from uqcompress.steps import init as init_step
from uqcompress.steps.common import StepResult

DIGIT_LABELS = [str(d) for d in range(10)]
ACCURACY_BAR = 0.95  # the demo's promise on builtin:digits@test (full mode)


@dataclass(frozen=True)
class DemoPlan:
    preset: str
    epochs: int
    lr: float
    batch_size: int


# Full: ViT-small (4 layers, 4 heads, hidden 64, 2x2 patches of the 8x8 digit = 16 tokens).
FULL = DemoPlan(preset="small", epochs=40, lr=1e-3, batch_size=32)
# Quick: the tiny ViT and 2 epochs, for tests; it exercises every step, not the accuracy.
QUICK = DemoPlan(preset="tiny", epochs=2, lr=1e-3, batch_size=64)


@dataclass(frozen=True)
class DemoResult:
    init: StepResult
    finetune: StepResult
    evaluation: StepResult
    plan: DemoPlan


def run(out: Path, quick: bool, device: str, threads: int, force: bool = False) -> DemoResult:
    plan = QUICK if quick else FULL
    init = init_step.run(
        init_step.InitConfig(family="vit", preset=plan.preset, labels=DIGIT_LABELS, seed=0),
        out / "model-init",
        force,
    )
    finetuned = finetune_step.run(
        init.artifact.path,
        finetune_step.FinetuneConfig(
            data="builtin:digits@train",
            val="builtin:digits@val",
            epochs=plan.epochs,
            lr=plan.lr,
            batch_size=plan.batch_size,
            seed=0,
            device=device,
            threads=threads,
        ),
        out / "model-finetuned",
        force,
    )
    evaluation = eval_step.run(
        [finetuned.artifact.path],
        eval_step.EvalConfig(data="builtin:digits@test", device=device, threads=threads),
        out / "eval-test",
        force,
    )
    return DemoResult(init=init, finetune=finetuned, evaluation=evaluation, plan=plan)
