"""`uqc compare`: several eval artifacts side by side, as tables (Markdown, CSV, JSON) and one
figure with every model's reliability diagram and OOD score histogram."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from uqcompress.artifacts import ArtifactWriter, OutputPlan, SourceRef
from uqcompress.errors import ConfigError, IncompatibleInputError
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse

OOD_SCORE = "entropy"  # every model has it (MI needs M > 1)
BASE_COLUMNS = ("acc", "f1_macro", "mcc", "nll", "ece", "brier", "aurc")
OOD_COLUMNS = ("auroc", "fpr95", "aupr")


def split_names(text: str | None) -> list[str] | None:
    return [n.strip() for n in text.split(",")] if text is not None else None


@dataclass(frozen=True)
class CompareConfig:
    baseline: int = fields.described(
        0, help="Which EVAL (0-based) latency ratios are to."
    )  # index into the EVAL arguments; latency ratios are to this row
    # row names (--names a,b); default: each eval's model directory name
    names: list[str] | None = fields.option(
        None,
        kind=str | None,
        parse=split_names,
        help="Row names, comma-separated (default: each model's directory name).",
    )

    def validate(self) -> None:
        fields.problems(self).raise_any()


@dataclass(frozen=True)
class Row:
    name: str
    metrics: dict[str, Any]


def run(
    eval_paths: list[Path], cfg: CompareConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.artifacts import open_artifact

    if len(eval_paths) < 1:
        raise ConfigError("nothing to compare", hint="pass one or more eval artifacts")
    if not 0 <= cfg.baseline < len(eval_paths):
        raise ConfigError(
            f"--baseline {cfg.baseline} is not one of the {len(eval_paths)} evals (0-based)",
            hint="pass --baseline 0 for the first EVAL",
        )
    if cfg.names is not None and len(cfg.names) != len(eval_paths):
        raise ConfigError(
            f"--names has {len(cfg.names)} names for {len(eval_paths)} evals",
            hint="give one name per EVAL, comma-separated",
        )
    artifacts = [open_artifact(p, expect_kind="eval") for p in eval_paths]
    data = {
        entry["fingerprint"]
        for a in artifacts
        for entry in a.manifest.data
        if entry["role"] == "eval"
    }
    if len(data) > 1:
        raise IncompatibleInputError(
            "these evals scored different test data; their numbers do not compare",
            hint="evaluate every model on the same --data",
        )
    refs = [SourceRef.of(f"eval{i}", a) for i, a in enumerate(artifacts)]
    config = asdict(cfg)
    plan = OutputPlan(kind="compare", step="compare", config=config, id_config=config, inputs=refs)

    def build(writer: ArtifactWriter) -> None:
        rows = [
            Row(name, json.loads(a.file("metrics.json").read_text()))
            for name, a in zip(_names(cfg, artifacts), artifacts, strict=True)
        ]
        table = comparison(rows, cfg.baseline)
        (writer.dir / "comparison.json").write_text(json.dumps(table, indent=2) + "\n")
        (writer.dir / "comparison.md").write_text(to_markdown(table))
        (writer.dir / "comparison.csv").write_text(to_csv(table))
        _figure(artifacts, [r.name for r in rows], writer.dir / "comparison.png")
        writer.summary.update(
            {"models": [r.name for r in rows], "baseline": rows[cfg.baseline].name}
        )

    return build_or_reuse(plan, out, force, build)


def load_table(path: Path) -> dict[str, Any]:
    """The comparison a compare artifact holds."""
    from uqcompress.artifacts import open_artifact

    artifact = open_artifact(path, expect_kind="compare")
    table: dict[str, Any] = json.loads(artifact.file("comparison.json").read_text())
    return table


def _names(cfg: CompareConfig, artifacts: list[Any]) -> list[str]:
    if cfg.names is not None:
        return list(cfg.names)
    names = []
    for artifact in artifacts:
        inputs = [Path(str(ref.path)).name for ref in artifact.manifest.inputs]
        if not inputs:
            names.append(artifact.path.name)
        elif len(inputs) == 1:
            names.append(inputs[0])
        else:  # a deep ensemble of several models
            names.append(f"{inputs[0]} + {len(inputs) - 1} more")
    return names


def comparison(rows: list[Row], baseline: int) -> dict[str, Any]:
    """Columns and one record per model; `latency_ratio` is to the baseline row."""
    from uqcompress.uq.metrics import ood_set_names
    from uqcompress.uq.quality_gates import UNCERTAINTY_METRICS

    sets = ood_set_names(r.metrics for r in rows)
    columns = list(BASE_COLUMNS)
    if any("mi" in r.metrics for r in rows):  # an ensemble: its uncertainty decomposition
        columns += UNCERTAINTY_METRICS
    for name in sets:
        columns += [f"ood.{name}.{OOD_SCORE}.{key}" for key in OOD_COLUMNS]
    columns += ["parameters", "members", "latency_ms", "latency_e2e_ms", "latency_ratio"]
    base_latency = rows[baseline].metrics.get("latency_ms")
    records = []
    for row in rows:
        record: dict[str, Any] = {"model": row.name}
        for column in columns[:-1]:
            record[column] = row.metrics.get(column)
        latency = row.metrics.get("latency_ms")
        record["latency_ratio"] = (
            latency / base_latency if latency is not None and base_latency else None
        )
        records.append(record)
    return {"baseline": rows[baseline].name, "columns": ["model", *columns], "rows": records}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def to_markdown(table: dict[str, Any]) -> str:
    columns = table["columns"]
    lines = [
        "| " + " | ".join(columns) + " |",
        "| " + " | ".join("---" for _ in columns) + " |",
    ]
    for record in table["rows"]:
        lines.append("| " + " | ".join(_cell(record[c]) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def to_csv(table: dict[str, Any]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=table["columns"], lineterminator="\n")
    writer.writeheader()
    for record in table["rows"]:
        writer.writerow({k: "" if v is None else v for k, v in record.items()})
    return buffer.getvalue()


def _figure(artifacts: list[Any], names: list[str], path: Path) -> None:
    """Every model's headline numbers, reliability diagram and OOD histograms in one
    figure, drawn from the eval artifacts' numbers (`uq.compare_plot`)."""
    from uqcompress.steps.eval import SCORES_FILE, read_scores
    from uqcompress.uq.compare_plot import ComparedModel, save_comparison
    from uqcompress.uq.plots import HEADLINE_SCORE

    models = []
    for artifact, name in zip(artifacts, names, strict=True):
        bins_file, scores_file = artifact.path / "reliability.json", artifact.path / SCORES_FILE
        bins = None
        if bins_file.is_file():
            raw = json.loads(bins_file.read_text())
            bins = {k: np.array([np.nan if v is None else v for v in raw[k]]) for k in raw}
        in_entropy, ood_entropy = None, {}
        if scores_file.is_file():  # evals of earlier releases kept no per-example scores
            in_scores, ood_scores = read_scores(scores_file)
            in_entropy = in_scores.get(HEADLINE_SCORE)
            ood_entropy = {
                s: v[HEADLINE_SCORE] for s, v in ood_scores.items() if HEADLINE_SCORE in v
            }
        metrics = json.loads(artifact.file("metrics.json").read_text())
        models.append(ComparedModel(name, metrics, bins, in_entropy, ood_entropy))
    data = next(
        (e.get("spec") or e.get("name") for e in artifacts[0].manifest.data if e["role"] == "eval"),
        "the test data",
    )
    save_comparison(models, str(data), path)
