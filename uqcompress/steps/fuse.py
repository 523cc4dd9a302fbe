"""`uqc fuse`: M pruned members -> one Hydra model artifact (one forward pass, M outputs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uqcompress.artifacts import MANIFEST_NAME, ArtifactWriter, OutputPlan, SourceRef
from uqcompress.errors import ConfigError, IncompatibleInputError, ParityError
from uqcompress.export.parity import save_parity
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse, with_planned_dtype

# Fused members vs the members run one by one (with the averaged embeddings/MLP): the same
# function up to float32 round-off, whatever the model size.
PARITY_ATOL = 1e-4
CHECK_EXAMPLES = 12  # synthetic examples (mixed lengths, padded) both fuse checks run on
# Fused model vs the members as they were given (before averaging their embeddings/MLPs):
# `fuse` warns on stderr when averaging changed what they compute by more than any of these.
CHANGE_MAX_LOGIT_DIFF = 0.05  # largest |logit difference|, any example, member and class
CHANGE_MIN_AGREEMENT = 0.99  # share of examples whose ensemble prediction is unchanged
CHANGE_MI_RELATIVE = 0.2  # |mean MI fused - mean MI members| / mean MI members ...
CHANGE_MI_FLOOR = 1e-3  # ... beyond this absolute change (nats), so MI near 0 never warns
PADDING_WARNING = 0.25  # docs/methods/hydra.md: warn when this share of head slots is padding


@dataclass(frozen=True)
class FuseConfig:
    shared_layers: int = fields.added(
        0,
        help="Run the first K blocks once, shared by every member (a trunk with every head "
        "some member kept there, each averaged over the members that keep it); the members "
        "branch after it. 0: every block per member (the paper's Hydra).",
    )
    device: str = fields.device("cpu")
    threads: int | None = fields.threads()
    dtype: str = fields.dtype()

    def validate(self) -> None:
        found = fields.problems(self)
        found.raise_any()


@dataclass(frozen=True)
class MemberInputs:
    """Where the members are: directories to load, and the refs that go into the lineage."""

    paths: list[Path]
    names: list[str]
    refs: list[SourceRef]
    summary: dict[str, Any]  # the members artifact's summary (empty for loose models)


def run(
    inputs: list[Path], cfg: FuseConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.models.loading import resolve_model_source

    members = _member_inputs(inputs)
    # the members are loaded as the first one resolves --dtype (auto: its stored dtype for a
    # decoder over 1B parameters); the fused model is built and saved in it
    cfg = with_planned_dtype(cfg, resolve_model_source(members.paths[0]))
    config = asdict(cfg)
    plan = OutputPlan(
        kind="model",
        step="fuse",
        config=config,
        id_config=fields.id_config(cfg, config),
        inputs=members.refs,
        device=cfg.device,
    )

    def build(writer: ArtifactWriter) -> None:
        from uqcompress.methods.hydra import (
            mlp_spread,
        )
        from uqcompress.models.loading import (
            load_model,
            resolve_model_source,
            save_model,
        )
        from uqcompress.models.summary import model_summary
        from uqcompress.runtime.console import activity, stderr

        with activity(f"fusing {len(members.paths)} members") as work:
            work.step("loading the members")
            loaded = [load_model(resolve_model_source(p), cfg.dtype) for p in members.paths]
            work.step("fusing and checking parity")
            hydra, parity, batch = _fused(loaded, members, cfg, writer, stderr)
            work.step("saving the Hydra model")
            save_model(hydra, writer.dir)
            save_parity(writer.dir, parity)
        worst = parity.max_abs_diff["member_logits"]
        spread = mlp_spread(loaded)
        change = change_vs_members(hydra, loaded, batch)
        summary = model_summary(hydra)

        member_parameters = [m.num_parameters() for m in loaded]
        summary.update(
            {
                "parameters_members": member_parameters,
                "parameters_ratio_to_members": round(
                    summary["parameters"] / sum(member_parameters), 4
                ),
                "fusion_exactness_max_logit_diff": worst,
                "change_vs_members": change,
                "shared_weight_spread": spread,
                "exact": spread == 0.0 and not cfg.shared_layers,
            }
        )
        if cfg.shared_layers:
            summary["trunk"] = (
                f"blocks 0..{cfg.shared_layers - 1} run once: every head some member kept "
                "there, each head's weights and the norms averaged over the members that have "
                "them (the base's own when the members were not fine-tuned apart)"
            )
        for key in ("jaccard_per_layer", "jaccard_mean", "select"):
            if key in members.summary:
                summary[key] = members.summary[key]
        writer.summary.update(summary)
        if (large := change_too_large(change)) is not None and cfg.shared_layers:
            writer.warn(
                f"sharing the first {cfg.shared_layers} blocks (every head some member kept "
                f"there) changed the members' outputs on {change['examples']} check examples: "
                f"{large}; evaluate the fused model, and fine-tune it (uqc finetune) if it "
                "lost accuracy or diversity"
            )
        elif large is not None:
            message = (
                f"the members' embeddings and MLPs differ (fine-tuned separately; largest "
                f"weight difference {spread:.3g}) and the Hydra model uses their average, "
                f"which changed the members' outputs on {change['examples']} check examples: "
                f"{large}; evaluate the fused model, and fine-tune it briefly (uqc finetune) "
                "if it lost accuracy"
            )
            writer.warn(message)  # printed on stderr once, as every built artifact's warnings
        fused: Any = hydra.model
        padding = fused.spec.padding_ratio()
        if padding > PADDING_WARNING:
            writer.warn(
                f"{padding:.0%} of the fused head slots are zero padding (members keep uneven "
                "head counts): compute spent on nothing; equal counts per layer avoid it"
            )

    return build_or_reuse(plan, out, force, build)


def _fused(
    loaded: list[Any], members: MemberInputs, cfg: FuseConfig, writer: Any, stderr: Any
) -> tuple[Any, Any, dict[str, Any]]:
    """The Hydra model of the loaded members, checked against them: (hydra, parity, the
    synthetic batch it was checked on). ParityError (nothing written) when they differ."""
    from uqcompress.engine.modality import synthetic_batch
    from uqcompress.methods.hydra import check_fusable, check_shared_layers, fuse
    from uqcompress.models.loading import calibration_dropped

    for each, path in zip(loaded, members.paths, strict=True):
        if (dropped := calibration_dropped(each, path)) is not None:
            writer.warn(dropped)
    check_fusable(loaded, members.names)
    check_shared_layers(loaded, cfg.shared_layers)
    trunk = f" on a trunk of {cfg.shared_layers} shared blocks" if cfg.shared_layers else ""
    stderr.print(f"[dim]fusing {len(loaded)} {loaded[0].family.name} members{trunk}...[/dim]")
    hydra = fuse(loaded, cfg.shared_layers)
    batch = synthetic_batch(loaded[0], count=CHECK_EXAMPLES)
    parity = _parity_vs_shared_weights(hydra, loaded, batch, cfg.shared_layers)
    if not parity.passed:
        raise ParityError(
            f"the fused model differs from its members: {parity.describe()}; nothing written",
            hint="this is a bug in uqc's Hydra fusion; please report it with the members",
        )
    return hydra, parity, batch


def _parity_vs_shared_weights(
    hydra: Any, members: list[Any], batch: dict[str, Any], shared_layers: int = 0
) -> Any:
    """The exactness of the fusion: the shared parity check (`export/parity.py`) of the fused
    model against each member run alone with the shared (averaged) embeddings and MLP put
    in (and the trunk's blocks in the family's own modules, with `shared_layers`), on the
    synthetic check batch: all four contract outputs of the ensemble, so drift in
    its uncertainty fails too. Says nothing about what averaging did (`change_vs_members`)."""
    import torch

    from uqcompress.export.parity import Parity, contract_outputs
    from uqcompress.methods.hydra import shared_weight_members
    from uqcompress.models.precision import parity_atol

    reference = shared_weight_members(members, shared_layers)
    with torch.inference_mode():
        fused = hydra.model(**batch).member_logits.float()  # [B, M, C]
        alone = torch.stack([m.model(**batch).logits.float() for m in reference], dim=1)
    parity = Parity(parity_atol(hydra.dtype, PARITY_ATOL))  # half dtypes: their round-off
    parity.compare(contract_outputs(alone), contract_outputs(fused))
    return parity


def change_vs_members(hydra: Any, members: list[Any], batch: dict[str, Any]) -> dict[str, Any]:
    """What fusing did to the members as they were given (their own embeddings and MLPs), on
    the check batch: the largest |logit difference| (any example, member, class), the share
    of examples whose ensemble prediction (argmax of the mean probabilities) is unchanged,
    and the ensemble's mean mutual information before and after. All 0 / 1 / equal when the
    members' shared weights were identical."""
    import torch

    from uqcompress.export.parity import contract_outputs

    with torch.inference_mode():
        fused = hydra.model(**batch).member_logits.float()  # [B, M, C]
        original = torch.stack([m.model(**batch).logits for m in members], dim=1).float()
    before, after = contract_outputs(original), contract_outputs(fused)
    same = before["probs"].argmax(dim=-1) == after["probs"].argmax(dim=-1)  # [B]
    return {
        "examples": int(fused.shape[0]),
        "max_logit_diff": float((fused - original).abs().max()),
        "agreement": int(same.sum()) / len(same),
        "mean_mutual_info_members": float(before["mutual_info"].mean()),
        "mean_mutual_info_fused": float(after["mutual_info"].mean()),
    }


