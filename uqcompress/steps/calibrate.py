"""`uqc calibrate`: a temperature (and optionally an abstention threshold) fitted on held-out
data, written into a new model artifact; the input is never edited.

`eval`, `export` (in the graph), the Predictor and `predict` apply what is stored here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.errors import ConfigError
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse, with_planned_dtype

ECE_BINS = 15


@dataclass(frozen=True)
class CalibrateConfig:
    # runtime: the data's content fingerprints are in the id; batches do not change the fit
    data: str = fields.runtime(
        help="Held-out labelled data (not the training data): builtin:NAME\\[@split], "
        "FILE.csv, a folder or hf:NAME\\[/CONFIG]@SPLIT."
    )
    abstain_coverage: float | None = fields.described(
        None,
        help="Also fit an uncertainty threshold that answers this fraction of --data, "
        "e.g. 0.9; predict and the Predictor then return abstain: true|false.",
    )
    abstain_score: str = fields.described(
        "msp",
        help="Uncertainty the threshold applies to: msp (1 - max probability), entropy, "
        "or mi (ensembles).",
    )
    batch_size: int = fields.runtime(64)
    max_length: int | None = None
    text_column: str = fields.runtime("text")
    label_column: str = fields.runtime("label")
    text_pair_column: str | None = fields.runtime(None)
    device: str = fields.device()
    threads: int | None = fields.threads()
    # the logits the temperature is fitted to; the calibrated model is saved in it too
    dtype: str = fields.dtype()
    workers: int = fields.workers()

    def validate(self) -> None:
        from uqcompress.uq.calibration import ABSTAIN_SCORES

        problems = fields.problems(self)
        coverage = self.abstain_coverage
        if coverage is not None and not 0 < coverage <= 1:
            problems.add(
                f"--abstain-coverage {coverage} must be in (0, 1]: the fraction of examples "
                "the model answers",
                hint="pass e.g. --abstain-coverage 0.9 to answer 90% and abstain on the rest",
            )
        if self.abstain_score not in ABSTAIN_SCORES:
            problems.add(
                f"unknown --abstain-score {self.abstain_score!r}",
                hint=f"use one of: {', '.join(ABSTAIN_SCORES)}",
            )
        problems.raise_any()


def run(
    model_path: Path, cfg: CalibrateConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.artifacts import MANIFEST_NAME, read_manifest
    from uqcompress.data import load_data
    from uqcompress.models.loading import resolve_model_source
    from uqcompress.uq import numerics_tags

    cfg.validate()
    if (Path(model_path) / MANIFEST_NAME).is_file():
        kind = read_manifest(Path(model_path)).kind
        if kind != "model":
            raise ConfigError(
                f"{model_path} is {'an' if kind[0] in 'aeio' else 'a'} {kind} artifact; "
                "uqc calibrate takes a model",
                hint="calibrate the model, then export it (the temperature goes into the graph)"
                if kind == "onnx"
                else "pass a model artifact (uqc fuse makes one model of a members artifact)",
            )
    source = resolve_model_source(model_path)
    cfg = with_planned_dtype(cfg, source)
    data = load_data(
        cfg.data, cfg.text_column, cfg.label_column, text_pair_column=cfg.text_pair_column
    )
    config = asdict(cfg)
    # numerics_tags: the uncertainty definition and DIRECTOR's noise scheme change the fitted
    # numbers without changing the config, so they are in the id too.
    id_config = fields.id_config(cfg, config) | numerics_tags()
    if cfg.abstain_coverage is None:
        id_config.pop("abstain_score")  # unused: must not change the id
    plan = OutputPlan(
        kind="model",
        step="calibrate",
        config=config,
        id_config=id_config,
        inputs=[source.ref],
        data=[data.manifest_entry("calibration")],
        device=cfg.device,
    )

    def build(writer: ArtifactWriter) -> None:
        _calibrate_into(model_path, data, cfg, writer)

    return build_or_reuse(plan, out, force, build)


def _calibrate_into(model_path: Path, data: Any, cfg: CalibrateConfig, writer: Any) -> None:
    import numpy as np

    from uqcompress.data.encoding import check_input_kind
    from uqcompress.data.labels import map_labels
    from uqcompress.engine.sources import TorchSource
    from uqcompress.models.loading import save_model
    from uqcompress.models.summary import model_summary
    from uqcompress.runtime.console import stderr, user
    from uqcompress.uq import calibration as cal
    from uqcompress.uq import metrics as m
    from uqcompress.uq.functional import as_deployed

    source = TorchSource(model_path, "model", cfg.device, dtype=cfg.dtype)
    source.workers = cfg.workers
    check_input_kind(data, source.input_kind, str(model_path))
    label_ids = map_labels(data, source.labels, placeholder=False).ids
    if cfg.abstain_coverage is not None and cfg.abstain_score == "mi" and source.members < 2:
        raise ConfigError(
            f"--abstain-score mi needs an ensemble; {model_path} has one member",
            hint="use --abstain-score msp or entropy",
        )
    previous = source.calibration
    source.calibration = None  # refitting starts from the model's own (uncalibrated) logits
    outputs = source.predict(data, cfg.batch_size, cfg.max_length)  # NonFiniteError if NaN
    # After the forward pass: a model that cannot be calibrated gets its error line alone.
    stderr.print(f"[dim]calibrating on {len(label_ids)} examples of {user(data.spec)}...[/dim]")
    raw_logits = outputs.member_logits.astype(np.float64)
    if previous is not None:
        writer.warn(
            f"{model_path} was calibrated already (temperature "
            f"{previous.temperature:.4g}); refitted from its uncalibrated logits"
        )
    temperature = cal.fit_temperature(raw_logits, label_ids)
    if temperature in (cal.MIN_TEMPERATURE, cal.MAX_TEMPERATURE):
        writer.warn(
            f"the temperature hit its bound ({temperature:g}): the calibration data may be "
            "too small or too easy (every example right with a wide margin)"
        )
    before = m.softmax(raw_logits).mean(axis=1)
    # As every consumer computes them (float32 logits / float32 T, then the graph's own
    # float32 uncertainty functions), so the threshold fitted here splits the same scores
    # the same way in the Predictor and in `predict`.
    calibrated = raw_logits.astype(np.float32) / np.float32(temperature)
    deployed = as_deployed(calibrated)  # probs, entropy, mutual_info: float32
    after = m.softmax(calibrated.astype(np.float64)).mean(axis=1)
    summary: dict[str, Any] = {
        "temperature": temperature,
        "calibration_examples": len(label_ids),
        "nll_before": m.nll(before, label_ids),
        "nll_after": m.nll(after, label_ids),
        "ece_before": m.ece(before, label_ids, n_bins=ECE_BINS),
        "ece_after": m.ece(after, label_ids, n_bins=ECE_BINS),
        "acc": m.accuracy(after, label_ids),
    }
    rule = None
    if cfg.abstain_coverage is not None:
        scores = cal.abstain_scores(*deployed)  # exactly as the Predictor scores
        threshold = cal.fit_abstain_threshold(scores[cfg.abstain_score], cfg.abstain_coverage)
        rule = cal.AbstainRule(
            score=cfg.abstain_score, threshold=threshold, coverage=cfg.abstain_coverage
        )
        coverage, risk = cal.selective_risk(after, label_ids, ~cal.abstains(rule, scores))
        summary.update(
            {
                "abstain_score": rule.score,
                "abstain_threshold": threshold,
                "abstain_coverage_target": cfg.abstain_coverage,
                "abstain_coverage": coverage,
                "abstain_risk": risk,
                "risk_full_coverage": 1.0 - summary["acc"],
            }
        )
    loaded = source.loaded
    loaded.calibration = cal.Calibration(temperature=temperature, abstain=rule)
    save_model(loaded, writer.dir, keep_calibration=True)
    writer.summary.update(model_summary(loaded))
    writer.summary["calibration"] = loaded.calibration.to_dict()
    writer.summary.update(summary)
    _print_report(summary)


def _print_report(summary: dict[str, Any]) -> None:
    from rich.table import Table

    from uqcompress.runtime.console import stderr

    table = Table(title=f"calibration: temperature {summary['temperature']:.4f}")
    for column in ("", "before", "after"):
        table.add_column(column, justify="right" if column else "left")
    table.add_row("NLL", f"{summary['nll_before']:.4f}", f"{summary['nll_after']:.4f}")
    table.add_row("ECE", f"{summary['ece_before']:.4f}", f"{summary['ece_after']:.4f}")
    stderr.print(table)
    if "abstain_threshold" in summary:
        stderr.print(
            f"abstain when {summary['abstain_score']} > {summary['abstain_threshold']:.4g}: "
            f"answers {summary['abstain_coverage']:.1%} of the calibration data, error rate "
            f"{summary['abstain_risk']:.4f} among them (all answered: "
            f"{summary['risk_full_coverage']:.4f})"
        )
