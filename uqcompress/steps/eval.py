"""`uqc eval`: accuracy, calibration, selective prediction and OOD detection of one model, an
exported ONNX model, or a deep ensemble of several."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.errors import ConfigError, DataError, IncompatibleInputError
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse

ECE_BINS = 15
RELIABILITY_PLOT = "reliability.png"
OOD_PLOT = "ood_scores.png"
SCORES_FILE = "uncertainty_scores.safetensors"  # each example's scores, for `uqc compare`


@dataclass(frozen=True)
class EvalConfig:
    # runtime: runtime settings and data spec strings (content fingerprints are in the id;
    # OOD set *names* stay in, since metric keys are built from them). A reused eval keeps
    # the latency it measured when it was built.
    data: str = fields.runtime(
        help="Labelled data: builtin:NAME\\[@split], FILE.csv, a "
        "folder or hf:NAME\\[/CONFIG]@SPLIT."
    )
    ood: list[str] = fields.option(
        kind=list[str],
        parse=lambda v: list(v or []),
        is_runtime=True,
        default_factory=list,
        help="Out-of-distribution data (repeatable), e.g. "
        "builtin:photo-patches; labels not needed. Adds ood.<set>.<score>.* metrics.",
    )
    gate: str | None = fields.described(
        None,
        help='Quality bounds, e.g. "acc>=0.9,ece<=0.05": exit 3 if one '
        "fails (the artifact is still written).",
    )
    samples: int | None = fields.described(
        None,
        help="DIRECTOR students, MC Dropout models: samples per input (default: the stored S).",
    )  # DIRECTOR, MC Dropout: samples per input (default: stored S)
    # DIRECTOR, MC Dropout: samples per pass (None: sized to memory); memory and speed only
    sample_chunk: int | None = fields.runtime(
        None,
        help="DIRECTOR students, MC Dropout models: samples run per pass (memory and "
        "speed only, the same "
        "result). Default: as many as fit 16384 tokens (sequences x length) per pass.",
    )
    batch_size: int = fields.runtime(64)
    max_length: int | None = None
    text_column: str = fields.runtime("text")
    label_column: str = fields.runtime("label")
    text_pair_column: str | None = fields.runtime(None)
    device: str = fields.device()
    threads: int | None = fields.threads()
    workers: int = fields.workers()
    dtype: str = fields.dtype()

    def validate(self) -> None:
        fields.problems(self).raise_any()  # non-finite numbers, choices, bounds


def run(
    model_paths: list[Path], cfg: EvalConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.data import load_data
    from uqcompress.engine.sources import peek_source
    from uqcompress.uq import numerics_tags
    from uqcompress.uq.quality_gates import known_metrics, parse_gate

    if not model_paths:
        raise ConfigError("no model to evaluate", hint="pass one or more MODEL paths")
    cfg.validate()
    roles = ["model"] if len(model_paths) == 1 else [f"member{i}" for i in range(len(model_paths))]
    peeked = [peek_source(p, role) for p, role in zip(model_paths, roles, strict=True)]
    ids = [ref.id for ref, _ in peeked]
    duplicates = sorted({p.name for p, i in zip(model_paths, ids, strict=True) if ids.count(i) > 1})
    if duplicates:
        raise IncompatibleInputError(
            f"the same model is given more than once ({', '.join(duplicates)}); an ensemble "
            "of identical members measures nothing",
            hint="pass each ensemble member once",
        )
    members = sum(m for _, m in peeked)
    cfg = _planned_dtype(cfg, model_paths)
    if cfg.samples is not None and len(peeked) == 1:
        members = cfg.samples  # a DIRECTOR or MC Dropout model evaluated with another S
    data = load_data(
        cfg.data, cfg.text_column, cfg.label_column, text_pair_column=cfg.text_pair_column
    )
    ood_sets = [
        load_data(
            s,
            cfg.text_column,
            cfg.label_column,
            require_labels=False,
            text_pair_column=cfg.text_pair_column,
        )
        for s in cfg.ood
    ]
    names = [d.name for d in ood_sets]
    if len(set(names)) != len(names):
        raise DataError(
            f"--ood sets share a name ({', '.join(names)})",
            hint="give each OOD file a distinct file name",
        )
    from uqcompress.engine.sources import peek_calibration

    calibration = peek_calibration(model_paths[0]) if len(model_paths) == 1 else None
    known = known_metrics(
        names,
        members,
        calibrated=calibration is not None,
        abstains=bool(calibration and calibration.get("abstain")),
    )
    bounds = parse_gate(cfg.gate, known) if cfg.gate else []
    config = {**asdict(cfg), "members": members, "ood_names": names}
    plan = OutputPlan(
        kind="eval",
        step="eval",
        config=config,
        # numerics_tags: the uncertainty definition and DIRECTOR's noise scheme change the
        # numbers without changing the config, so they are in the id too.
        id_config={**fields.id_config(cfg, config), **numerics_tags()},
        inputs=[ref for ref, _ in peeked],
        data=[data.manifest_entry("eval")] + [d.manifest_entry(f"ood:{d.name}") for d in ood_sets],
        device=cfg.device,
    )

    def build(writer: ArtifactWriter) -> None:
        from uqcompress.data.labels import map_labels
        from uqcompress.engine.sources import predict_sharded
        from uqcompress.export.source import open_source
        from uqcompress.runtime.distributed import is_main_process, rank_device
        from uqcompress.uq import metrics as m
        from uqcompress.uq.plots import save_ood_histograms, save_reliability_diagram
        from uqcompress.uq.quality_gates import evaluate_gate

        device = rank_device(cfg.device)  # this process's GPU under torchrun
        sources = [
            open_source(p, role, device, cfg.threads, cfg.samples, cfg.sample_chunk, cfg.dtype)
            for p, role in zip(model_paths, roles, strict=True)
        ]
        for source in sources:
            source.workers = cfg.workers
        labels = sources[0].labels
        for source in sources[1:]:
            if source.labels != labels:
                raise IncompatibleInputError(
                    f"ensemble members disagree on labels: {source.path} has "
                    f"{source.labels}, the first member has {labels}",
                    hint="ensemble only models trained on the same label set",
                )
        from uqcompress.data.encoding import check_input_kind

        for each in [data, *ood_sets]:
            check_input_kind(each, sources[0].input_kind, str(model_paths[0]))
        label_ids = map_labels(data, labels, placeholder=False).ids
        # Batch by batch into the arrays the metrics need; in a multi-process launch each
        # process runs its shard and rank 0 gets every example, in order (None elsewhere).
        gathered = predict_sharded(sources, data, cfg.batch_size, cfg.max_length)
        ood_gathered = {
            ood.name: predict_sharded(sources, ood, cfg.batch_size, cfg.max_length)
            for ood in ood_sets
        }
        if not is_main_process():  # it computed its shard; rank 0 writes the artifact
            return
        for spec, got in [
            (data.spec, gathered),
            *((o.spec, ood_gathered[o.name]) for o in ood_sets),
        ]:
            if got is None:
                raise DataError(f"{spec} has no examples", hint="pass a non-empty data set")
        assert gathered is not None
        outputs = gathered
        truncated = outputs.truncated
        if truncated:
            writer.summary["truncated"] = truncated
            writer.warn(f"{truncated} texts were truncated to the max length")
        member_probs = m.softmax(outputs.member_logits)  # [N, M, C]
        probs = outputs.probs
        metrics: dict[str, Any] = m.classification_metrics(probs, label_ids)
        # ranked by 1 - confidence from the logits in float64 (float32 probs tie at 1.0)
        residual = m.confidence_residual(outputs.member_logits, np.argmax(probs, axis=1))
        metrics["aurc"] = m.aurc(probs, label_ids, residual)
        if outputs.member_logits.shape[1] > 1:
            metrics["disagreement"] = m.disagreement(member_probs)
            metrics.update(m.uncertainty_means(member_probs))
        n = len(label_ids)
        metrics.update(
            {
                # model only (warm: the first batch run once untimed), the same on torch
                # and ONNX; end to end with reading, tokenising and preprocessing
                "latency_ms": 1000.0 * outputs.seconds / n,
                "latency_e2e_ms": 1000.0 * outputs.e2e_seconds / n,
                "latency_batch_size": cfg.batch_size,
                "latency_threads": _threads(cfg.threads),
                "parameters": sum(s.parameters for s in sources),
                "members": int(outputs.member_logits.shape[1]),
                "examples": n,
            }
        )
        calibration = sources[0].calibration if len(sources) == 1 else None
        if calibration is not None:
            metrics.update(_calibration_metrics(calibration, outputs, label_ids))
        in_scores = m.uncertainty_scores(member_probs)
        ood_scores: dict[str, dict[str, np.ndarray]] = {}
        for ood in ood_sets:
            ood_out = ood_gathered[ood.name]
            assert ood_out is not None
            scores = m.uncertainty_scores(m.softmax(ood_out.member_logits))
            ood_scores[ood.name] = scores
            for score, values in scores.items():
                for key, value in m.ood_detection(in_scores[score], values).items():
                    metrics[f"ood.{ood.name}.{score}.{key}"] = value
        bins = m.reliability_bins(probs, label_ids, n_bins=ECE_BINS)
        per_class = dict(zip(labels, m.per_class_accuracy(probs, label_ids), strict=True))
        (writer.dir / "metrics.json").write_text(
            json.dumps({**metrics, "per_class_accuracy": per_class}, indent=2) + "\n"
        )
        (writer.dir / "reliability.json").write_text(
            json.dumps({k: _jsonable(v) for k, v in bins.items()}, indent=2) + "\n"
        )
        model_name = display_name(model_paths)
        save_reliability_diagram(bins, writer.dir / RELIABILITY_PLOT, model_name, data.spec)
        write_scores(writer.dir / SCORES_FILE, in_scores, ood_scores)
        if ood_scores:
            save_ood_histograms(in_scores, ood_scores, writer.dir / OOD_PLOT, model_name, data.spec)
        writer.extra_config["labels"] = labels
        writer.summary.update(metrics)
        if bounds:
            writer.summary["gate"] = evaluate_gate(bounds, metrics)

    return build_or_reuse(plan, out, force, build)


def _planned_dtype(cfg: EvalConfig, model_paths: list[Path]) -> EvalConfig:
    """`--dtype` as the torch models will load (`auto` resolved by the first one; an ONNX
    export computes in its own graph's types, so it leaves float32 in the id)."""
    from dataclasses import replace

    from uqcompress.artifacts import MANIFEST_NAME
    from uqcompress.artifacts.reader import read_manifest
    from uqcompress.models.loading import resolve_model_source
    from uqcompress.steps.common import with_planned_dtype

    first = model_paths[0]
    if (first / MANIFEST_NAME).is_file() and read_manifest(first).kind in ("onnx", "members"):
        return replace(cfg, dtype="float32" if cfg.dtype == "auto" else cfg.dtype)
    planned: EvalConfig = with_planned_dtype(cfg, resolve_model_source(first))
    return planned


def display_name(model_paths: list[Path]) -> str:
    """How plots name the model: its directory's name; a deep ensemble's first member's
    and how many more."""
    names = [Path(p).resolve().name for p in model_paths]
    return names[0] if len(names) == 1 else f"{names[0]} + {len(names) - 1} more"


def write_scores(
    path: Path, in_scores: dict[str, np.ndarray], ood_scores: dict[str, dict[str, np.ndarray]]
) -> None:
    """Keep each example's uncertainty scores (float32 safetensors: `in/<score>` and
    `ood/<set>/<score>`) so `uqc compare` can draw the histograms from numbers.

    Shape:
        - in_scores: score -> ``[N]``; ood_scores: set -> score -> ``[N_set]``.
    """
    from safetensors.numpy import save_file

    tensors = {f"in/{k}": np.ascontiguousarray(v, np.float32) for k, v in in_scores.items()}
    for set_name, scores in ood_scores.items():
        for k, v in scores.items():
            tensors[f"ood/{set_name}/{k}"] = np.ascontiguousarray(v, np.float32)
    save_file(tensors, str(path))


def read_scores(path: Path) -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """What `write_scores` wrote: (in-distribution scores, OOD set -> scores)."""
    from safetensors.numpy import load_file

    in_scores: dict[str, np.ndarray] = {}
    ood_scores: dict[str, dict[str, np.ndarray]] = {}
    for key, values in load_file(str(path)).items():
        if key.startswith("in/"):
            in_scores[key[3:]] = values
        elif key.startswith("ood/"):
            set_name, score = key[4:].rsplit("/", 1)
            ood_scores.setdefault(set_name, {})[score] = values
    return in_scores, ood_scores


def _threads(threads: int | None) -> int:
    """The intra-op threads the model ran with: `--threads` as resolved, else torch's."""
    if threads is not None:
        return threads
    import torch

    return int(torch.get_num_threads())


def _jsonable(values: np.ndarray) -> list[float | None]:
    return [None if np.isnan(v) else float(v) for v in values]


def _calibration_metrics(calibration: Any, outputs: Any, label_ids: np.ndarray) -> dict[str, Any]:
    """A calibrated model (uqc calibrate): its temperature, NLL and ECE without it (the
    logits times T), and with an abstention rule the coverage and risk it reaches here."""
    from uqcompress.uq import metrics as m
    from uqcompress.uq.calibration import abstain_scores, abstains, selective_risk

    raw_probs = m.softmax(outputs.member_logits * calibration.temperature).mean(axis=1)
    result: dict[str, Any] = {
        "temperature": calibration.temperature,
        "nll_uncalibrated": m.nll(raw_probs, label_ids),
        "ece_uncalibrated": m.ece(raw_probs, label_ids, n_bins=ECE_BINS),
    }
    rule = calibration.abstain
    if rule is not None:
        scores = abstain_scores(outputs.probs, outputs.entropy, outputs.mutual_info)
        coverage, risk = selective_risk(outputs.probs, label_ids, ~abstains(rule, scores))
        result["abstain_coverage"] = coverage
        result["abstain_risk"] = risk
    return result


def check_gate(result: StepResult) -> None:
    """Exit 3 when the eval's --gate failed; the artifact is written all the same."""
    verdict = result.artifact.manifest.summary.get("gate")
    if verdict is not None and not verdict["passed"]:
        from uqcompress.errors import QualityGateError
        from uqcompress.uq.quality_gates import describe_failures

        raise QualityGateError(
            f"quality gate failed: {describe_failures(verdict)}",
            hint=f"see uqc inspect {result.artifact.path} (written), or revisit the bound",
        )