def change_too_large(change: dict[str, Any]) -> str | None:
    """Which of the CHANGE_* bounds `change` (from `change_vs_members`) exceeds, in words;
    None when fusion kept the members' outputs within all of them."""
    reasons = []
    if change["max_logit_diff"] > CHANGE_MAX_LOGIT_DIFF:
        reasons.append(
            f"max logit difference {change['max_logit_diff']:.3g} (> {CHANGE_MAX_LOGIT_DIFF})"
        )
    if change["agreement"] < CHANGE_MIN_AGREEMENT:
        reasons.append(
            f"ensemble prediction agreement {change['agreement']:.3g} (< {CHANGE_MIN_AGREEMENT})"
        )
    before, after = change["mean_mutual_info_members"], change["mean_mutual_info_fused"]
    if abs(after - before) > CHANGE_MI_RELATIVE * before + CHANGE_MI_FLOOR:
        reasons.append(
            f"mean mutual information {before:.3g} -> {after:.3g} "
            f"(more than {CHANGE_MI_RELATIVE:.0%} apart)"
        )
    return ", ".join(reasons) if reasons else None


def _member_inputs(inputs: list[Path]) -> MemberInputs:
    """A members artifact, or several pruned model artifacts of one base model."""
    from uqcompress.artifacts import open_artifact, read_manifest

    if not inputs:
        raise ConfigError("no members given", hint="pass a members artifact (uqc prune --members)")
    kinds = [read_manifest(p).kind if (p / MANIFEST_NAME).is_file() else None for p in inputs]
    if len(inputs) == 1:
        if kinds[0] != "members":
            what = f"a {kinds[0]} artifact" if kinds[0] else "not an artifact"
            raise IncompatibleInputError(
                f"{inputs[0]} is {what}; fuse takes a members artifact (or several pruned "
                "models of one base)",
                hint="make members with uqc prune SCORES --members 3, then uqc fuse MEMBERS",
            )
        artifact = open_artifact(inputs[0], expect_kind="members")
        count = int(artifact.manifest.summary["members"])
        return MemberInputs(
            paths=[inputs[0] / f"member{m}" for m in range(count)],
            names=[f"{inputs[0]}/member{m}" for m in range(count)],
            refs=[SourceRef.of("members", artifact)],
            summary=dict(artifact.manifest.summary),
        )
    refs: list[SourceRef] = []
    bases: list[str | None] = []
    families: list[Any] = []
    for path, kind in zip(inputs, kinds, strict=True):
        if kind != "model":
            raise IncompatibleInputError(
                f"{path} is not a model artifact; fuse takes one members artifact, or "
                "several pruned model artifacts of one base",
                hint="make members with uqc prune SCORES --members 3",
            )
        artifact = open_artifact(path, expect_kind="model")
        refs.append(SourceRef.of(f"member{len(refs)}", artifact))
        bases.append(_pruned_from(path))
        families.append(artifact.manifest.summary.get("family"))
    if len({ref.id for ref in refs}) != len(refs):
        raise IncompatibleInputError(
            "the same member is given more than once; a Hydra of identical members measures "
            "nothing",
            hint="pass each member once",
        )
    for path, family in zip(inputs, families, strict=True):
        if family != families[0]:
            raise IncompatibleInputError(
                f"members come from different families: {path} is {family}, {inputs[0]} is "
                f"{families[0]}",
                hint="fuse members pruned from one base model",
            )
    for path, base in zip(inputs, bases, strict=True):
        if base is None:
            raise IncompatibleInputError(
                f"{path} was not pruned (no uqc prune in its lineage); Hydra members are "
                "differently-pruned copies of one base",
                hint="make members with uqc prune SCORES --members 3",
            )
        if base != bases[0]:
            raise IncompatibleInputError(
                f"members come from different base models: {path} was pruned from "
                f"{base[:12]}, {inputs[0]} from {str(bases[0])[:12]}",
                hint="fuse members pruned from one base model",
            )
    return MemberInputs(paths=list(inputs), names=[str(p) for p in inputs], refs=refs, summary={})


def _pruned_from(path: Path) -> str | None:
    """The id of the model a model artifact was pruned from, following its lineage back
    through fine-tuning; None when it was never pruned."""
    from uqcompress.artifacts import read_manifest
    from uqcompress.errors import UqcError

    current = path.resolve()
    for _ in range(64):  # lineages are short; a bound instead of trusting hand-edited ones
        try:
            manifest = read_manifest(current)
        except UqcError:
            return None
        if manifest.step == "prune":
            model_refs = [ref for ref in manifest.inputs if ref.role == "model"]
            return model_refs[0].id if model_refs else None
        parents = [ref for ref in manifest.inputs if ref.role == "model"]
        if not parents:
            return None
        current = (current / parents[0].path).resolve()
    return None
