"""`uqc quantize`: an int8 (dynamic or static QDQ) or float16 copy of an ONNX export, written
only when it stays within the drift gate against the float32 export (exit 3 otherwise, and
nothing is written, as the export parity gate).

The quantized graph keeps the export contract: the same inputs (a sampling model's `noise`
float32), the same four float32 outputs, computed by the unquantized float32 uncertainty tail
(`export/quantize.py` says how the tail is found), and every `uqc.*` metadata value, with the
quantization recorded under `uqc.quantization`. So the Predictor, `predict`, `eval`,
`compare` and `verify` take the result unchanged.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uqcompress.artifacts import MANIFEST_NAME, ArtifactWriter, OutputPlan, SourceRef
from uqcompress.errors import ArtifactError, IncompatibleInputError, QualityGateError
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse

MODES = ("dynamic", "static", "fp16")  # export/quantize.py MODES (not imported: no onnx here)
CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
DRIFT_FILE = "drift.json"
DEFAULT_AUROC_DROP = 0.01  # --max-auroc-drop with --ood
# what the float32 export's summary says that stays true of its quantized copy
KEPT_SUMMARY = (
    "format",
    "opset",
    "members",
    "aggregation",
    "parameters",
    "labels",
    "input_kind",
    "calibration",
    "sve_form",
)


@dataclass(frozen=True)
class QuantizeConfig:
    mode: str = fields.described(
        "dynamic",
        help="dynamic (int8 weights, activations quantized at run time), static (int8 "
        "QDQ, activation ranges calibrated on --data) or fp16 (float16 weights and "
        "compute, float32 inputs/outputs; for GPU execution providers).",
    )
    # runtime: data spec strings (their content fingerprints are in the id)
    data: str | None = fields.runtime(
        None,
        help="Examples for the drift gate (labelled, for the ECE and NLL deltas) and, "
        "with --mode static, for calibration: builtin:NAME\\[@split], FILE.csv, a "
        "folder or hf:NAME\\[/CONFIG]@SPLIT.",
    )
    ood: list[str] = fields.option(
        kind=list[str],
        parse=lambda v: list(v or []),
        is_runtime=True,
        default_factory=list,
        help="Out-of-distribution data (repeatable; labels not needed): the gate also "
        "bounds the drop of OOD AUROC (msp, entropy, and mi for ensembles).",
    )
    # the gate's own rows: then --data only calibrates (static), all of it eligible
    gate_data: str | None = fields.added(
        None,
        help="Separate examples for the drift gate: then the gate runs on all of them and "
        "--data only calibrates (--mode static: a seeded sample of --calib-size rows).",
    )
    # int8 scales: True per output channel, False per tensor, None (auto) per channel first and
    # per tensor if that fails the gate. Measured (benchmarks/quantize_gate_real.py): on a real
    # MiniLM per tensor failed the gate and per channel passed; on the tiny test models and
    # digits ONNX Runtime's per-channel MatMul drifts more than per tensor.
    per_channel: bool | None = fields.described(
        None,
        decl="--per-channel/--per-tensor",
        help="int8: one scale per output channel, or one per weight tensor. Neither: per "
        "channel first (on a real MiniLM it passed the gate where per tensor failed), per "
        "tensor if that fails the gate (on small models it drifts less).",
    )
    # 7-bit weights: ONNX Runtime's u8s8 int8 kernels on AVX2 CPUs without VNNI add pairs of
    # products in int16 (VPMADDUBSW), which saturates for 8-bit weights; 7 bits cannot.
    reduce_range: bool = fields.added(
        False,
        decl="--reduce-range/--full-range",
        help="int8: weights in 7 bits, so ONNX Runtime's int8 kernels on CPUs without "
        "AVX-512 VNNI (AVX2 only) cannot saturate; a little coarser elsewhere.",
    )
    exclude: str | None = fields.described(
        None,
        help="Regular expression over ONNX node names to keep in float32 (the "
        "uncertainty tail always is).",
    )
    calib_size: int = fields.described(
        128,
        help="--mode static: calibration examples, a seeded random sample of at most "
        "half of --data (the other rows gate); 1 to 4096.",
    )
    seed: int = fields.described(
        0, help="--mode static: which rows of --data calibrate."
    )  # --mode static: which rows of --data calibrate (the others gate)
    calib_method: str = fields.described(
        "minmax", help="--mode static: minmax, entropy or percentile (ONNX Runtime)."
    )
    min_agreement: float = fields.described(
        0.99, help="Gate: smallest fraction of argmax predictions kept."
    )
    max_ece_delta: float = fields.described(
        0.01, help="Gate: largest |ECE change| (15 bins, both models on the fp32 model's bins)."
    )
    max_nll_delta: float = fields.described(0.02, help="Gate: largest |NLL change| (nats).")
    # None: 0.01 with --ood; set without --ood it would bound nothing, so it is refused
    max_auroc_drop: float | None = fields.described(
        None, help="Gate, with --ood only: largest drop of OOD AUROC \\[default: 0.01]."
    )
    max_coverage_delta: float = fields.described(
        0.02,
        help="Gate, calibrated models with an abstention rule: largest |coverage change| "
        "at the stored threshold.",
    )
    # |change of mean entropy / mean MI| over the gate rows, relative to the float32 value
    # (plus UNCERTAINTY_FLOOR nats, so that values near 0 never fail on noise)
    max_entropy_shift: float = fields.described(
        0.1,
        help="Gate: largest |change of the mean predictive entropy| over the gate rows, "
        "relative to the float32 export's (plus 0.01 nats).",
    )
    max_mi_shift: float = fields.described(
        0.1,
        help="Gate: largest |change of the mean mutual information| (ensembles), relative "
        "to the float32 export's (plus 0.01 nats).",
    )
    batch_size: int = fields.runtime(64)
    text_column: str = fields.runtime("text")
    label_column: str = fields.runtime("label")
    text_pair_column: str | None = fields.runtime(None)
    device: str = fields.device("cpu")
    threads: int | None = fields.threads()

    def validate(self) -> None:
        problems = fields.problems(self)
        if self.mode not in MODES:
            problems.add(f"unknown --mode {self.mode!r}", hint=f"use one of: {', '.join(MODES)}")
        if self.data is None:
            what = (
                "--mode static calibrates its activation ranges on --data, and the drift gate "
                "runs on it"
                if self.mode == "static"
                else "the drift gate compares the quantized model with the float32 export on --data"
            )
            problems.add(
                f"{what}; no --data given",
                hint="pass --data (labelled examples the model was built for, e.g. its test set)",
            )
        if self.calib_method not in CALIBRATION_METHODS:
            problems.add(
                f"unknown --calib-method {self.calib_method!r}",
                hint=f"use one of: {', '.join(CALIBRATION_METHODS)}",
            )
        if not 0 <= self.min_agreement <= 1:
            problems.add(
                f"--min-agreement {self.min_agreement} must be in [0, 1]",
                hint="pass --min-agreement 0.99",
            )
        for name, value in (
            ("max_ece_delta", self.max_ece_delta),
            ("max_nll_delta", self.max_nll_delta),
            ("max_auroc_drop", self.max_auroc_drop),
            ("max_coverage_delta", self.max_coverage_delta),
            ("max_entropy_shift", self.max_entropy_shift),
            ("max_mi_shift", self.max_mi_shift),
        ):
            if value is not None and value < 0:
                flag = fields.flag(name)
                default = getattr(QuantizeConfig, name)
                problems.add(
                    f"{flag} {value} must be 0 or more",
                    hint=f"pass {flag} {DEFAULT_AUROC_DROP if default is None else default:g}"
                    " (the default)",
                )
        if self.max_auroc_drop is not None and not self.ood:
            problems.add(
                f"--max-auroc-drop {self.max_auroc_drop:g} bounds the OOD AUROC drop, but no "
                "--ood data is given, so it would check nothing",
                hint="pass --ood DATA (out-of-distribution examples) or leave out --max-auroc-drop",
            )
        if self.exclude is not None:
            try:
                re.compile(self.exclude)
            except re.error as exc:
                problems.add(
                    f"--exclude {self.exclude!r} is not a regular expression ({exc})",
                    hint="pass a Python regular expression over node names, e.g. 'layer\\.0\\.'",
                )
        problems.raise_any()

    def bounds(self) -> Any:
        from uqcompress.export.quantize import Bounds

        return Bounds(
            min_agreement=self.min_agreement,
            max_ece_delta=self.max_ece_delta,
            max_nll_delta=self.max_nll_delta,
            max_auroc_drop=DEFAULT_AUROC_DROP
            if self.max_auroc_drop is None
            else self.max_auroc_drop,
            max_coverage_delta=self.max_coverage_delta,
            max_entropy_shift=self.max_entropy_shift,
            max_mi_shift=self.max_mi_shift,
        )


def _open_export(path: Path) -> Any:
    """The float32 ONNX artifact to quantize; anything else is refused in one line."""
    from uqcompress.artifacts import open_artifact, read_manifest
    from uqcompress.export import contract

    export_hint = f"export it first: uqc export {path} --format onnx, then quantize that"
    if not path.exists():
        raise ArtifactError(
            f"{path} does not exist",
            hint="pass the folder uqc export --format onnx printed, e.g. artifacts/onnx-1a2b3c4d",
        )
    if not (path / MANIFEST_NAME).is_file():
        raise IncompatibleInputError(
            f"{path} is not an ONNX artifact; uqc quantize works on ONNX exports",
            hint=export_hint,
        )
    kind = read_manifest(path).kind
    if kind != "onnx":
        raise IncompatibleInputError(
            f"{path} is a {kind} artifact, not an ONNX export; uqc quantize works on ONNX graphs",
            hint=export_hint
            if kind in ("model", "members", "safetensors")
            else "pass an artifact written by uqc export --format onnx",
        )
    artifact = open_artifact(path, expect_kind="onnx")
    if contract.ONNX_FILE not in artifact.manifest.files:
        raise ArtifactError(
            f"{path} holds no {contract.ONNX_FILE}",
            hint="pass an artifact written by uqc export --format onnx",
        )
    done = artifact.manifest.summary.get("quantization")
    if done:
        mode = done.get("mode", "?") if isinstance(done, dict) else "?"
        parent = next((ref.path for ref in artifact.manifest.inputs if ref.role == "model"), None)
        where = (
            f": quantize the float32 export it came from ({(path / parent).resolve()})"
            if parent
            else ""
        )
        raise IncompatibleInputError(
            f"{path} is already quantized ({mode}); quantizing twice compounds the error",
            hint=f"pass the float32 export instead{where}",
        )
    return artifact


def run(
    onnx_artifact: Path, cfg: QuantizeConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.data import load_data
    from uqcompress.data.encoding import check_input_kind
    from uqcompress.runtime.deps import require_onnxruntime
    from uqcompress.uq import numerics_tags

    cfg.validate()
    require_onnxruntime()
    artifact = _open_export(Path(onnx_artifact))
    if cfg.exclude:
        from uqcompress.export import contract
        from uqcompress.export.onnx_file import read_skeleton
        from uqcompress.export.quantize import check_exclude

        graph = read_skeleton(artifact.path / contract.ONNX_FILE)  # nodes only, no weights
        check_exclude(graph, cfg.mode, cfg.exclude)  # before any data is read
    assert cfg.data is not None  # validate() refuses a missing --data
    summary = artifact.manifest.summary
    input_kind = str(summary.get("input_kind", ""))
    data = load_data(
        cfg.data,
        cfg.text_column,
        cfg.label_column,
        require_labels=False,
        text_pair_column=cfg.text_pair_column,
    )
    gate = (
        load_data(
            cfg.gate_data,
            cfg.text_column,
            cfg.label_column,
            require_labels=False,
            text_pair_column=cfg.text_pair_column,
        )
        if cfg.gate_data is not None
        else None
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
    for each in [data, *([gate] if gate is not None else []), *ood_sets]:
        check_input_kind(each, input_kind, str(onnx_artifact))
    config = asdict(cfg)
    plan = OutputPlan(
        kind="onnx",
        step="quantize",
        config=config,
        id_config=fields.id_config(cfg, config) | numerics_tags(),
        inputs=[SourceRef.of("model", artifact)],
        data=[data.manifest_entry("data")]
        + ([gate.manifest_entry("gate")] if gate is not None else [])
        + [d.manifest_entry(f"ood:{d.name}") for d in ood_sets],
        device=cfg.device,
    )

    def build(writer: ArtifactWriter) -> None:
        _build(artifact, data, ood_sets, cfg, writer, gate)

    return build_or_reuse(plan, out, force, build)


def calibration_split(n: int, calib_size: int, seed: int) -> tuple[list[int], list[int]]:
    """(calibration rows, gate rows) of `n`: a seeded random sample of at most `calib_size`
    rows (and at most half) calibrates; the gate runs on the others, never in-sample."""
    from uqcompress.errors import DataError

    if n < 2:
        raise DataError(
            f"--mode static needs at least 2 rows of --data (calibration and gate rows); got {n}",
            hint="pass more labelled examples with --data",
        )
    return seeded_sample(n, max(1, min(calib_size, n // 2)), seed)


def seeded_sample(n: int, k: int, seed: int) -> tuple[list[int], list[int]]:
    """(a seeded random sample of at most `k` of `n` rows, the other rows), each sorted."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(n)
    return sorted(int(i) for i in order[:k]), sorted(int(i) for i in order[k:])


