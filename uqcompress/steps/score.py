"""`uqc score`: attention-head importance, `[L, H]`, as a scores artifact."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.errors import DataError
from uqcompress.methods.scoring import registry
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse, with_planned_dtype

SCORES_FILE = "scores.safetensors"
SEARCHING = ", ".join(registry.searching())  # the scorers --ood and --ratio are for


@dataclass(frozen=True)
class ScoreConfig:
    method: str = fields.described("hies", help=registry.method_help())
    # runtime: the data's content fingerprints are in the id instead
    data: str | None = fields.runtime(
        None, help=f"Labelled calibration data ({', '.join(registry.needing_data())})."
    )
    calib_size: int = fields.described(32, help="Calibration examples (a seeded subset).")
    alpha: float = fields.described(0.5, help="HIES weight of importance vs attention entropy.")
    his_abs: str = fields.described(
        "sample", help="HIES: |.| per sample (as defined) or per batch."
    )
    norm_scope: str = fields.described("global", help="HIES min-max scope: global or layer.")
    taylor_layer_l2: bool = fields.described(
        False, help="Taylor: divide each layer by its L2 norm."
    )
    taylor_minmax: bool = fields.described(False, help="Taylor: then min-max over all heads.")
    ood: str | None = fields.runtime(
        None,
        help=f"{SEARCHING}: OOD data for the uncertainty objective (AUROC - NLL / ln C; ours).",
    )
    ratio: float | None = fields.described(
        None,
        help=f"{SEARCHING}: fraction of heads per layer to remove (the search keeps the rest).",
    )
    members: int = fields.described(
        1,
        help="Score sets, each on its own seeded calibration subset "
        "(seed + m), for M ensemble members.",
    )
    seed: int = 0
    # headmap: the examples whose lowest-loss `calib_size` are kept (None: all of --data)
    calib_pool: int | None = fields.added(
        None,
        help="headmap: examples (a seeded subset of --data; default all of it) whose "
        "--calib-size lowest-loss ones are the calibration set, as HeadMap picks them. "
        "Needed with --members (member m draws its pool with seed + m).",
    )
    batch_size: int = 16
    max_length: int | None = None
    text_column: str = fields.runtime("text")
    label_column: str = fields.runtime("label")
    text_pair_column: str | None = fields.runtime(None)
    device: str = fields.device()
    threads: int | None = fields.threads()
    workers: int = fields.workers()
    dtype: str = fields.dtype()

    def validate(self) -> None:
        problems = fields.problems(self)
        scorer = registry.find(self.method)
        if scorer is None:
            problems.add(
                f"unknown --method {self.method!r}",
                hint=f"use one of: {', '.join(registry.names())}",
            )
        if scorer is not None and scorer.needs_data and not self.data:
            problems.add(
                f"--method {self.method} needs --data (calibration examples)",
                hint="pass --data, e.g. --data builtin:digits@train",
            )
        if scorer is not None and scorer.searched:
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
            searching = registry.searching()
            problems.add(
                f"--ood is used by --method {' and '.join(searching)} only",
                hint=f"drop --ood, or use --method {searching[0]}",
            )
        options = asdict(self)
        for owner in registry.SCORERS:  # options only one scorer reads, given to another
            for name, why in owner.own_options.items():
                if options[name] is not None and owner is not scorer:
                    flag = fields.flag(name)
                    problems.add(
                        f"{flag} is used by --method {owner.name} only ({why})",
                        hint=f"drop {flag}, or use --method {owner.name}",
                    )
        if scorer is not None and scorer.check is not None:
            scorer.check(options, problems)
        problems.raise_any()


def run(
    model_path: Path, cfg: ScoreConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.data import load_data
    from uqcompress.models.loading import refuse_fused, resolve_model_source

    cfg.validate()
    scorer = registry.find(cfg.method)
    assert scorer is not None  # validate() refused an unknown method
    if cfg.method != scorer.name:  # an old name
        from dataclasses import replace

        from uqcompress.runtime.console import stderr

        note = f" ({scorer.alias_note})" if scorer.alias_note else ""
        stderr.print(
            f"[yellow]warning: --method {cfg.method} is now called {scorer.name}{note}; "
            f"{cfg.method} still works[/yellow]"
        )
        cfg = replace(cfg, method=scorer.name)
    source = resolve_model_source(model_path)
    refuse_fused(source, "score")
    cfg = with_planned_dtype(cfg, source)
    data = (
        load_data(
            cfg.data, cfg.text_column, cfg.label_column, text_pair_column=cfg.text_pair_column
        )
        if scorer.needs_data and cfg.data
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
        # a scorer whose definition changed adds keys, so an earlier artifact is not reused
        id_config={**fields.id_config(cfg, config), **scorer.id_config},
        inputs=[source.ref],
        data=entries,
        device=cfg.device,
    )

    def build(writer: ArtifactWriter) -> None:
        from safetensors.torch import save_file

        from uqcompress.methods.scoring.common import head_counts
        from uqcompress.models.loading import load_model
        from uqcompress.runtime.distributed import rank_device

        loaded = load_model(source, cfg.dtype)
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
                "dtype": loaded.dtype,
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
    """The scorer's tensors and summary additions for one score set (its seed: `cfg.seed`)."""
    from uqcompress.methods.scoring.scorer import ScoreRequest
    from uqcompress.runtime.console import counter

    scorer = registry.find(cfg.method)
    assert scorer is not None  # validate() refused an unknown method
    request = ScoreRequest(
        loaded=loaded,
        options=asdict(cfg),
        calibration=lambda: _calibration_batches(loaded, data, cfg),
        encode=lambda pick, shard: _encoded_batches(loaded, data, pick, cfg, shard),
        examples=len(data) if data is not None else 0,
        ood=(
            (lambda: _calibration_batches(loaded, _as_index_labels(ood), cfg))
            if ood is not None
            else None
        ),
        gather=_gather(),
        progress=counter,
    )
    tensors, summary = scorer.score(request)
    return tensors, summary


def _as_index_labels(data: Any) -> Any:
    """OOD sets get class-index 0 labels so they pass label mapping; the labels are unused."""
    from dataclasses import replace

    return replace(data, labels=[0] * len(data), label_names=None)
