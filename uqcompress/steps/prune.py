"""`uqc prune`: physically remove the least important attention heads."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from uqcompress.artifacts import MANIFEST_NAME, Artifact, ArtifactWriter, OutputPlan, SourceRef
from uqcompress.errors import ArtifactError, ConfigError, IncompatibleInputError, ParityError
from uqcompress.export.parity import save_parity
from uqcompress.methods.scoring import registry as scorers
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse, with_planned_dtype

PARITY_ATOL = 1e-5  # pruned vs gated full model: the same function, up to float round-off


@dataclass(frozen=True)
class PruneConfig:
    ratio: float | None = fields.described(
        None,
        help="Fraction of heads to remove, [0, 1). Required for one "
        "model; with --members the default keeps max(1, round(H/M)) heads per "
        "layer in each member. Circuit scores need the ratio they were searched for.",
    )  # required for one model; members default to H / M heads each
    # None: global for one model (HIES's and Michel et al.'s selection), layer for members;
    # resolved (and recorded) before the artifact id is computed
    scope: str | None = fields.described(
        None,
        help="global (the lowest scores anywhere go, uneven heads per layer: HIES's and "
        "Michel et al.'s selection) or layer (the same share per layer). Default: global "
        "for one model, layer for --members; searched circuits (headmap, greedy-circuit) "
        "are kept as searched.",
    )
    min_heads_per_layer: int = fields.described(
        1, help="Heads every layer keeps (0 allows empty layers)."
    )
    members: int = fields.described(
        1, help="Differently-pruned members to produce (an ensemble); writes a members artifact."
    )
    select: str = fields.described(
        "topk",
        help="Members: topk (score set m for member m; needs "
        "uqc score --members M), gumbel (Gumbel-top-k sampling from one ranking) "
        "or partition (ranked heads dealt round-robin: no shared head). gumbel and "
        "partition rank by the mean of all score sets when given several. Circuit "
        "scores (headmap, greedy-circuit) take topk only: member m keeps circuit m "
        "as searched.",
    )
    unit: str = fields.described(
        "query",
        help="Grouped-query attention (decoders): query (remove tiers of query heads, so "
        "every key/value head keeps as many query heads as the others) or kv (remove "
        "whole key/value heads with their query heads). Ignored without GQA.",
    )  # grouped-query attention: remove tiers of query heads, or kv groups
    seed: int = fields.described(0, help="Seed of --select gumbel.")
    mlp_ratio: float = fields.added(
        1.0,
        help="Members: the share of each MLP's intermediate neurons every member keeps, "
        "(0, 1]. Ranked by weight magnitude and dealt round-robin, each member taking its "
        "own deal first (1/M: no neuron shared); a Hydra of such members runs r x M of one "
        "MLP instead of M. 1 keeps them all.",
    )
    device: str = fields.device("cpu")
    threads: int | None = fields.threads()
    dtype: str = fields.dtype()

    def validate(self) -> None:
        problems = fields.problems(self)
        if self.members == 1 and self.ratio is None:
            problems.add(
                "--ratio is required for a single pruned model", hint="pass e.g. --ratio 0.5"
            )
        from uqcompress.methods.gqa import UNITS

        if self.unit not in UNITS:
            problems.add(f"unknown --unit {self.unit!r}", hint=f"use one of: {', '.join(UNITS)}")
        from uqcompress.methods.pruning import SCOPES

        if self.scope is not None and self.scope not in SCOPES:
            problems.add(f"unknown --scope {self.scope!r}", hint=f"use one of: {', '.join(SCOPES)}")
        if not 0.0 < self.mlp_ratio <= 1.0:
            problems.add(
                f"--mlp-ratio {self.mlp_ratio} is outside (0, 1]", hint="pass e.g. --mlp-ratio 0.5"
            )
        elif self.mlp_ratio < 1.0 and self.members == 1:
            problems.add(
                "--mlp-ratio narrows the MLPs of ensemble members",
                hint="pass --members 3 (or leave --mlp-ratio at 1)",
            )
        if self.members > 1 and self.scope == "global":
            problems.add(
                "--members prunes every member per layer",
                hint="drop --scope global when using --members",
            )
        problems.raise_any()


def _scores_and_model(input_path: Path, scores_path: Path | None) -> tuple[Artifact, Path]:
    """The scores artifact and the model it was computed for."""
    from uqcompress.artifacts import open_artifact, read_manifest

    if not input_path.exists():
        from uqcompress.models.loading import refuse_missing_path

        # Before "is a model": a mistyped INPUT is neither a model nor a scores artifact.
        refuse_missing_path(str(input_path))
    first = read_manifest(input_path) if (input_path / MANIFEST_NAME).is_file() else None
    if first is not None and first.kind == "scores":
        if scores_path is not None:
            raise ConfigError(
                "INPUT is already a scores artifact; --scores is for a model INPUT",
                hint="drop --scores",
            )
        scores = open_artifact(input_path, expect_kind="scores")
        ref = scores.manifest.inputs[0]
        model_path = (input_path.resolve() / ref.path).resolve()
        if not model_path.exists():
            raise ArtifactError(
                f"the model these scores were computed for is gone ({model_path})",
                hint="pass the model as INPUT with --scores SCORES",
            )
        return scores, model_path
    if scores_path is None:
        raise ConfigError(
            f"{input_path} is a model; prune needs its head scores",
            hint="pass --scores SCORES, or pipe uqc score ... | uqc prune -",
        )
    return open_artifact(scores_path, expect_kind="scores"), input_path


def run(
    input_path: Path,
    cfg: PruneConfig,
    scores_path: Path | None = None,
    out: Path | None = None,
    force: bool = False,
) -> StepResult:
    from uqcompress.models.loading import resolve_model_source

    cfg.validate()
    scores, model_path = _scores_and_model(input_path, scores_path)
    source = resolve_model_source(model_path)
    cfg = with_planned_dtype(cfg, source)
    scored_for = scores.manifest.inputs[0].id
    if source.ref.id != scored_for:
        raise IncompatibleInputError(
            f"the scores in {scores.path} were computed for model {scored_for[:12]}, not for "
            f"{model_path} ({source.ref.id[:12]})",
            hint="score this model first: uqc score MODEL --data D",
        )
    summary = scores.manifest.summary
    circuit = scorers.is_searched(summary.get("method"))
    # Scope: global by default for one model (the paper's selection for importance scores),
    # per layer for members; a searched circuit is kept as searched (per layer by design).
    if cfg.scope is None or circuit:
        cfg = replace(cfg, scope="layer" if cfg.members > 1 or circuit else "global")
    # A circuit is a searched set of heads, not a ranking: prune keeps exactly what the
    # search kept (per member with --members), so it must be asked for the searched ratio.
    if circuit and summary.get("ratio") != cfg.ratio:
        asked = f"--ratio {cfg.ratio}" if cfg.ratio is not None else "no --ratio"
        raise ConfigError(
            f"these circuit scores were searched for --ratio {summary.get('ratio')}, not {asked}",
            hint=f"pass --ratio {summary.get('ratio')}"
            + (f", or re-score with --ratio {cfg.ratio}" if cfg.ratio is not None else ""),
        )
    if circuit and cfg.members > 1:
        _check_circuit_members(summary, cfg)
    config = asdict(cfg)
    if cfg.members > 1:
        return _run_members(source, scores, cfg, out, force)
    plan = OutputPlan(
        kind="model",
        step="prune",
        config={**config, "method": summary.get("method")},
        id_config=fields.id_config(cfg, config),
        inputs=[source.ref, SourceRef.of("scores", scores)],
        device=cfg.device,
    )

    def build(writer: ArtifactWriter) -> None:
        import torch
        from safetensors.torch import load_file

        from uqcompress.methods.pruning import check_scores_fit, select_grouped_heads
        from uqcompress.models.head_gates import head_groups, heads_per_layer
        from uqcompress.models.loading import calibration_dropped, load_model, save_model
        from uqcompress.models.surgery import kept_heads, prune_heads

        loaded = load_model(source, cfg.dtype)
        if (dropped := calibration_dropped(loaded, source.path)) is not None:
            writer.warn(dropped)
        score = load_file(str(scores.file("scores.safetensors")))["score"]
        heads = heads_per_layer(loaded)
        if score.dim() == 3:
            raise ConfigError(
                f"these scores hold {score.shape[0]} score sets (uqc score --members)",
                hint=f"pass --members {score.shape[0]} to prune one member per set",
            )
        # [L, max H_l]; a model pruned before scoring has NaN where a layer has no head
        check_scores_fit(score, heads, f"the scores in {scores.path}")
        groups = head_groups(loaded)
        if circuit:
            keep = [list(map(int, k)) for k in summary["kept_heads"]]
            check_grouping(keep, loaded)
        else:
            assert cfg.ratio is not None and cfg.scope is not None
            keep = select_grouped_heads(
                score, groups, cfg.ratio, cfg.scope, cfg.min_heads_per_layer, cfg.unit
            )
        params_before = loaded.num_parameters()
        from uqcompress.engine.modality import synthetic_batch

        batch = synthetic_batch(loaded)
        gated = _gated_logits(loaded, keep, batch)
        prune_heads(loaded, keep)
        with torch.inference_mode():
            pruned = loaded.model(**batch).logits
        parity = _parity([(gated, pruned)], loaded.dtype)
        diff = parity.max_abs_diff["member_logits"]
        save_model(loaded, writer.dir)
        save_parity(writer.dir, parity)
        from uqcompress.models.summary import model_summary

        after = heads_per_layer(loaded)
        writer.summary.update(model_summary(loaded))
        writer.summary.update(
            {
                "method": summary.get("method"),
                "ratio": cfg.ratio,
                "scope": "as searched" if circuit else cfg.scope,
                **({"unit": cfg.unit} if groups.grouped else {}),
                "heads_before": sum(heads),
                "heads_after": sum(after),
                "heads_per_layer": after,
                "kept_heads": kept_heads(loaded),
                "parameters_before": params_before,
                "parameters_after": loaded.num_parameters(),
                "max_logit_diff_vs_gated": diff,
            }
        )
        if 0 in after:
            writer.warn(f"layers {[i for i, h in enumerate(after) if h == 0]} have no heads left")

    return build_or_reuse(plan, out, force, build)


def check_grouping(keep: list[list[int]], loaded: Any) -> None:
    """Refuse, in one line, kept heads that break grouped-query attention (circuit scores
    are searched head by head)."""
    from uqcompress.models.surgery import kept_kv_heads

    for layer, (parts, heads) in enumerate(
        zip(loaded.family.attention_layers(loaded.model), keep, strict=True)
    ):
        try:
            kept_kv_heads(parts, heads, layer)
        except ValueError as exc:
            raise ConfigError(
                f"these circuit scores keep heads that break grouped-query attention ({exc})",
                hint="score with --method hies or taylor and prune with --unit query or kv",
            ) from exc


def _parity(pairs: list[tuple[Any, Any]], dtype: str = "float32") -> Any:
    """The shared parity check (`export/parity.py`) of pruned vs gated logits, over the four
    contract outputs each implies; raises ParityError (nothing written) when it fails.

    Shape: each pair (gated, pruned) logits `[B, C]`.
    """
    from uqcompress.export.parity import Parity, contract_outputs
    from uqcompress.models.precision import parity_atol

    parity = Parity(parity_atol(dtype, PARITY_ATOL))  # half dtypes: their round-off
    for gated, pruned in pairs:
        parity.compare(
            contract_outputs(gated[:, None].float()), contract_outputs(pruned[:, None].float())
        )
    if not parity.passed:
        raise ParityError(
            f"the pruned model differs from the gated full model: {parity.describe()}; "
            "nothing written",
            hint="this is a bug in uqc's head surgery; please report it with the model",
        )
    return parity


def _check_circuit_members(summary: dict[str, Any], cfg: PruneConfig) -> None:
    """Circuit scores for members: one searched circuit per member (uqc score --method circuit
    --members M), kept as searched; sampling or dealing from them would discard the search."""
    if cfg.select != "topk":
        raise ConfigError(
            f"--select {cfg.select} samples from a ranking, but circuit scores are searched "
            "head sets (each member keeps its own circuit)",
            hint="use --select topk with circuit scores, or score with --method hies",
        )
    sets = int(summary.get("members", 1))
    if sets != cfg.members:
        raise ConfigError(
            f"these circuit scores hold {sets} searched circuit(s), not one for each of "
            f"{cfg.members} members",
            hint=f"score with uqc score --method {summary.get('method')} --ratio "
            f"{summary.get('ratio')} --members {cfg.members}",
        )


def _gated_logits(
    loaded: Any,
    keep: list[list[int]],
    batch: dict[str, Any],
    neurons: list[list[int]] | None = None,
) -> Any:
    """The full model's logits with every removed head's gate at 0 (and, with `neurons`,
    every removed MLP neuron's input to the down projection at 0): what pruning must equal."""
    import torch

    from uqcompress.models.head_gates import HeadGates

    hooks = []
    if neurons is not None:
        for mlp, kept in zip(loaded.family.mlp_layers(loaded.model), neurons, strict=True):
            mask = torch.zeros(mlp.down.in_features, dtype=mlp.down.weight.dtype)
            mask[kept] = 1.0
            hooks.append(
                mlp.down.register_forward_pre_hook(lambda _, args, mask=mask: (args[0] * mask,))
            )
    try:
        with torch.inference_mode(), HeadGates(loaded) as gates:
            for layer, heads in enumerate(keep):
                mask = torch.zeros_like(gates.gates[layer])
                mask[heads] = 1.0
                gates.gates[layer].copy_(mask)
            return loaded.model(**batch).logits
    finally:
        for hook in hooks:
            hook.remove()


def _member_neurons(base: Any, cfg: PruneConfig) -> list[list[list[int]]] | None:
    """Per member and layer, the MLP neurons it keeps at `--mlp-ratio` (None at 1)."""
    if cfg.mlp_ratio >= 1.0:
        return None
    from uqcompress.methods.mlp_width import member_mlp_neurons

    family = base.family
    if family.mlp_width_key is None:
        raise IncompatibleInputError(
            f"--mlp-ratio: {family.name}'s MLP width is derived from other config keys, so "
            "members with narrower MLPs cannot be saved",
            hint="leave --mlp-ratio at 1 for this family",
        )
    return member_mlp_neurons(base, cfg.members, cfg.mlp_ratio)


def _run_members(
    source: Any, scores: Artifact, cfg: PruneConfig, out: Path | None, force: bool
) -> StepResult:
    """M differently-pruned copies of one base model, one `member{m}/` model dir each."""
    config = asdict(cfg)
    summary = scores.manifest.summary
    plan = OutputPlan(
        kind="members",
        step="prune",
        config={**config, "method": summary.get("method")},
        id_config=fields.id_config(cfg, config),
        inputs=[source.ref, SourceRef.of("scores", scores)],
        device=cfg.device,
    )

    def build(writer: ArtifactWriter) -> None:
        import torch
        from safetensors.torch import load_file

        from uqcompress.methods.pruning import (
            check_scores_fit,
            jaccard_per_layer,
            member_keep_count,
            select_grouped_member_heads,
        )
        from uqcompress.models.head_gates import head_groups, heads_per_layer
        from uqcompress.models.loading import calibration_dropped, load_model, save_model
        from uqcompress.models.surgery import narrow_mlp, prune_heads

        score = load_file(str(scores.file("scores.safetensors")))["score"]
        base = load_model(source, cfg.dtype)
        if (dropped := calibration_dropped(base, source.path)) is not None:
            writer.warn(dropped)
        heads = heads_per_layer(base)
        check_scores_fit(score, heads, f"the scores in {scores.path}")
        if len(set(heads)) != 1:
            raise ConfigError(
                f"--members keeps the same number of heads in every layer of each member; "
                f"this model has {heads} heads per layer",
                hint="make members from the unpruned model, or from one pruned with --scope layer",
            )
        groups = head_groups(base)
        if scorers.is_searched(summary.get("method")):
            # each member is exactly its searched circuit (checked in _check_circuit_members)
            keeps = [[list(map(int, layer)) for layer in m] for m in summary["kept_heads"]]
            for keep in keeps:
                check_grouping(keep, base)
        else:
            unit = groups.unit_size(0, cfg.unit)
            keep_count = member_keep_count(heads[0], cfg.members, cfg.ratio, unit)
            keeps = select_grouped_member_heads(
                score, groups, cfg.members, keep_count, cfg.select, cfg.seed, cfg.unit
            )
        params_before = base.num_parameters()
        from uqcompress.engine.modality import synthetic_batch

        batch = synthetic_batch(base)
        pairs = []
        parameters = []
        from uqcompress.runtime.console import track

        neurons = _member_neurons(base, cfg)
        members = track(enumerate(keeps), "pruning members", total=len(keeps))
        for m, keep in members:
            # A copy of the already-loaded base: no second read and hash of the checkpoint.
            member = copy.deepcopy(base)
            gated = _gated_logits(member, keep, batch, neurons[m] if neurons else None)
            prune_heads(member, keep)
            if neurons:
                narrow_mlp(member, neurons[m])
            with torch.inference_mode():
                pairs.append((gated, member.model(**batch).logits))
            save_model(member, writer.dir / f"member{m}")
            parameters.append(member.num_parameters())
        parity = _parity(pairs, base.dtype)  # every member's outputs, worst over members
        worst = parity.max_abs_diff["member_logits"]
        save_parity(writer.dir, parity)
        overlap = jaccard_per_layer(keeps)
        writer.summary.update(
            {
                "members": cfg.members,
                "select": cfg.select,
                "method": summary.get("method"),
                "labels": list(base.labels),
                "family": base.family.name,
                "heads_before": sum(heads),
                "heads_per_member": sum(len(layer) for layer in keeps[0]),
                "kept_heads": keeps,
                "jaccard_per_layer": [round(v, 4) for v in overlap],
                "jaccard_mean": round(sum(overlap) / len(overlap), 4),
                "parameters_before": params_before,
                "parameters_per_member": parameters,
                "max_logit_diff_vs_gated": worst,
            }
        )
        if neurons:
            widths = {len(layer) for layer in neurons[0]}
            writer.summary.update({"mlp_ratio": cfg.mlp_ratio, "mlp_width": widths.pop()})
        if sum(overlap) / len(overlap) > 0.9:
            writer.warn(
                f"members are near-identical (mean Jaccard overlap of kept heads "
                f"{sum(overlap) / len(overlap):.2f}): an ensemble of them adds little",
            )

    return build_or_reuse(plan, out, force, build)
