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

METHODS = ("taylor", "hies", "circuit", "random", "l2")
NEEDS_DATA = ("taylor", "hies", "circuit")
SCORES_FILE = "scores.safetensors"


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
    batch_size: int = 16
    max_length: int | None = None
    text_column: str = fields.runtime("text")
    label_column: str = fields.runtime("label")
    device: str = fields.device()
    threads: int | None = fields.threads()

    def validate(self) -> None:
        problems = fields.problems(self)
        if self.method not in METHODS:
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
        if self.method == "circuit":
            if self.ratio is None:
                problems.add(
                    "--method circuit searches for a head budget: pass --ratio",
                    hint="e.g. --ratio 0.5 (the same ratio prune will use)",
                )
            elif not 0.0 <= self.ratio < 1.0:
                problems.add(
                    f"--ratio {self.ratio} is outside [0, 1)", hint="pass e.g. --ratio 0.5"
                )
        elif self.ood:
            problems.add(
                "--ood is used by --method circuit only", hint="drop --ood, or use --method circuit"
            )
        problems.raise_any()


def run(
    model_path: Path, cfg: ScoreConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.data import load_data
    from uqcompress.models.loading import refuse_fused, resolve_model_source

    cfg.validate()
    source = resolve_model_source(model_path)
    refuse_fused(source, "score")
    data = (
        load_data(cfg.data, cfg.text_column, cfg.label_column)
        if cfg.method in NEEDS_DATA and cfg.data
        else None
    )
    ood = (
        load_data(cfg.ood, cfg.text_column, cfg.label_column, require_labels=False)
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
        id_config=fields.id_config(cfg, config),
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


def _calibration_batches(loaded: Any, data: Any, cfg: ScoreConfig) -> list[dict[str, Any]]:
    """A seeded subset of `calib_size` labelled examples, encoded once, in fixed batches.

    In a multi-process launch this process gets its contiguous shard of those batches (whole
    batches, the same ones a single process runs: Taylor's |gradient| is taken per batch);
    the scorers add up what every process computed (`_gather`).
    """
    import numpy as np

    from uqcompress.data.dataset import LabeledData
    from uqcompress.data.encoding import check_input_kind, collate, encode
    from uqcompress.data.labels import map_labels
    from uqcompress.runtime.distributed import rank_device, shard_bounds

    check_input_kind(data, loaded.input_kind, loaded.family.name)
    ids = map_labels(data, loaded.labels, placeholder=False).ids
    count = min(cfg.calib_size, len(data))
    pick = np.sort(np.random.default_rng(cfg.seed).choice(len(data), count, replace=False))
    subset = LabeledData(
        spec=data.spec,
        input_kind=data.input_kind,
        fingerprint=data.fingerprint,
        labels=[data.labels[i] for i in pick] if data.labels is not None else None,
        texts=[data.texts[i] for i in pick] if data.texts is not None else None,
        images=data.images[pick] if data.images is not None else None,
    )
    encoded = encode(subset, loaded, ids[pick], cfg.max_length)
    device = rank_device(cfg.device)
    starts = list(range(0, count, cfg.batch_size))
    first, last = shard_bounds(len(starts))
    return [
        {
            k: v.to(device)
            for k, v in collate(encoded, list(range(i, min(count, i + cfg.batch_size)))).items()
        }
        for i in starts[first:last]
    ]


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
    batches = _calibration_batches(loaded, data, cfg)
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

    with Progress(console=stderr, transient=True) as progress:
        task = progress.add_task("circuit search", total=None)

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        score, kept = scoring.circuit_scores(
            loaded, batches, keep, ood_batches=ood_batches, progress=report, gather=_gather()
        )
    return {"score": score}, {
        "ratio": cfg.ratio,
        "keep_per_layer": keep,
        "kept_heads": kept,
        "objective": "ood" if ood is not None else "nll",
    }


def _as_index_labels(data: Any) -> Any:
    """OOD sets get class-index 0 labels so they pass label mapping; the labels are unused."""
    from dataclasses import replace

    return replace(data, labels=[0] * len(data), label_names=None)