def _subset(data: Any, rows: list[int]) -> Any:
    """The rows `rows` of `data` (same spec and fingerprint: the split is in the summary)."""
    import dataclasses

    return dataclasses.replace(
        data,
        labels=[data.labels[i] for i in rows] if data.labels is not None else None,
        texts=[data.texts[i] for i in rows] if data.texts is not None else None,
        text_pairs=[data.text_pairs[i] for i in rows] if data.text_pairs is not None else None,
        images=data.images.subset(rows) if data.images is not None else None,
    )


def _batches(predictor: Any, data: Any, limit: int | None, size: int) -> list[dict[str, Any]]:
    """Encoded input batches of the first `limit` examples, preprocessed by the Predictor
    (as it preprocesses in deployment); a sampling model's noise drawn per batch."""
    from uqcompress.data.dataset import LabeledData
    from uqcompress.export import contract
    from uqcompress.export.source import onnx_pixel_batches

    n = len(data) if limit is None else min(limit, len(data))
    if data.input_kind == "text":
        pairs = data.text_pairs
        encoded = [
            predictor.encode_texts(
                data.texts[start : min(n, start + size)],
                pairs[start : min(n, start + size)] if pairs is not None else None,
                first=start,
            )
            for start in range(0, n, size)
        ]
    else:
        head = LabeledData(
            spec=data.spec,
            input_kind="image",
            labels=None,
            fingerprint=data.fingerprint,
            images=data.images.subset(range(n)),
        )
        encoded = list(onnx_pixel_batches(predictor, head, size))
    batches = []
    for batch in encoded:
        if predictor.noise is not None:
            batch[contract.NOISE_INPUT] = predictor.draw_noise(batch)
        batches.append(batch)
    return batches


