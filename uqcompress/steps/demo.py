"""`uqc demo`: the toolchain on scikit-learn's digits, end to end.

init + finetune three ViTs (seeds 0, 1, 2), export the first to ONNX (parity-checked); prune
the first (HIES, 50% of heads, selected globally) and fine-tune it; make a Hydra ensemble of
it (3 members that share no head, fused, fine-tuned jointly) and export that too; train a
Singular Value Ensemble of it and distil it into a DIRECTOR student (Hydra and SVE keep the
epoch of lowest NLL on `digits@val`, the others their last epoch); then evaluate the single
ViT, its ONNX export, the pruned model, the 3-ViT deep ensemble, the Hydra model (torch, ONNX
and its dynamic int8 ONNX, `uqc quantize` behind its drift gate), the SVE, the DIRECTOR
student and the MC Dropout baseline (the first ViT, 10 dropout samples) on `digits@test`,
with `builtin:photo-patches` as out-of-distribution data.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uqcompress.steps import compare as compare_step
from uqcompress.steps import director as director_step
from uqcompress.steps import eval as eval_step
from uqcompress.steps import export as export_step
from uqcompress.steps import finetune as finetune_step
from uqcompress.steps import fuse as fuse_step
from uqcompress.steps import init as init_step
from uqcompress.steps import mc_dropout as mc_dropout_step
from uqcompress.steps import prune as prune_step
from uqcompress.steps import quantize as quantize_step
from uqcompress.steps import score as score_step
from uqcompress.steps import sve as sve_step
from uqcompress.steps.common import StepResult
from uqcompress.steps.registry import step

DIGIT_LABELS = [str(d) for d in range(10)]
ACCURACY_BAR = 0.95  # the demo's promise for the single ViT on builtin:digits@test (full mode)
TEST = "builtin:digits@test"
OOD = "builtin:photo-patches"


@dataclass(frozen=True)
class DemoPlan:
    preset: str
    epochs: int
    lr: float
    batch_size: int
    members: int
    prune_ratio: float = 0.5
    retrain_epochs: int = 10
    hydra_epochs: int = 20  # joint fine-tuning of the fused members (each keeps H/M heads)
    sve_members: int = 4
    sve_epochs: int = 10
    sve_lr: float = 1e-3
    sve_sigma_init: float = 0.01
    director_epochs: int = 30
    director_lr: float = 2e-3
    director_samples: int = 10
    mc_dropout_samples: int = 10
    mc_dropout_rate: float | None = None  # None: the ViT's own hidden_dropout_prob
    # the int8 drift gate's bound on the OOD AUROC drop; None: quantize's default (0.01)
    int8_max_auroc_drop: float | None = None


# Full: ViT-small (4 layers, 4 heads, hidden 64, 2x2 patches of the 8x8 digit = 16 tokens).
FULL = DemoPlan(preset="small", epochs=60, lr=2e-3, batch_size=64, members=3)
# Quick: tiny ViTs and 2 epochs, for tests; it exercises every step, not the accuracy.
QUICK = DemoPlan(
    preset="tiny",
    epochs=2,
    lr=1e-3,
    batch_size=64,
    members=3,
    retrain_epochs=1,
    hydra_epochs=1,
    sve_epochs=1,
    director_epochs=1,
    director_samples=2,
    mc_dropout_samples=2,
    mc_dropout_rate=0.1,  # the tiny ViT trains without dropout
    # Its Hydra is near chance after 2 epochs (loss 2.29): OOD scores are near-ties that int8
    # rounding reorders (measured: AUROC -0.019 per channel, -0.023 per tensor, with max |probs
    # diff| 1.4e-3), so the quick run, which checks the wiring, loosens this one bound.
    int8_max_auroc_drop=0.05,
)


@dataclass(frozen=True)
class DemoRow:
    name: str
    evaluation: StepResult


@dataclass(frozen=True)
class DemoResult:
    plan: DemoPlan
    models: list[StepResult]
    onnx: StepResult
    hydra_onnx: StepResult
    hydra_int8: StepResult  # the Hydra export, dynamic int8 (uqc quantize)
    rows: list[DemoRow]
    comparison: StepResult  # the final table: uqc compare over every row's eval

    @property
    def single(self) -> DemoRow:
        return self.rows[0]


LEDGER = ".uqc-demo.json"  # in the demo's folder: which artifact it wrote under which name


class Ownership:
    """The artifacts `uqc demo` wrote in its folder (name -> id, in `LEDGER`): the demo may
    replace only those (with another id after an upgrade), never a user's artifact that
    happens to sit at one of its paths."""

    def __init__(self, root: Path, adopt: bool) -> None:
        import json

        self.root = root
        self.path = root / LEDGER
        self.owned: dict[str, str] = {}
        if self.path.is_file():
            try:
                raw = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                raw = {}
            owned = raw.get("owned") if isinstance(raw, dict) else None
            if isinstance(owned, dict):
                self.owned = {str(k): str(v) for k, v in owned.items()}
        elif adopt:
            # The default folder of a demo from before this ledger existed: its own by name.
            self.owned = dict(self._artifacts())

    def _artifacts(self) -> list[tuple[str, str]]:
        """(name, id) of every uqc artifact directly in the folder."""
        from uqcompress.artifacts.reader import read_manifest
        from uqcompress.artifacts.writer import is_uqc_manifest
        from uqcompress.errors import UqcError

        found = []
        if self.root.is_dir():
            for child in sorted(self.root.iterdir()):
                if child.is_dir() and is_uqc_manifest(child / "manifest.json"):
                    try:
                        found.append((child.name, read_manifest(child).id))
                    except UqcError:
                        found.append((child.name, ""))  # damaged: never recorded as ours
        return found

    def refuse_foreign(self) -> None:
        """One line, before anything runs, when the folder holds an artifact the demo did
        not write (without --force; with it, the writer's --force rules apply)."""
        from uqcompress.errors import ArtifactError

        for name, artifact_id in self._artifacts():
            if self.owned.get(name) != artifact_id or not artifact_id:
                raise ArtifactError(
                    f"--out {self.root} holds {name}, an artifact uqc demo did not write there; "
                    "the demo replaces only what it wrote",
                    hint="choose another --out, or pass --force to let the demo replace it",
                )

    def may_replace(self, dest: Path) -> bool:
        from uqcompress.artifacts.reader import read_manifest
        from uqcompress.errors import UqcError

        if dest.parent.resolve() != self.root.resolve() or dest.name not in self.owned:
            return False
        try:
            return read_manifest(dest).id == self.owned[dest.name]
        except UqcError:
            return False

    def record(self, result: StepResult) -> StepResult:
        """Note the artifact a step wrote (or reused), written atomically."""
        import json
        import os

        path = result.artifact.path
        if path.parent.resolve() == self.root.resolve():
            self.owned[path.name] = result.artifact.id
            partial = self.path.with_name(self.path.name + ".partial")
            partial.write_text(json.dumps({"owned": self.owned}, indent=1), encoding="utf-8")
            os.replace(partial, self.path)
        return result


_OWNER: ContextVar[Ownership | None] = ContextVar("uqc_demo_owner", default=None)


def _run(name: str, inputs: dict[str, Any], cfg: Any, out: Path, force: bool) -> StepResult:
    """One step of the demo, run as `uqc NAME` and `uqc run` run it. An artifact there from
    an earlier version that the demo wrote itself (another id, e.g. a changed default) is
    rebuilt in place; one with the same id is reused; anything else is refused."""
    from uqcompress.artifacts.writer import replacing_other_artifacts

    owner = _OWNER.get()
    assert owner is not None, "demo steps run inside run()"
    with replacing_other_artifacts(owner.may_replace):
        result = step(name).run(inputs, cfg, out, force)
        assert result is not None, f"{name} writes an artifact"
        return owner.record(result)


def run(
    out: Path, quick: bool, device: str, threads: int, force: bool = False, adopt: bool = False
) -> DemoResult:
    """The demo into `out`. `adopt`: `out` is the demo's default folder, whose artifacts from
    before the demo kept a ledger (`LEDGER`) count as its own."""
    owner = Ownership(out, adopt)
    if not force:
        owner.refuse_foreign()
    token = _OWNER.set(owner)
    try:
        return _run_all(out, quick, device, threads, force)
    finally:
        _OWNER.reset(token)


def _run_all(out: Path, quick: bool, device: str, threads: int, force: bool) -> DemoResult:
    from uqcompress.runtime.console import stderr

    plan = QUICK if quick else FULL
    models = []
    for seed in range(plan.members):
        stderr.print(f"[bold]ViT {seed + 1}/{plan.members}[/bold] (seed {seed})")
        init = _run(
            "init",
            {},
            init_step.InitConfig(family="vit", preset=plan.preset, labels=DIGIT_LABELS, seed=seed),
            out / f"model-init-seed{seed}",
            force,
        )
        models.append(
            _run(
                "finetune",
                {"model": init.artifact.path},
                finetune_step.FinetuneConfig(
                    data="builtin:digits@train",
                    val="builtin:digits@val",
                    epochs=plan.epochs,
                    lr=plan.lr,
                    batch_size=plan.batch_size,
                    select_best="none",  # the last epoch, as docs/demo.md's numbers
                    seed=seed,
                    device=device,
                    threads=threads,
                ),
                out / f"model-seed{seed}",
                force,
            )
        )
    onnx = _run(
        "export",
        {"model": models[0].artifact.path},
        export_step.ExportConfig(format="onnx", data=TEST, device="cpu", threads=threads),
        out / "onnx-seed0",
        force,
    )

    def evaluate(name: str, paths: list[Path], folder: str) -> DemoRow:
        cfg = eval_step.EvalConfig(data=TEST, ood=[OOD], device=device, threads=threads)
        return DemoRow(name, _run("eval", {"models": paths}, cfg, out / folder, force))

    stderr.print(f"[bold]pruning {plan.prune_ratio:.0%} of the heads (HIES scores)[/bold]")
    scores = _run(
        "score",
        {"model": models[0].artifact.path},
        score_step.ScoreConfig(
            method="hies",
            data="builtin:digits@train",
            calib_size=32,
            seed=0,
            device=device,
            threads=threads,
        ),
        out / "scores-hies",
        force,
    )
    pruned = _run(
        "prune",
        {"input": scores.artifact.path},
        prune_step.PruneConfig(ratio=plan.prune_ratio, device=device, threads=threads),
        out / "model-pruned",
        force,
    )
    retrained = _run(
        "finetune",
        {"model": pruned.artifact.path},
        finetune_step.FinetuneConfig(
            data="builtin:digits@train",
            val="builtin:digits@val",
            epochs=plan.retrain_epochs,
            lr=plan.lr / 2,
            batch_size=plan.batch_size,
            select_best="none",
            seed=0,
            device=device,
            threads=threads,
        ),
        out / "model-pruned-finetuned",
        force,
    )
    hydra, hydra_onnx = _hydra(plan, scores.artifact.path, out, device, threads, force)
    stderr.print("[bold]Hydra ONNX quantized to int8 (dynamic), behind the drift gate[/bold]")
    hydra_int8 = _run(
        "quantize",
        {"model": hydra_onnx.artifact.path},
        quantize_step.QuantizeConfig(
            mode="dynamic",
            data=TEST,
            ood=[OOD],
            max_auroc_drop=plan.int8_max_auroc_drop,
            device="cpu",
            threads=threads,
        ),
        out / "onnx-hydra-int8",
        force,
    )
    stderr.print(f"[bold]Singular Value Ensemble of {plan.sve_members}[/bold]")
    sve = _run(
        "svd-ensemble",
        {"model": models[0].artifact.path},
        sve_step.SVEConfig(
            data="builtin:digits@train",
            val="builtin:digits@val",
            members=plan.sve_members,
            sigma_init=plan.sve_sigma_init,
            epochs=plan.sve_epochs,
            lr=plan.sve_lr,
            batch_size=plan.batch_size,
            select_best="nll",  # the epoch of lowest NLL on digits@val
            seed=0,
            device=device,
            threads=threads,
        ),
        out / "model-sve",
        force,
    )
    stderr.print("[bold]DIRECTOR: the blocks distilled into one sampling DiT transition[/bold]")
    student = _run(
        "distill-director",
        {"model": models[0].artifact.path},
        director_step.DirectorConfig(
            data="builtin:digits@train",
            val="builtin:digits@val",
            samples=plan.director_samples,
            epochs=plan.director_epochs,
            lr=plan.director_lr,
            batch_size=plan.batch_size,
            select_best="none",
            seed=0,
            device=device,
            threads=threads,
        ),
        out / "model-director",
        force,
    )
    mc_dropout = _mc_dropout(plan, models[0].artifact.path, out, device, threads, force)
    share = f"{plan.prune_ratio:.0%} heads pruned"
    scope = pruned.artifact.manifest.summary["scope"]  # global: prune's default for one model
    rows = [
        evaluate(f"ViT-{plan.preset} (torch)", [models[0].artifact.path], "eval-single"),
        evaluate(f"ViT-{plan.preset} (ONNX Runtime)", [onnx.artifact.path], "eval-onnx"),
        evaluate(
            f"  {share} (HIES, {scope}), no retraining", [pruned.artifact.path], "eval-pruned"
        ),
        evaluate(
            f"  {share}, + {plan.retrain_epochs} epochs fine-tuning",
            [retrained.artifact.path],
            "eval-pruned-finetuned",
        ),
        evaluate(
            f"deep ensemble of {plan.members} ViT-{plan.preset}",
            [m.artifact.path for m in models],
            "eval-ensemble",
        ),
        evaluate(
            f"Hydra: {plan.members} pruned ViT-{plan.preset} fused, + best of "
            f"{plan.hydra_epochs} epochs",
            [hydra.artifact.path],
            "eval-hydra",
        ),
        evaluate("  Hydra (ONNX Runtime)", [hydra_onnx.artifact.path], "eval-hydra-onnx"),
        evaluate(
            "  Hydra (ONNX Runtime, int8 dynamic)", [hydra_int8.artifact.path], "eval-hydra-int8"
        ),
        evaluate(
            f"SVE: {plan.sve_members} members of ViT-{plan.preset}, best of {plan.sve_epochs} "
            "epochs",
            [sve.artifact.path],
            "eval-sve",
        ),
        evaluate(
            f"DIRECTOR: 1 DiT block, {plan.director_samples} samples, "
            f"{plan.director_epochs} epochs",
            [student.artifact.path],
            "eval-director",
        ),
        evaluate(
            f"MC Dropout: ViT-{plan.preset}, {plan.mc_dropout_samples} samples, p "
            f"{mc_dropout.artifact.manifest.config['rate']:g}",
            [mc_dropout.artifact.path],
            "eval-mc-dropout",
        ),
    ]
    comparison = _run(
        "compare",
        {"evals": [row.evaluation.artifact.path for row in rows]},
        compare_step.CompareConfig(baseline=0, names=[row.name.strip() for row in rows]),
        out / "compare",
        force,
    )
    return DemoResult(
        plan=plan,
        models=models,
        onnx=onnx,
        hydra_onnx=hydra_onnx,
        hydra_int8=hydra_int8,
        rows=rows,
        comparison=comparison,
    )


def _mc_dropout(
    plan: DemoPlan, model: Path, out: Path, device: str, threads: int, force: bool
) -> StepResult:
    """The MC Dropout baseline: the first ViT, dropout on at inference, S samples."""
    from uqcompress.runtime.console import stderr

    stderr.print("[bold]MC Dropout: the first ViT with dropout kept on at inference[/bold]")
    return _run(
        "mc-dropout",
        {"model": model},
        mc_dropout_step.MCDropoutConfig(
            samples=plan.mc_dropout_samples,
            rate=plan.mc_dropout_rate,
            device=device,
            threads=threads,
        ),
        out / "model-mc-dropout",
        force,
    )


def _hydra(
    plan: DemoPlan, scores: Path, out: Path, device: str, threads: int, force: bool
) -> tuple[StepResult, StepResult]:
    """M members that share no head (HIES ranking dealt round-robin), fused into one Hydra
    model, fine-tuned jointly, exported to ONNX."""
    from uqcompress.runtime.console import stderr

    stderr.print(f"[bold]Hydra: {plan.members} members, fused[/bold]")
    members = _run(
        "prune",
        {"input": scores},
        prune_step.PruneConfig(
            members=plan.members, select="partition", device=device, threads=threads
        ),
        out / "members",
        force,
    )
    fused = _run(
        "fuse",
        {"members": [members.artifact.path]},
        fuse_step.FuseConfig(device=device, threads=threads),
        out / "model-hydra",
        force,
    )
    trained = _run(
        "finetune",
        {"model": fused.artifact.path},
        finetune_step.FinetuneConfig(
            data="builtin:digits@train",
            val="builtin:digits@val",
            epochs=plan.hydra_epochs,
            lr=plan.lr,
            batch_size=plan.batch_size,
            select_best="nll",  # the epoch of lowest NLL on digits@val
            seed=0,
            device=device,
            threads=threads,
        ),
        out / "model-hydra-finetuned",
        force,
    )
    exported = _run(
        "export",
        {"model": trained.artifact.path},
        export_step.ExportConfig(format="onnx", data=TEST, device="cpu", threads=threads),
        out / "onnx-hydra",
        force,
    )
    return trained, exported
