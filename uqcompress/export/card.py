"""The model card (`README.md`, Hugging Face layout) every export and quantized model writes.

Everything in it comes from the artifacts: the export's own summary (parity or drift, its
latency, its input contract), the manifests up its lineage (base checkpoint, each step with
its settings, data fingerprints, calibration with its abstention coverage and risk) and the
latest `uqc eval` of the exported model found beside it (named, with its data). A number the
artifacts do not hold is not written: a missing section says what would fill it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uqcompress.artifacts.lineage import walk_lineage
from uqcompress.artifacts.manifest import MANIFEST_NAME
from uqcompress.artifacts.reader import load_manifest_json
from uqcompress.errors import UqcError
from uqcompress.export import contract

CARD_FILE = "README.md"
# Evals are looked for among the exported model's siblings; a bounded scan (an artifacts
# folder of thousands of runs must not make an export slow).
MAX_SIBLINGS = 2000
# Settings that say how a step ran, not what it made: left out of the lineage table.
_RUN_ONLY = {
    "device", "threads", "workers", "resume", "checkpoint_every", "text_column",
    "label_column", "text_pair_column", "batch_size", "json",
}  # fmt: skip
_METRICS = (  # (metrics.json key, model-index type, shown as)
    ("acc", "accuracy", "accuracy"),
    ("f1_macro", "f1", "macro F1"),
    ("nll", "nll", "NLL"),
    ("ece", "ece", "ECE (15 bins)"),
    ("brier", "brier", "Brier"),
    ("aurc", "aurc", "AURC"),
)
_METHODS = {  # the step that made a model -> the method it names
    "fuse": "hydra",
    "svd-ensemble": "sve",
    "distill-director": "director",
    "mc-dropout": "mc-dropout",
    "prune": "pruned",
    "finetune": "finetuned",
}


@dataclass
class CardFacts:
    """What the card is written from; `summary` is the new artifact's own summary."""

    step: str  # "export" or "quantize"
    format: str  # "onnx" or "safetensors"
    summary: dict[str, Any]
    source: Path  # the artifact the new one was made from
    metadata: dict[str, str] = field(default_factory=dict)  # the ONNX graph's metadata_props


def graph_metadata(onnx_path: Path) -> dict[str, str]:
    """An ONNX file's metadata_props (the weights are not read)."""
    from uqcompress.export.onnx_file import read_skeleton

    model = read_skeleton(onnx_path)
    return {entry.key: entry.value for entry in model.metadata_props}


def write_model_card(directory: Path, facts: CardFacts) -> Path:
    path = directory / CARD_FILE
    path.write_text(model_card(facts), encoding="utf-8")
    return path


def _manifests(source: Path) -> list[tuple[Any, dict[str, Any]]]:
    """(lineage node, manifest JSON) from the source up to its roots; unreadable ones skipped
    (the lineage table still lists them with their status)."""
    found = []
    for node in walk_lineage(source):
        raw: dict[str, Any] = {}
        if node.status in ("ok", "resealed", "changed"):
            try:
                loaded = load_manifest_json(Path(node.path) / MANIFEST_NAME)
                raw = loaded if isinstance(loaded, dict) else {}
            except UqcError:
                raw = {}
        found.append((node, raw))
    return found