def _quantize(
    source_onnx: Path,
    target: Path,
    cfg: QuantizeConfig,
    per_channel: bool,
    calibration: list[dict[str, Any]] | None,
    out_dir: Path,
) -> Any:
    """Quantize `source_onnx` into `target` at one granularity (a scratch folder for ORT's
    intermediate files inside the artifact being written, removed either way)."""
    from uqcompress.export.quantize import quantize_graph

    work = out_dir / ".work"
    work.mkdir(exist_ok=True)
    try:
        return quantize_graph(
            source_onnx,
            target,
            cfg.mode,
            per_channel=per_channel,
            reduce_range=cfg.reduce_range,
            exclude=cfg.exclude,
            calibration=calibration,
            calibration_method=cfg.calib_method,
            work_dir=work,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _build(
    artifact: Any,
    data: Any,
    ood_sets: list[Any],
    cfg: QuantizeConfig,
    writer: ArtifactWriter,
    gate: Any = None,
) -> None:
    from uqcompress.data.labels import map_labels
    from uqcompress.export import contract
    from uqcompress.export.quantize import (
        CALIBRATION_BATCH,
        measure_drift,
        rows_for_one_flip,
    )
    from uqcompress.export.runtime import Predictor
    from uqcompress.runtime.console import activity, stderr, user

    source_onnx = artifact.path / contract.ONNX_FILE
    reference = Predictor(artifact.path, device=cfg.device, threads=cfg.threads)
    calibration = None
    rows = {"gate": len(data), "calibration": 0, "split": "all rows of --data gate"}
    if gate is not None:
        # The gate has rows of its own: --data only calibrates (a seeded sample of it).
        sample: list[int] = []
        if cfg.mode == "static":
            sample = seeded_sample(len(data), cfg.calib_size, cfg.seed)[0]
            calibration = _batches(reference, _subset(data, sample), None, CALIBRATION_BATCH)
        rows = {
            "gate": len(gate),
            "calibration": len(sample),
            "split": "all rows of --gate-data gate"
            + (
                f"; a seeded sample of --data (--seed {cfg.seed}) calibrates" if calibration else ""
            ),
        }
        data = gate
    elif cfg.mode == "static":
        calib_rows, gate_rows = calibration_split(len(data), cfg.calib_size, cfg.seed)
        calibration = _batches(reference, _subset(data, calib_rows), None, CALIBRATION_BATCH)
        data = _subset(data, gate_rows)
        rows = {
            "gate": len(gate_rows),
            "calibration": len(calib_rows),
            "split": f"seeded random sample (--seed {cfg.seed}) calibrates, the other rows gate",
        }
    target = writer.dir / contract.ONNX_FILE
    tokenizer = artifact.path / contract.TOKENIZER_FILE
    if tokenizer.is_file():
        shutil.copyfile(tokenizer, writer.dir / contract.TOKENIZER_FILE)
    labels = (
        map_labels(data, reference.labels, placeholder=False).ids
        if data.labels is not None
        else None
    )
    gate_batches = _batches(reference, data, None, cfg.batch_size)
    ood_batches = {d.name: _batches(reference, d, None, cfg.batch_size) for d in ood_sets}
    tries: list[dict[str, Any]] = []
    granularities = [cfg.per_channel] if cfg.per_channel is not None else [True, False]
    if cfg.mode == "fp16":
        granularities = [bool(cfg.per_channel)]  # scales are an int8 notion
    with activity(f"quantizing ({cfg.mode})") as work:
        for per_channel in granularities:
            how = "" if cfg.mode == "fp16" else ", per channel" if per_channel else ", per tensor"
            stderr.print(f"[dim]quantizing {user(artifact.path)} ({cfg.mode}{how})...[/dim]")
            work.step(f"quantizing the graph{how}")
            result = _quantize(source_onnx, target, cfg, per_channel, calibration, writer.dir)
            work.step(f"checking drift against the float32 export{how}")
            quantized = Predictor(writer.dir, device=cfg.device, threads=cfg.threads)
            drift = measure_drift(
                reference, quantized, gate_batches, labels, ood_batches, cfg.bounds()
            )
            failed = "; ".join(
                f"{c.name} {c.value:.4g} (needs {c.bound})" for c in drift.failures()
            )
            tries.append({"per_channel": per_channel, "passed": drift.passed, "failed": failed})
            if drift.passed:
                break
    if not drift.passed:
        said = (
            " | ".join(
                f"{'per channel' if t['per_channel'] else 'per tensor'}: {t['failed']}"
                for t in tries
            )
            if len(tries) > 1
            else failed
        )
        raise QualityGateError(
            f"the {cfg.mode} quantized model drifts from the float32 export: {said} "
            f"[{drift.describe()}]; no artifact written",
            hint=gate_hint(cfg.mode, tried_both_granularities=len(tries) > 1),
        )
    if len(tries) > 1:
        stderr.print(
            f"[dim]per channel failed the gate ({tries[0]['failed']}): per tensor kept[/dim]"
        )
    (writer.dir / DRIFT_FILE).write_text(json.dumps(drift.to_dict(), indent=2) + "\n")
    fp32_bytes = int(source_onnx.stat().st_size)
    size = int(target.stat().st_size)
    writer.summary.update(
        {
            k: summary_value
            for k in KEPT_SUMMARY
            if (summary_value := artifact.manifest.summary.get(k)) is not None
        }
    )
    writer.summary.update(
        {
            "quantization": result.record(),
            # auto granularity: each granularity tried, in order, and what failed
            "granularity_tries": tries,
            "onnx_bytes": size,
            "fp32_onnx_bytes": fp32_bytes,
            "size_ratio": round(size / fp32_bytes, 4),
            "drift_examples": drift.examples,
            "drift_rows": rows,
            "drift_agreement": drift.agreement,
            "drift_flips": {"flips": drift.flips, "allowed": drift.allowed_flips},
            "drift_max_abs_probs": drift.max_abs_diff["probs"],
            "drift_deltas": drift.deltas,
        }
    )
    for skipped in drift.skipped:
        writer.warn(f"{skipped} not checked: {data.spec} has no labels")
    needed = rows_for_one_flip(cfg.min_agreement)
    if needed and drift.examples < needed:
        writer.warn(
            f"the drift gate ran on {drift.examples} rows: at --min-agreement "
            f"{cfg.min_agreement:g} not one flip is allowed there, so the bound is stricter "
            f"than it reads; gate on at least {needed} rows (--gate-data) for it to mean "
            f"{cfg.min_agreement:g}"
        )
    if cfg.mode == "fp16" and cfg.device == "cpu":
        writer.warn(
            "float16 is for GPU execution providers; on the CPU ONNX Runtime casts around most "
            "float16 ops, so it is not expected to be faster than float32 there"
        )
    stderr.print(f"[green]drift ok[/green]: {drift.describe()}")
    from uqcompress.export.card import CardFacts, graph_metadata, write_model_card

    write_model_card(
        writer.dir,
        CardFacts("quantize", "onnx", writer.summary, artifact.path, graph_metadata(target)),
    )


def gate_hint(mode: str, tried_both_granularities: bool) -> str:
    """The fix said when the drift gate refuses a `mode` model: another mode (never the one
    that just failed), the other granularity unless both were tried, or a looser bound."""
    other = "dynamic" if mode == "static" else "static"
    granularity = (
        "" if tried_both_granularities else " (or the other of --per-channel/--per-tensor)"
    )
    return (
        f"try --mode {other} or --exclude the layers that drift{granularity}; loosen a bound "
        "(--min-agreement, --max-ece-delta, ...) only if that drift is acceptable"
    )
