"""`uqc score`: attention-head importance, `[L, H]`, as a scores artifact."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.errors import DataError
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse

METHODS = ("taylor", "hies", "headmap", "greedy-circuit", "random", "l2")
# Old names still accepted (a warning says the new one): `circuit` was uqc's greedy search,
# documented as HeadMap's until HeadMap's own algorithm arrived as `headmap`.
ALIASES = {"circuit": "greedy-circuit"}
NEEDS_DATA = ("taylor", "hies", "headmap", "greedy-circuit", "circuit")
# Methods whose result is a searched set of kept heads (prune keeps it as searched), with
# `circuit` for scores artifacts written before the rename.
SEARCHED = ("headmap", "greedy-circuit", "circuit")
SCORES_FILE = "scores.safetensors"


def canonical_method(method: str) -> str:
    """The method's current name (`circuit` -> `greedy-circuit`)."""
    return ALIASES.get(method, method)


@dataclass(frozen=True)
class ScoreConfig:
    method: str = "hies"
    # runtime: the data's content fingerprints are in the id instead
    data: str | None = fields.runtime(None)
    calib_size: int = 32
    alpha: float = 0.5
    his_abs: str = "sample"
    norm_scope: str = "global"
    taylor_layer_l2: bool = False
    taylor_minmax: bool = False
    ood: str | None = fields.runtime(None)
    ratio: float | None = None
    members: int = 1
    seed: int = 0
    # headmap: the examples whose lowest-loss `calib_size` are kept (None: all of --data)
    calib_pool: int | None = fields.added(None)
    batch_size: int = 16
    max_length: int | None = None
    text_column: str = fields.runtime("text")
    label_column: str = fields.runtime("label")
    text_pair_column: str | None = fields.runtime(None)
    device: str = fields.device()
    threads: int | None = fields.threads()
    workers: int = fields.workers()

    def validate(self) -> None:
        problems = fields.problems(self)
        method = canonical_method(self.method)
        if method not in METHODS:
            problems.add(
                f"unknown --method {self.method!r}", hint=f"use one of: {', '.join(METHODS)}"
            )
        if self.method in NEEDS_DATA and not self.data:
            problems.add(
                f"--method {self.method} needs --data (calibration examples)",
                hint="pass --data, e.g. --data builtin:digits@train",
            )
        if self.members < 1:
            problems.add(
                f"--members {self.members} must be at least 1",
                hint="pass --members 4 for four score sets",
            )
        if self.calib_size < 1:
            problems.add(
                f"--calib-size {self.calib_size} must be at least 1", hint="pass --calib-size 32"
            )
        if self.batch_size < 1:
            problems.add(
                f"--batch-size {self.batch_size} must be at least 1", hint="pass --batch-size 16"
            )
        if method in SEARCHED:
            if self.ratio is None:
                problems.add(
                    f"--method {self.method} searches for a head budget: pass --ratio",
                    hint="e.g. --ratio 0.5 (the same ratio prune will use)",
                )
            elif not 0.0 <= self.ratio < 1.0:
                problems.add(
                    f"--ratio {self.ratio} is outside [0, 1)", hint="pass e.g. --ratio 0.5"
                )
        elif self.ood:
            problems.add(
                "--ood is used by --method headmap and greedy-circuit only",
                hint="drop --ood, or use --method headmap",
            )
        if self.calib_pool is not None:
            if method != "headmap":
                problems.add(
                    "--calib-pool is used by --method headmap only (it keeps the pool's "
                    "lowest-loss examples)",
                    hint="drop --calib-pool, or use --method headmap",
                )
            elif self.calib_pool < self.calib_size:
                problems.add(
                    f"--calib-pool {self.calib_pool} is smaller than --calib-size "
                    f"{self.calib_size}",
                    hint=f"pass --calib-pool {4 * self.calib_size} or more",
                )
        elif method == "headmap" and self.members > 1:
            problems.add(
                f"--method headmap --members {self.members} would search the same lowest-loss "
                "examples for every member (identical circuits)",
                hint="pass --calib-pool N: member m then draws its own N-example pool (seed + m)",
            )
        problems.raise_any()