def latest_eval(model: Path, model_id: str) -> tuple[Path, dict[str, Any], dict[str, Any]] | None:
    """The newest eval artifact beside `model` whose only model input is `model_id`:
    (path, its manifest, its metrics.json); None when there is none."""
    best: tuple[str, Path, dict[str, Any]] | None = None
    try:
        siblings = sorted(model.resolve().parent.iterdir())[:MAX_SIBLINGS]
    except OSError:
        return None
    for folder in siblings:
        manifest_path = folder / MANIFEST_NAME
        if not manifest_path.is_file():
            continue
        try:
            raw = load_manifest_json(manifest_path)
        except UqcError:
            continue
        if not isinstance(raw, dict) or raw.get("kind") != "eval":
            continue
        ids = [i.get("id") for i in raw.get("inputs", []) if isinstance(i, dict)]
        if ids != [model_id]:
            continue
        stamp = str(raw.get("created_utc", ""))
        if best is None or stamp > best[0]:
            best = (stamp, folder, raw)
    if best is None:
        return None
    try:
        metrics = json.loads((best[1] / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return best[1], best[2], metrics if isinstance(metrics, dict) else {}


def _yaml(value: Any) -> str:
    """A YAML scalar: JSON's quoting is valid YAML."""
    return json.dumps(value)


def _method(chain: list[tuple[Any, dict[str, Any]]]) -> str:
    for node, raw in chain:
        summary = raw.get("summary") or {}
        if isinstance(summary.get("method"), str):
            return str(summary["method"])
        if node.step in _METHODS:
            return _METHODS[node.step]
    return "imported"


def _settings(config: dict[str, Any]) -> str:
    parts = [
        f"{k}={json.dumps(v) if isinstance(v, str | list | dict) else v}"
        for k, v in config.items()
        if k not in _RUN_ONLY and v is not None and v is not False
    ]
    text = ", ".join(parts)
    return text if len(text) <= 300 else text[:297] + "..."


def model_card(facts: CardFacts) -> str:
    chain = _manifests(facts.source)
    source_id = chain[0][0].id
    evaluation = latest_eval(facts.source, source_id)
    summary = facts.summary
    kind = summary.get("input_kind") or (chain[0][1].get("summary") or {}).get("input_kind")
    text = kind != "image"
    method = _method(chain)
    quantized = facts.step == "quantize"
    lines = _front_matter(facts, method, text, quantized, evaluation)
    title = f"{method} {'text' if text else 'image'} classifier"
    lines += [f"# {title} (uqcompress {facts.format}{' quantized' if quantized else ''})", ""]
    lines += _overview(facts, chain, method)
    lines += _lineage(chain)
    lines += _data(chain)
    lines += _evaluation(evaluation)
    lines += _calibration(summary, chain)
    lines += _checks(facts)
    lines += _contract(facts, text)
    lines += _latency(summary)
    lines += _intended_use(summary, text)
    return "\n".join(lines).rstrip() + "\n"


def _front_matter(
    facts: CardFacts,
    method: str,
    text: bool,
    quantized: bool,
    evaluation: tuple[Path, dict[str, Any], dict[str, Any]] | None,
) -> list[str]:
    task = "text-classification" if text else "image-classification"
    tags = ["uqcompress", "uncertainty-estimation", method, facts.format]
    if quantized:
        tags.append(str((facts.summary.get("quantization") or {}).get("mode", "quantized")))
    lines = [
        "---",
        f"library_name: {'onnx' if facts.format == 'onnx' else 'transformers'}",
        f"pipeline_tag: {task}",
        "tags:",
        *[f"- {_yaml(t)}" for t in tags],
    ]
    if evaluation is not None:
        _, manifest, metrics = evaluation
        measured = [(key, kind) for key, kind, _ in _METRICS if key in metrics]
        if measured:
            lines += ["metrics:", *[f"- {kind}" for _, kind in measured]]
            test = next(
                (d for d in manifest.get("data", []) if d.get("role") == "eval"), {"spec": "?"}
            )
            lines += [
                "model-index:",
                f"- name: {_yaml(facts.source.name)}",
                "  results:",
                "  - task:",
                f"      type: {task}",
                "    dataset:",
                f"      name: {_yaml(str(test.get('spec')))}",
                f"      type: {_yaml(str(test.get('spec')))}",
                "    metrics:",
            ]
            for key, kind in measured:
                lines += [f"    - type: {kind}", f"      value: {float(metrics[key]):.6g}"]
    return [*lines, "---", ""]


def _overview(facts: CardFacts, chain: list[tuple[Any, dict[str, Any]]], method: str) -> list[str]:
    summary = facts.summary
    root = chain[-1]
    base = (root[1].get("config") or {}).get("source") or (root[1].get("config") or {}).get(
        "family"
    )
    labels = summary.get("labels") or []
    lines = [
        f"Made by `uqc {facts.step}` from the {chain[0][0].kind} artifact "
        f"`{facts.source.name}` (id {chain[0][0].id[:8]}).",
        "",
        f"- method: {method}; members M = {summary.get('members', 1)}",
        f"- labels ({len(labels)}): {', '.join(str(label) for label in labels)}",
        f"- parameters: {summary['parameters']:,}" if "parameters" in summary else "",
        f"- base checkpoint: `{base}` (uqc {root[0].step})" if base else "",
        f"- loads with: {summary['loads_with']}" if "loads_with" in summary else "",
        "",
    ]
    return [lines[0], "", *[line for line in lines[1:] if line != ""], ""]


def _lineage(chain: list[tuple[Any, dict[str, Any]]]) -> list[str]:
    lines = ["## Lineage", "", "| depth | step | kind | id | status | settings |"]
    lines.append("|---|---|---|---|---|---|")
    for node, raw in chain:
        settings = _settings(raw.get("config") or {}).replace("|", "\\|")
        row = [str(node.depth), node.step, node.kind, node.id[:8], node.status, settings]
        lines.append("| " + " | ".join(row) + " |")
    return [*lines, ""]


def _data(chain: list[tuple[Any, dict[str, Any]]]) -> list[str]:
    seen: set[tuple[str, str]] = set()
    lines = ["## Data", "", "| step | role | data | examples | fingerprint |"]
    lines.append("|---|---|---|---|---|")
    for node, raw in chain:
        for entry in raw.get("data") or []:
            key = (str(entry.get("role")), str(entry.get("fingerprint")))
            if key in seen:
                continue
            seen.add(key)
            row = [node.step, key[0], f"`{entry.get('spec')}`", str(entry.get("examples", "?"))]
            lines.append("| " + " | ".join([*row, key[1]]) + " |")
    if not seen:
        lines = ["## Data", "", "No step of the lineage recorded data (an untrained model)."]
    return [*lines, ""]


def _evaluation(evaluation: tuple[Path, dict[str, Any], dict[str, Any]] | None) -> list[str]:
    lines = ["## Evaluation", ""]
    if evaluation is None:
        return [
            *lines,
            "No `uqc eval` of the exported model was found beside it: run `uqc eval MODEL "
            "--data TEST [--ood OOD]` before exporting to have its numbers here.",
            "",
        ]
    path, manifest, metrics = evaluation
    data = manifest.get("data") or []
    test: dict[str, Any] = next((d for d in data if d.get("role") == "eval"), {})
    lines += [
        f"From `{path.name}` (uqc eval, id {str(manifest.get('id', ''))[:8]}, "
        f"{manifest.get('created_utc', '?')}) on `{test.get('spec', '?')}` "
        f"({test.get('examples', '?')} examples, fingerprint {test.get('fingerprint', '?')}).",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    lines += [f"| {shown} | {float(metrics[k]):.4f} |" for k, _, shown in _METRICS if k in metrics]
    ood = sorted({k.split(".")[1] for k in metrics if k.startswith("ood.")})
    if ood:
        roles = {str(d.get("role", "")): d for d in data}
        specs = {role[4:]: d for role, d in roles.items() if role.startswith("ood:")}
        lines += ["", "Out-of-distribution detection (the in-distribution set above vs each):", ""]
        lines += ["| OOD set | score | AUROC | FPR95 | AUPR |", "|---|---|---|---|---|"]
        for name in ood:
            where = f"{name} (`{specs[name].get('spec')}`)" if name in specs else name
            for score in ("msp", "entropy", "mi"):
                key = f"ood.{name}.{score}"
                if f"{key}.auroc" in metrics:
                    values = [metrics.get(f"{key}.{m}") for m in ("auroc", "fpr95", "aupr")]
                    cells = ["-" if v is None else f"{float(v):.4f}" for v in values]
                    lines.append(f"| {where} | {score} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _calibration(summary: dict[str, Any], chain: list[tuple[Any, dict[str, Any]]]) -> list[str]:
    lines = ["## Calibration", ""]
    calibration = summary.get("calibration")
    if not calibration:
        return [
            *lines,
            "Not calibrated: the probabilities are the model's own (`uqc calibrate` fits a "
            "temperature and an abstention threshold on held-out data).",
            "",
        ]
    fitted = next(((n, r) for n, r in chain if n.step == "calibrate"), None)
    lines.append(f"- temperature: {float(calibration['temperature']):.4f} (in the graph)")
    if fitted is not None:
        s = fitted[1].get("summary") or {}
        spec = (fitted[1].get("config") or {}).get("data")
        if "ece_before" in s:
            lines.append(
                f"- fitted on `{spec}` ({s.get('calibration_examples', '?')} examples): "
                f"ECE {float(s['ece_before']):.4f} -> {float(s['ece_after']):.4f}, "
                f"NLL {float(s['nll_before']):.4f} -> {float(s['nll_after']):.4f}"
            )
    rule = calibration.get("abstain")
    if rule:
        lines.append(
            f"- abstains when {rule['score']} > {float(rule['threshold']):.4g} "
            f"(fitted to answer {float(rule['coverage']):.1%} of the calibration data)"
        )
        if fitted is not None and "abstain_risk" in (fitted[1].get("summary") or {}):
            s = fitted[1]["summary"]
            lines.append(
                f"- at that threshold: coverage {float(s['abstain_coverage']):.1%}, selective "
                f"risk (error rate among answered) {float(s['abstain_risk']):.4f}; all "
                f"answered: {float(s.get('risk_full_coverage', float('nan'))):.4f}"
            )
    else:
        lines.append("- no abstention rule (`uqc calibrate --abstain-coverage C` fits one)")
    return [*lines, ""]


def _checks(facts: CardFacts) -> list[str]:
    s = facts.summary
    if facts.step == "quantize":
        flips = s.get("drift_flips") or {}
        lines = [
            "## Quantization drift (against the float32 export)",
            "",
            f"- mode: {json.dumps(s.get('quantization'))}",
            f"- {s.get('drift_examples')} gate rows: argmax agreement "
            f"{float(s.get('drift_agreement', float('nan'))):.4f}, flips "
            f"{flips.get('flips')} (allowed {flips.get('allowed')}), max |probs difference| "
            f"{float(s.get('drift_max_abs_probs', float('nan'))):.3g}",
            f"- metric deltas: {json.dumps(s.get('drift_deltas'))}",
            f"- size: {s.get('onnx_bytes')} bytes ({s.get('size_ratio')} of float32)",
        ]
        return [*lines, ""]
    if facts.format != "onnx":
        return []
    return [
        "## Parity (ONNX Runtime against PyTorch)",
        "",
        f"- {s.get('parity_examples')} examples of `{s.get('parity_data')}`: max |difference| "
        + ", ".join(f"{k} {float(v):.3g}" for k, v in (s.get("parity_max_abs_diff") or {}).items())
        + f"; argmax agreement {float(s.get('parity_argmax_agreement', float('nan'))):.4f}",
        "",
    ]


def _contract(facts: CardFacts, text: bool) -> list[str]:
    if facts.format != "onnx":
        return []
    meta = facts.metadata
    names = json.loads(meta.get(contract.META_INPUT_NAMES, "[]"))
    pre = json.loads(meta.get(contract.META_PREPROCESSING, "{}"))
    m = facts.summary.get("members", 1)
    lines = [
        "## Input contract",
        "",
        f"- inputs: {', '.join(f'`{n}`' for n in names)}",
        f"- outputs: `member_logits` [B, {m}, C], `probs` [B, C] (mean of the member "
        "softmaxes), `entropy` [B], `mutual_info` [B]",
    ]
    if text:
        lines += [
            f"- text: tokenised by `{pre.get('tokenizer')}`, truncated to "
            f"{pre.get('max_length')} tokens (set in the tokenizer file too), pad id "
            f"{pre.get('pad_token_id')}" + ("; text pairs" if pre.get("text_pair") else ""),
        ]
    else:
        size = pre.get("image_size")
        lines += [
            f"- images: {pre.get('num_channels')} x {size} x {size} after the processor's "
            f"resize/crop, pixels 0..255 rescaled by {pre.get('rescale_factor')} and "
            f"normalised with mean {pre.get('image_mean')}, std {pre.get('image_std')}",
        ]
    if contract.NOISE_INPUT in names:
        lines.append(
            "- `noise`: standard normal draws (the Predictor draws them per example from "
            "the seed in the metadata)"
        )
    return [*lines, ""]


def _latency(summary: dict[str, Any]) -> list[str]:
    latency = summary.get("latency")
    if not latency:
        return []
    return [
        "## Latency (measured by the export)",
        "",
        f"- {float(latency['ms_per_example']):.3f} ms per example, model only (ONNX Runtime "
        f"`run`, inputs encoded beforehand), median of {latency['runs']} runs of a batch of "
        f"{latency['batch_size']}, threads: {latency['threads']}, {latency['provider']}",
        f"- machine: {latency['machine']}; measure your own on the deployment hardware",
        "",
    ]


def _intended_use(summary: dict[str, Any], text: bool) -> list[str]:
    members = int(summary.get("members", 1) or 1)
    lines = [
        "## Intended use and limits",
        "",
        f"Classifies {'texts' if text else 'images'} into the labels above and says how "
        "sure it is. `probs` is the predictive distribution; `entropy` its total "
        "uncertainty (high: unsure, for any reason).",
    ]
    if members > 1:
        lines.append(
            f"`mutual_info` is the members' disagreement ({members} members): the epistemic "
            "part, high on inputs unlike the training data."
        )
    else:
        lines.append("`mutual_info` is 0: one model has no disagreement to measure.")
    lines += [
        "",
        "The numbers above hold for the data they name. Inputs of another domain, language or "
        "form can be confidently wrong: the OOD results say how well the uncertainty flagged "
        "the sets it was tried on, not others. Load with `uqcompress.export.runtime.Predictor`"
        " (torch-free) or plain ONNX Runtime and the tokenizer file.",
        "",
    ]
    return lines
