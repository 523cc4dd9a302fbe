"""`uqc import`: a transformers directory or a GGUF file becomes a model artifact (a hashed
lineage root)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.errors import ArtifactError
from uqcompress.models.summary import model_summary
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse

if TYPE_CHECKING:
    from uqcompress.models.loading import LoadedModel


@dataclass(frozen=True)
class ImportConfig:
    # Only which files were read decides the result (their fingerprint is the id).
    trust_remote_code: bool = fields.runtime(
        False,
        help="Accept a checkpoint whose config asks to run its own code (auto_map). uqc "
        "never runs that code; it loads the weights with transformers' classes for the family.",
    )
    # what the weights are loaded and written as (auto: a >1B decoder's own half dtype, so a
    # 7B bfloat16 checkpoint imports in 14 GB, not 28); GGUF files are always float32
    dtype: str = fields.dtype()

    def validate(self) -> None:
        fields.problems(self).raise_any()


def run(
    source: Path,
    out: Path | None = None,
    force: bool = False,
    trust_remote_code: bool = False,
    dtype: str = "auto",
) -> StepResult:
    from uqcompress.models.gguf import find_gguf
    from uqcompress.models.loading import load_model, planned_dtype, resolve_model_source

    gguf_file = find_gguf(Path(source))
    if gguf_file is not None:
        return _import_gguf(gguf_file, out, force)
    model_source = resolve_model_source(source, trust_remote_code=trust_remote_code)
    if model_source.is_artifact:
        raise ArtifactError(
            f"{source} is already a uqc model artifact",
            hint="use it directly as the input of the next step",
        )
    fingerprint = model_source.ref.id.removeprefix("dir-")
    planned = planned_dtype(model_source, dtype)
    config = {"source": str(Path(source).resolve()), "source_fingerprint": fingerprint}
    id_config = {"source_fingerprint": fingerprint}
    if planned != "float32":  # float32 left out: imports made before --dtype keep their ids
        config["dtype"] = id_config["dtype"] = planned
    plan = OutputPlan(kind="model", step="import", config=config, id_config=id_config)

    def build(writer: ArtifactWriter) -> None:
        from uqcompress.runtime.console import activity

        with activity(f"importing {source}") as work:
            work.step("loading the checkpoint")
            loaded = load_model(model_source, planned)
            work.step("writing the model artifact")
            _write(writer, loaded, source, fingerprint)

    return build_or_reuse(plan, out, force, build)


def _import_gguf(file: Path, out: Path | None, force: bool) -> StepResult:
    """A GGUF file (models/gguf.py): its header is checked before anything is planned, its
    weights are dequantized to float32, and the summary records how the file stored them."""
    from uqcompress.artifacts.hashing import sha256_file
    from uqcompress.models.gguf import describe_gguf, load_gguf

    described = describe_gguf(file)
    fingerprint = sha256_file(file)
    plan = OutputPlan(
        kind="model",
        step="import",
        config={"source": str(file.resolve()), "source_fingerprint": fingerprint},
        id_config={"source_fingerprint": fingerprint},
    )

    def build(writer: ArtifactWriter) -> None:
        from uqcompress.runtime.console import activity

        with activity(f"importing {file}") as work:
            work.step("reading and dequantizing the GGUF file")
            loaded = load_gguf(described)
            work.step("writing the model artifact")
            _write(writer, loaded, file, fingerprint)
        writer.summary.update(described.summary())
        if described.quantized:
            writer.warn(
                f"{file} stores {described.quantization} weights; they were dequantized to "
                "float32 (the quantization error stays in the weights)"
            )
        elif described.quantization != "F32":
            writer.warn(f"{file} stores {described.quantization} weights; loaded as float32")

    return build_or_reuse(plan, out, force, build)


def _write(writer: ArtifactWriter, loaded: LoadedModel, source: Path, fingerprint: str) -> None:
    """The imported model, its summary and the warnings its loading raised."""
    from uqcompress.models.loading import save_model

    # the same model, not a derived one: a calibration written by export stays
    save_model(loaded, writer.dir, keep_calibration=True)
    writer.summary.update(model_summary(loaded))
    if loaded.calibration is not None:
        writer.summary["calibration"] = loaded.calibration.to_dict()
    if loaded.new_head_keys:
        writer.summary["classifier_initialised"] = True
        writer.warn(
            f"{source} has no classifier weights ({', '.join(loaded.new_head_keys)}); a new "
            f"head for {len(loaded.labels)} classes was initialised at random: fine-tune "
            "before use"
        )
    if loaded.checkpoint_dtype is not None:
        writer.summary["checkpoint_dtype"] = loaded.checkpoint_dtype
        writer.summary["loaded_dtype"] = loaded.dtype
    for note in loaded.notes:
        writer.warn(note)
    writer.summary["source_fingerprint"] = fingerprint
