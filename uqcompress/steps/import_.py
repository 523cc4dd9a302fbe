"""`uqc import`: a transformers directory becomes a model artifact (a hashed lineage root)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.errors import ArtifactError
from uqcompress.models.summary import model_summary
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse


@dataclass(frozen=True)
class ImportConfig:
    # Only which files were read decides the result (their fingerprint is the id).
    trust_remote_code: bool = fields.runtime(
        False,
        help="Accept a checkpoint whose config asks to run its own code (auto_map). uqc "
        "never runs that code; it loads the weights with transformers' classes for the family.",
    )

    def validate(self) -> None:
        fields.problems(self).raise_any()


def run(
    source: Path, out: Path | None = None, force: bool = False, trust_remote_code: bool = False
) -> StepResult:
    from uqcompress.models.loading import load_model, resolve_model_source, save_model

    model_source = resolve_model_source(source, trust_remote_code=trust_remote_code)
    if model_source.is_artifact:
        raise ArtifactError(
            f"{source} is already a uqc model artifact",
            hint="use it directly as the input of the next step",
        )
    fingerprint = model_source.ref.id.removeprefix("dir-")
    plan = OutputPlan(
        kind="model",
        step="import",
        config={"source": str(Path(source).resolve()), "source_fingerprint": fingerprint},
        id_config={"source_fingerprint": fingerprint},
    )

    def build(writer: ArtifactWriter) -> None:
        loaded = load_model(model_source)
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
            writer.summary["loaded_dtype"] = "float32"
        for note in loaded.notes:
            writer.warn(note)
        writer.summary["source_fingerprint"] = fingerprint

    return build_or_reuse(plan, out, force, build)
