"""`uqc export`: ONNX (parity-gated, uncertainty in the graph) or plain safetensors."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.errors import ConfigError, ParityError
from uqcompress.export.parity import save_parity
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse
from uqcompress.uq import numerics_tags

FORMATS = ("onnx", "safetensors")
# The opsets an export may ask for: the dynamo exporter's floor (export/onnx.py MIN_OPSET) to
# the highest the installed torch exporter declares (torch.onnx._constants.ONNX_MAX_OPSET;
# tests/export/test_onnx_export.py holds this to it). Checked before anything loads.
OPSETS = (18, 23)


@dataclass(frozen=True)
class ExportConfig:
    format: str = fields.described("onnx", help="onnx or safetensors.")
    # runtime: examples for the parity check only; the exported model does not depend on them
    data: str | None = fields.runtime(
        None,
        help="Real examples for the ONNX parity check (labels not "
        "needed). Default: synthetic inputs.",
    )
    atol: float = fields.described(
        1e-4,
        help="Largest allowed |difference| ONNX vs PyTorch in every output (absolute; the "
        "logits of a model calibrated at T < 1: atol / T).",
    )
    opset: int = fields.described(18, help="ONNX opset, 18..23.")
    text_column: str = fields.runtime("text")
    label_column: str = fields.runtime("label")
    text_pair_column: str | None = fields.runtime(None)
    materialize: bool = fields.described(
        False,
        help="SVE models: dense per-member weights in the graph (M weight copies, fewer "
        "FLOPs per member) instead of the factorised form (U, V once; small file).",
    )  # SVE only: dense per-member weights in the graph
    # text: the token length the Predictor truncates to (None: the length the model was
    # trained at, else its position table); bounded by the position table at export
    max_length: int | None = fields.added(
        None,
        help="Text: the token length the exported model truncates to. Default: the "
        "length it was fine-tuned at (else its position table); at most the position table.",
    )
    device: str = fields.device("cpu")
    threads: int | None = fields.threads()

    def validate(self) -> None:
        problems = fields.problems(self)
        if self.materialize and self.format != "onnx":
            problems.add("--materialize applies to ONNX exports", hint="drop --materialize")
        if self.format not in FORMATS:
            problems.add(
                f"unknown --format {self.format!r}", hint=f"use one of: {', '.join(FORMATS)}"
            )
        if self.max_length is not None and self.format != "onnx":
            problems.add(
                "--max-length applies to ONNX exports (a safetensors export keeps the model "
                "config)",
                hint="drop --max-length",
            )
        low, high = OPSETS
        if not low <= self.opset <= high:
            problems.add(
                f"--opset {self.opset} is outside the supported range {low}..{high}",
                hint=f"pass --opset {low} (the default) or another of {low}..{high}",
            )
        if not 0 < self.atol < 1:
            problems.add(f"--atol {self.atol} must be in (0, 1)", hint="pass --atol 1e-4")
        problems.raise_any()


def run(
    model_path: Path, cfg: ExportConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.data import load_data
    from uqcompress.models.loading import resolve_model_source

    cfg.validate()
    if cfg.format == "onnx":
        from uqcompress.runtime.deps import require_onnxruntime

        require_onnxruntime()  # the parity gate needs it: fail before the export, not after
    source = resolve_model_source(model_path)
    data = (
        load_data(
            cfg.data,
            cfg.text_column,
            cfg.label_column,
            require_labels=False,
            text_pair_column=cfg.text_pair_column,
        )
        if cfg.data and cfg.format == "onnx"
        else None
    )
    config = asdict(cfg)
    # The graph computes the uncertainty outputs and the Predictor draws DIRECTOR noise by
    # these definitions: a change to either changes what the export returns, so its id.
    id_config = fields.id_config(cfg, config) | numerics_tags()
    trained = _trained_length(source.path)
    if trained is not None:  # the default --max-length: the export reads what was trained
        id_config["trained_max_length"] = trained
    if cfg.format == "safetensors":  # parity options do not apply
        id_config = {"format": "safetensors"}
    plan = OutputPlan(
        kind=cfg.format,
        step="export",
        config=config,
        id_config=id_config,
        inputs=[source.ref],
        data=[data.manifest_entry("parity")] if data is not None else [],
        device=cfg.device,
    )

    def build(writer: ArtifactWriter) -> None:
        from uqcompress.models.loading import load_model

        loaded = load_model(source)
        _refuse_non_finite(loaded, source.path)
        if cfg.format == "safetensors":
            _write_safetensors(loaded, writer)
            from uqcompress.export.card import CardFacts, write_model_card

            write_model_card(
                writer.dir, CardFacts("export", "safetensors", writer.summary, source.path)
            )
        else:
            _write_onnx(loaded, source.ref.id, source.ref.kind, data, cfg, writer, source.path)

    return build_or_reuse(plan, out, force, build)


def _refuse_non_finite(loaded: Any, path: Path) -> None:
    """NonFiniteError for NaN or infinite weights, before anything is exported (the parity
    gate would blame the export: "ONNX output disagrees with PyTorch")."""
    from uqcompress.engine.finite import non_finite_weights, weights_summary
    from uqcompress.errors import NonFiniteError

    count, names = non_finite_weights(loaded.model)
    if count:
        raise NonFiniteError(
            f"{path} cannot be exported: {weights_summary(count, names)}",
            hint="export a model with finite weights (retrain or re-import it)",
        )


def _trained_length(model_dir: Path) -> int | None:
    """The training length a model's config.json records (`uqc_max_length`), read before the
    model loads so that it is part of the export's id."""
    import json

    from uqcompress.data.encoding import MAX_LENGTH_KEY

    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # loading the model reports it
    value = config.get(MAX_LENGTH_KEY) if isinstance(config, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def export_length(loaded: Any, requested: int | None) -> int | None:
    """The token length a text export truncates to: `--max-length`, else the length the model
    was trained at, else its position table; never above the position table. None for
    images (where `--max-length` is refused)."""
    from uqcompress.data.encoding import recorded_max_length

    limit = loaded.max_length or 512
    if loaded.input_kind != "text":
        if requested is not None:
            raise ConfigError(
                f"--max-length applies to text models; {loaded.family.name} reads images",
                hint="drop --max-length",
            )
        return None
    if requested is not None:
        if not 2 < requested <= limit:
            raise ConfigError(
                f"--max-length {requested} is outside 3..{limit} (the model's position table)",
                hint=f"pass --max-length between 3 and {limit}, or leave it out",
            )
        return requested
    trained = recorded_max_length(loaded.config)
    return min(trained, limit) if trained is not None else limit


def _write_safetensors(loaded: Any, writer: ArtifactWriter) -> None:
    from uqcompress.models.loading import save_model
    from uqcompress.models.summary import model_summary

    save_model(loaded, writer.dir, keep_calibration=True)
    writer.summary.update(model_summary(loaded))
    if loaded.calibration is not None:
        writer.summary["calibration"] = loaded.calibration.to_dict()
        writer.warn(
            f"config.json keeps the calibration (uqc_calibration: temperature "
            f"{loaded.calibration.temperature:.4g}); plain transformers does not apply it: "
            "divide the logits by the temperature yourself, or load with uqcompress"
        )
    from uqcompress.models.kinds import kind_of
    from uqcompress.models.surgery import PRUNED

    kind = kind_of(loaded.config)
    if kind.ensemble:
        writer.summary["members"] = loaded.members
        writer.summary["loads_with"] = "uqcompress.models.loading.load_model (uqc import DIR)"
        writer.warn(
            f"this is {kind.described}: plain transformers has "
            "no class for it; load it with uqcompress (or use the ONNX export)"
        )
    elif kind is PRUNED:
        writer.summary["loads_with"] = "uqcompress.models.loading.load_model (uqc import DIR)"
        writer.warn(
            "this model has pruned, uneven attention heads: plain transformers cannot rebuild "
            "its shapes from config.json; load it with uqcompress (or use the ONNX export)"
        )
    else:
        writer.summary["loads_with"] = (
            f"transformers.{type(loaded.model).__name__}.from_pretrained(dir)"
        )


def _write_loader_files(loaded: Any, directory: Path) -> str:
    """The files Hugging Face loaders read beside model.onnx: config.json (labels, model
    type) and the tokenizer's or image processor's config, so that optimum's
    `ORTModelFor*Classification.from_pretrained(dir)` and `pipeline(...)` load the export
    and read its `logits` output. Returns what loads the export, for the summary and card.
    """
    from uqcompress.export import contract
    from uqcompress.export.graph import takes_noise

    loaded.model.config.to_json_file(str(directory / "config.json"))
    if loaded.tokenizer is not None:
        loaded.tokenizer.save_pretrained(str(directory))  # tokenizer.json: rewritten after
    if loaded.preprocessing is not None:
        loaded.preprocessing.save(directory)
    predictor = "uqcompress.export.runtime.Predictor(dir)"
    if takes_noise(loaded.model):
        return (
            f"{predictor} only: the graph takes a `{contract.NOISE_INPUT}` input that "
            "optimum's ORTModel does not feed"
        )
    task = "Sequence" if loaded.input_kind == "text" else "Image"
    return (
        f"optimum.onnxruntime.ORTModelFor{task}Classification.from_pretrained(dir) "
        f"(reads `{contract.LOGITS_OUTPUT}`), or {predictor} for every output"
    )


def _write_tokenizer(loaded: Any, length: int | None, directory: Path) -> None:
    """The tokenizer file with the export's truncation and padding set, so that a plain
    `tokenizers` + ONNX Runtime user gets inputs the graph takes (no 512-by-802 overflow);
    and transformers' tokenizer config truncating at the same length (`truncation=True`
    reads `model_max_length`), so a `pipeline` sees what the Predictor sees."""
    import json

    from tokenizers import Tokenizer

    from uqcompress.export import contract

    path = directory / contract.TOKENIZER_FILE
    config_path = directory / "tokenizer_config.json"
    if length is not None and config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config["model_max_length"] = length
        config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    tokenizer = Tokenizer.from_str(loaded.tokenizer.backend_tokenizer.to_str())
    if length is not None:
        tokenizer.enable_truncation(length)
    pad_id = int(loaded.tokenizer.pad_token_id or 0)
    pad_token = loaded.tokenizer.pad_token or tokenizer.id_to_token(pad_id) or "[PAD]"
    tokenizer.enable_padding(pad_id=pad_id, pad_token=str(pad_token))
    tokenizer.save(str(path))


def _free_weights(model: Any) -> None:
    """Free the memory of a module's parameters and buffers in place. The exporter's
    internals keep references to the parameter objects after the export (besides the graph
    `export_graph` empties), so dropping our references, or moving the module to the meta
    device (which makes new parameters), left every weight alive."""
    import torch

    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = torch.empty(0, dtype=tensor.dtype)


def _write_onnx(
    loaded: Any,
    source_id: str,
    source_kind: str,
    data: Any,
    cfg: ExportConfig,
    writer: ArtifactWriter,
    source_path: Path,
) -> None:
    from uqcompress.engine.modality import synthetic_examples
    from uqcompress.export import contract
    from uqcompress.export.card import CardFacts, write_model_card
    from uqcompress.export.graph import graph_for
    from uqcompress.export.latency import latency_inputs, measure_latency
    from uqcompress.export.onnx import (
        check_parity,
        export_graph,
        metadata_for,
        parity_reference,
    )
    from uqcompress.export.runtime import Predictor
    from uqcompress.models.sve_model import SVE
    from uqcompress.runtime.console import activity, stderr

    length = export_length(loaded, cfg.max_length)  # refused before the (slow) export
    temperature = loaded.calibration.temperature if loaded.calibration is not None else 1.0
    # the reference of the parity gate (a calibrated model's temperature included)
    graph = graph_for(loaded.model, loaded.input_kind, temperature)
    exported = graph
    if cfg.materialize:
        from uqcompress.methods.sve import materialize

        if not SVE.marks(loaded.config):
            raise ConfigError(
                "--materialize applies to Singular Value Ensembles (uqc svd-ensemble)",
                hint="drop --materialize",
            )
        exported = graph_for(materialize(loaded.model), loaded.input_kind, temperature)
        writer.summary["sve_form"] = "materialized"
    elif SVE.marks(loaded.config):
        writer.summary["sve_form"] = "factorised"
    title = f"exporting {loaded.family.name} to ONNX"
    with activity(title) as work:
        onnx_path = writer.dir / contract.ONNX_FILE
        stderr.print(f"[dim]exporting {loaded.family.name} to ONNX (opset {cfg.opset})...[/dim]")
        work.step("tracing the graph (torch.export, then ONNX)")
        metadata = metadata_for(loaded, source_id, source_kind, loaded.members, max_length=length)
        if export_graph(exported, loaded, onnx_path, cfg.opset, metadata):
            writer.summary["external_data"] = f"{onnx_path.name}.data"
        del exported  # a materialized SVE is a second model
        loader = _write_loader_files(loaded, writer.dir)
        if loaded.input_kind == "text":
            _write_tokenizer(loaded, length, writer.dir)
        work.step("checking parity against PyTorch")
        # torch runs first; its weights are then freed, and only then does ONNX Runtime load
        # the graph's: the two copies never coexist (peak memory ~1x the weights, not 2x)
        predictor = Predictor(
            writer.dir, device=cfg.device, threads=cfg.threads, open_session=False
        )
        examples = data if data is not None else synthetic_examples(loaded)
        reference = parity_reference(graph, loaded, predictor, examples, max_length=length)
        parameters = loaded.num_parameters()
        del graph
        _free_weights(loaded.model)  # the model is not run again here
        report = check_parity(reference, predictor, cfg.atol)
        if not report.passed:
            raise ParityError(
                f"ONNX output disagrees with PyTorch: {report.describe()}; no artifact written",
                hint="report this with the model; try another --opset, or loosen --atol only if "
                "the difference is harmless",
            )
        save_parity(writer.dir, report)
        work.step("measuring its latency")
        writer.summary["latency"] = measure_latency(
            predictor, latency_inputs(predictor, examples), cfg.threads
        )
        writer.summary.update(
            {
                "format": "onnx",
                "opset": cfg.opset,
                "members": loaded.members,
                "aggregation": contract.AGGREGATION,
                "parameters": parameters,
                "labels": list(loaded.labels),
                "input_kind": loaded.input_kind,
                **({"max_length": length} if length is not None else {}),
                "onnx_bytes": onnx_path.stat().st_size,
                "parity_examples": report.examples,
                "parity_max_abs_probs": report.max_abs_diff["probs"],
                "parity_max_abs_diff": dict(report.max_abs_diff),
                "parity_argmax_agreement": report.argmax_agreement,
                "parity_data": examples.spec,
            }
        )
        if loaded.calibration is not None:
            writer.summary["calibration"] = loaded.calibration.to_dict()
        writer.summary["loads_with"] = loader
        if not loader.startswith("optimum"):
            writer.warn(f"optimum's ORTModel cannot run this export: {loader}")
        stderr.print(f"[green]parity ok[/green]: {report.describe()}")
        work.step("writing the model card")
        write_model_card(
            writer.dir,
            # the metadata the graph holds (re-reading a graph without external data would
            # load its weights again)
            CardFacts("export", "onnx", writer.summary, source_path, metadata),
        )
