"""`uqc eval`: accuracy and uncertainty quality of one model or a deep ensemble of several."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.errors import ConfigError, IncompatibleInputError
from uqcompress.steps.common import StepResult, build_or_reuse

RUNTIME_KEYS = ("device", "threads", "batch_size")
ECE_BINS = 15


@dataclass(frozen=True)
class EvalConfig:
    data: str
    batch_size: int = 64
    max_length: int | None = None
    text_column: str = "text"
    label_column: str = "label"
    device: str = "cpu"
    threads: int = 1


def run(
    model_paths: list[Path], cfg: EvalConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.data import load_data
    from uqcompress.models.loading import resolve_model_source

    if not model_paths:
        raise ConfigError("no model to evaluate", hint="pass one or more MODEL paths")
    if cfg.batch_size < 1:
        raise ConfigError(
            f"--batch-size {cfg.batch_size} must be at least 1", hint="pass --batch-size 64"
        )
    sources = [
        resolve_model_source(p, role="model" if len(model_paths) == 1 else f"member{i}")
        for i, p in enumerate(model_paths)
    ]
    data = load_data(cfg.data, cfg.text_column, cfg.label_column)
    config = {**asdict(cfg), "members": len(sources)}
    plan = OutputPlan(
        kind="eval",
        step="eval",
        config=config,
        id_config={k: v for k, v in config.items() if k not in RUNTIME_KEYS},
        inputs=[s.ref for s in sources],
        data=[data.manifest_entry("eval")],
        device=cfg.device,
    )

    def build(writer: ArtifactWriter) -> None:
        from uqcompress.data.encoding import encode
        from uqcompress.data.labels import map_labels
        from uqcompress.inference import predict_logits
        from uqcompress.models.loading import load_model
        from uqcompress.uq.metrics import classification_metrics, reliability_bins

        member_logits: list[np.ndarray] = []
        seconds = 0.0
        parameters = 0
        labels: list[str] | None = None
        label_ids = None
        for source in sources:
            loaded = load_model(source)
            if labels is None:
                labels = loaded.labels
                label_ids = map_labels(data, labels, placeholder=False).ids
            elif loaded.labels != labels:
                raise IncompatibleInputError(
                    f"ensemble members disagree on labels: {source.path} has "
                    f"{loaded.labels}, the first member has {labels}",
                    hint="ensemble only models trained on the same label set",
                )
            assert label_ids is not None
            encoded = encode(data, loaded, label_ids, cfg.max_length)
            if encoded.truncated and source is sources[0]:
                writer.warn(f"{encoded.truncated} texts were truncated to the max length")
            prediction = predict_logits(loaded.model, encoded, cfg.batch_size, cfg.device)
            member_logits.append(prediction.logits)
            seconds += prediction.seconds
            parameters += loaded.num_parameters()
        assert label_ids is not None and labels is not None
        stacked = np.stack(member_logits, axis=1)  # [N, M, C]
        probs = _mean_softmax(stacked)  # [N, C]
        metrics: dict[str, Any] = classification_metrics(probs, label_ids)
        n = len(label_ids)
        metrics.update(
            {
                "latency_ms": 1000.0 * seconds / n,
                "parameters": parameters,
                "members": len(sources),
                "examples": n,
            }
        )
        bins = reliability_bins(probs, label_ids, n_bins=ECE_BINS)
        (writer.dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        (writer.dir / "reliability.json").write_text(
            json.dumps({k: _jsonable(v) for k, v in bins.items()}, indent=2) + "\n"
        )
        writer.extra_config["labels"] = labels
        writer.summary.update(metrics)

    return build_or_reuse(plan, out, force, build)


def _mean_softmax(logits: np.ndarray) -> np.ndarray:
    """Shape: `[N, M, C]` -> `[N, C]`, the mean of member softmaxes."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted.astype(np.float64))
    return (exp / exp.sum(axis=-1, keepdims=True)).mean(axis=1)


def _jsonable(values: np.ndarray) -> list[float | None]:
    return [None if np.isnan(v) else float(v) for v in values]