def run(
    model_path: Path, cfg: ScoreConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.data import load_data
    from uqcompress.models.loading import refuse_fused, resolve_model_source

    cfg.validate()
    if cfg.method in ALIASES:
        from dataclasses import replace

        from uqcompress.runtime.console import stderr

        renamed = canonical_method(cfg.method)
        stderr.print(
            f"[yellow]warning: --method {cfg.method} is now called {renamed} (uqc's greedy "
            f"search, not HeadMap's: that is --method headmap); {cfg.method} still works[/yellow]"
        )
        cfg = replace(cfg, method=renamed)
    source = resolve_model_source(model_path)
    refuse_fused(source, "score")
    data = (
        load_data(
            cfg.data, cfg.text_column, cfg.label_column, text_pair_column=cfg.text_pair_column
        )
        if cfg.method in NEEDS_DATA and cfg.data
        else None
    )
    ood = (
        load_data(
            cfg.ood,
            cfg.text_column,
            cfg.label_column,
            require_labels=False,
            text_pair_column=cfg.text_pair_column,
        )
        if cfg.ood
        else None
    )
    if data is not None and len(data) == 0:
        raise DataError(f"{data.spec} is empty", hint="pass calibration examples")
    config = asdict(cfg)
    entries = [d.manifest_entry(role) for d, role in ((data, "calibration"), (ood, "ood")) if d]
    plan = OutputPlan(
        kind="scores",
        step="score",
        config=config,
        # HIES's AE divides each query by ln of the keys it can attend (issue 26): a scores
        # artifact of the earlier definition is not reused for it
        id_config={
            **fields.id_config(cfg, config),
            **({"ae_normaliser": "attendable-keys"} if cfg.method == "hies" else {}),
        },
        inputs=[source.ref],
        data=entries,
        device=cfg.device,
    )

    def build(writer: ArtifactWriter) -> None:
        from safetensors.torch import save_file

        from uqcompress.methods.scoring import head_counts
        from uqcompress.models.loading import load_model
        from uqcompress.runtime.distributed import rank_device

        loaded = load_model(source)
        model: Any = loaded.model
        model.to(rank_device(cfg.device))  # this process's GPU under torchrun
        # The heads the model has now (a pruned model records fewer than its config's
        # num_attention_heads); uneven layers score as [L, max H_l], NaN where no head is.
        heads = head_counts(loaded)
        start = time.perf_counter()
        if cfg.members == 1:
            tensors, extra = _compute(loaded, cfg, data, ood)
        else:
            # Member m scores on its own seeded calibration subset (seed + m): M score sets
            # `[M, L, H]` for M differently-pruned ensemble members.
            from dataclasses import replace

            import torch

            runs = [
                _compute(loaded, replace(cfg, seed=cfg.seed + m), data, ood)
                for m in range(cfg.members)
            ]
            tensors = {k: torch.stack([t[k] for t, _ in runs]) for k in runs[0][0]}
            extra = dict(runs[0][1])
            if "kept_heads" in extra:
                extra["kept_heads"] = [e["kept_heads"] for _, e in runs]
        seconds = time.perf_counter() - start
        _check_finite(tensors, heads, loaded, source.path, cfg.method)
        save_file(
            {k: v.contiguous().float().cpu() for k, v in tensors.items()},
            str(writer.dir / SCORES_FILE),
            metadata={"format": "pt"},
        )
        score = tensors["score"]
        from uqcompress.models.head_gates import head_groups

        groups = head_groups(loaded)
        if groups.grouped:  # grouped-query attention: which key/value head each query reads
            writer.summary["key_value_heads_per_layer"] = groups.kv_heads
            writer.summary["kv_head_of_query"] = groups.kv_head_of_query()
        writer.summary.update(
            {
                "method": cfg.method,
                "members": cfg.members,
                "layers": int(score.shape[-2]),
                "heads": int(score.shape[-1]),
                "heads_per_layer": heads,
                "seconds": round(seconds, 3),
                "calibration_examples": min(cfg.calib_size, len(data)) if data else 0,
                **extra,
            }
        )

    return build_or_reuse(plan, out, force, build)


def _check_finite(
    tensors: dict[str, Any], heads: list[int], loaded: Any, path: Path, method: str
) -> None:
    """NonFiniteError before anything is written if a head the model has scores NaN or
    infinity (a model with NaN outputs): prune would rank nothing."""
    from uqcompress.engine.finite import non_finite_weights, weights_summary
    from uqcompress.methods.pruning import check_finite_scores

    count, names = non_finite_weights(loaded.model)
    for name, values in tensors.items():
        check_finite_scores(
            values.float().cpu(),
            heads,
            f"the {method} scores ({name}) of {path}",
            weights_summary(count, names) if count else "",
        )


def _calibration_batches(
    loaded: Any, data: Any, cfg: ScoreConfig, size: int | None = None
) -> list[dict[str, Any]]:
    """A seeded subset of `size` (default `calib_size`) labelled examples, encoded once, in
    fixed batches (all of them, in order, when `size` covers the data).

    In a multi-process launch this process gets its contiguous shard of those batches (whole
    batches, the same ones a single process runs: Taylor's |gradient| is taken per batch);
    the scorers add up what every process computed (`_gather`).
    """
    import numpy as np

    count = min(cfg.calib_size if size is None else size, len(data))
    if count == len(data):
        pick = np.arange(count)
    else:
        pick = np.sort(np.random.default_rng(cfg.seed).choice(len(data), count, replace=False))
    return _encoded_batches(loaded, data, pick, cfg)


def _encoded_batches(
    loaded: Any, data: Any, pick: Any, cfg: ScoreConfig, shard: bool = True
) -> list[dict[str, Any]]:
    """The examples `pick` (sorted indices) of `data`, encoded once, in fixed batches; with
    `shard`, in a multi-process launch only this process's contiguous share of them."""
    from uqcompress.data.dataset import LabeledData
    from uqcompress.data.encoding import check_input_kind, encode, make_loader
    from uqcompress.data.labels import map_labels
    from uqcompress.runtime.distributed import rank_device, shard_bounds

    check_input_kind(data, loaded.input_kind, loaded.family.name)
    ids = map_labels(data, loaded.labels, placeholder=False).ids
    subset = LabeledData(
        spec=data.spec,
        input_kind=data.input_kind,
        fingerprint=data.fingerprint,
        labels=[data.labels[i] for i in pick] if data.labels is not None else None,
        texts=[data.texts[i] for i in pick] if data.texts is not None else None,
        text_pairs=[data.text_pairs[i] for i in pick] if data.text_pairs is not None else None,
        columns=data.columns,
        images=data.images.subset(pick.tolist()) if data.images is not None else None,
    )
    encoded = encode(subset, loaded, ids[pick], cfg.max_length, workers=cfg.workers)
    device = rank_device(cfg.device)
    batches = list(make_loader(encoded, cfg.batch_size))
    first, last = shard_bounds(len(batches)) if shard else (0, len(batches))
    return [{k: v.to(device) for k, v in batch.items()} for batch in batches[first:last]]


def _gather() -> Any:
    """The scorers' `gather` in a multi-process launch (None for one process)."""
    from uqcompress.runtime.distributed import all_gather_cat, world_size

    return all_gather_cat if world_size() > 1 else None


def _compute(
    loaded: Any, cfg: ScoreConfig, data: Any, ood: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    from uqcompress.methods import scoring

    if cfg.method == "random":
        return {"score": scoring.random_head_scores(loaded, cfg.seed)}, {}
    if cfg.method == "l2":
        return {"score": scoring.l2_scores(loaded)}, {}
    if cfg.method == "headmap":
        batches, calibration = _lowest_loss_batches(loaded, data, cfg)
    else:
        batches, calibration = _calibration_batches(loaded, data, cfg), {}
    if cfg.method == "taylor":
        score = scoring.taylor_scores(
            loaded,
            batches,
            layer_l2=cfg.taylor_layer_l2,
            global_minmax=cfg.taylor_minmax,
            gather=_gather(),
        )
        return {"score": score}, {}
    if cfg.method == "hies":
        parts = scoring.hies_scores(
            loaded,
            batches,
            alpha=cfg.alpha,
            his_abs=cfg.his_abs,
            norm_scope=cfg.norm_scope,
            gather=_gather(),
        )
        return {"score": parts["score"], "his": parts["his"], "ae": parts["ae"]}, {}
    from uqcompress.methods.pruning import heads_to_remove

    assert cfg.ratio is not None
    # Per layer, of the heads the model has now (not config.num_attention_heads).
    heads = scoring.head_counts(loaded)
    keep = [h - heads_to_remove(cfg.ratio, 1, h, "layer") for h in heads]
    ood_batches = (
        _calibration_batches(loaded, _as_index_labels(ood), cfg) if ood is not None else None
    )
    from rich.progress import Progress

    from uqcompress.runtime.console import stderr

    search = scoring.headmap_scores if cfg.method == "headmap" else scoring.circuit_scores
    total = (
        scoring.headmap_evaluations(heads)
        if cfg.method == "headmap"
        else scoring.circuit_evaluations(keep, heads)
    )
    with Progress(console=stderr, transient=True) as progress:
        task = progress.add_task(f"{cfg.method} search", total=None)

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        if cfg.method == "headmap":  # every process searches all its batches (not sharded)
            score, kept = search(loaded, batches, keep, ood_batches=ood_batches, progress=report)
        else:
            score, kept = scoring.circuit_scores(
                loaded, batches, keep, ood_batches=ood_batches, progress=report, gather=_gather()
            )
    return {"score": score}, {
        "ratio": cfg.ratio,
        "keep_per_layer": keep,
        "kept_heads": kept,
        "objective": "ood" if ood is not None else "nll",
        "evaluations": total,
        **calibration,
    }


def _lowest_loss_batches(
    loaded: Any, data: Any, cfg: ScoreConfig
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """HeadMap's calibration set: of a pool (all of --data, or a seeded `calib_pool` subset),
    the `calib_size` examples with the lowest loss under the full model."""
    import numpy as np

    from uqcompress.methods import scoring

    pool_size = len(data) if cfg.calib_pool is None else min(cfg.calib_pool, len(data))
    if pool_size == len(data):
        pool = np.arange(pool_size)
    else:
        pool = np.sort(np.random.default_rng(cfg.seed).choice(len(data), pool_size, replace=False))
    # HeadMap is not data-parallel: every process picks from the whole pool (same result)
    losses = scoring.example_losses(loaded, _encoded_batches(loaded, data, pool, cfg, False))
    chosen = scoring.lowest_loss(losses, cfg.calib_size)
    picked = losses[chosen]
    info = {
        "calibration_set": "lowest-loss",
        "calibration_pool": int(pool_size),
        "calibration_loss_max": round(float(picked.max()), 6),
        "pool_loss_mean": round(float(losses.mean()), 6),
    }
    return _encoded_batches(loaded, data, pool[chosen], cfg, False), info


def _as_index_labels(data: Any) -> Any:
    """OOD sets get class-index 0 labels so they pass label mapping; the labels are unused."""
    from dataclasses import replace

    return replace(data, labels=[0] * len(data), label_names=None)
