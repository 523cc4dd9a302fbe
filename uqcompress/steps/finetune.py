"""`uqc finetune`: train a model artifact on labelled data with the shared training loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse, load_training_data


@dataclass(frozen=True)
class FinetuneConfig:
    # runtime: the data's content fingerprints, which cover the columns used, are in the id
    data: str = fields.runtime()
    val: str | None = fields.runtime(None)
    epochs: int = 3
    lr: float = 5e-4
    weight_decay: float = 0.01
    batch_size: int = 32
    seed: int = 0
    max_length: int | None = None
    text_column: str = fields.runtime("text")
    label_column: str = fields.runtime("label")
    precision: str = "fp32"
    device: str = fields.device()
    threads: int | None = fields.threads()

    def train_config(self) -> Any:
        from uqcompress.train import TrainConfig

        return TrainConfig(
            epochs=self.epochs,
            lr=self.lr,
            weight_decay=self.weight_decay,
            batch_size=self.batch_size,
            seed=self.seed,
            device=self.device,
            precision=self.precision,
        )

    def validate(self) -> None:
        problems = fields.problems(self)
        problems.check(self.train_config().validate)
        problems.raise_any()


def run(
    model_path: Path, cfg: FinetuneConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.models.loading import resolve_model_source

    cfg.validate()  # bad values fail before any data is read
    train_cfg = cfg.train_config()
    members = _is_members(model_path)
    source = None if members else resolve_model_source(model_path)
    if source is not None:
        _refuse_student(source)
    loaded_data = load_training_data(cfg.data, cfg.val, cfg.text_column, cfg.label_column)
    train_data, val_data = loaded_data.train, loaded_data.val
    config = asdict(cfg)
    plan = OutputPlan(
        kind="model",
        step="finetune",
        config=config,
        id_config=fields.id_config(cfg, config),
        inputs=[source.ref] if source is not None else [],
        data=loaded_data.entries,
        device=cfg.device,
    )

    if members:
        return _run_members(model_path, cfg, train_cfg, train_data, val_data, plan, out, force)

    def build(writer: ArtifactWriter) -> None:
        summary, warnings = _train_into(source, cfg, train_cfg, train_data, val_data, writer.dir)
        writer.summary.update(summary)
        for warning in warnings:
            writer.warn(warning)

    return build_or_reuse(plan, out, force, build)


def _refuse_student(source: Any) -> None:
    """A DIRECTOR student trains by distillation from its teacher, not on labels alone."""
    from uqcompress.errors import ConfigError
    from uqcompress.models.loading import ensemble_kind

    if ensemble_kind(source) == "uqc_director":
        raise ConfigError(
            f"{source.path} is a DIRECTOR student; finetune would train it without its teacher",
            hint="distil again with uqc distill-director TEACHER --epochs N",
        )


def _adopt_labels(loaded: Any, labels: list[str]) -> None:
    loaded.labels = list(labels)
    loaded.model.config.id2label = dict(enumerate(labels))
    loaded.model.config.label2id = {name: i for i, name in enumerate(labels)}


def _head_is_untrained(source: Any, loaded: Any) -> bool:
    """The checkpoint had no classifier weights, now or when it was imported."""
    if loaded.new_head_keys:
        return True
    if source.is_artifact:
        from uqcompress.artifacts import read_manifest

        manifest = read_manifest(source.path)
        # Only an import records a head that was never trained; a finetune's flag says it
        # initialised one and then trained it.
        return manifest.step == "import" and bool(manifest.summary.get("classifier_initialised"))
    return False


def _class_count(data: Any) -> int:
    """How many classes the training data names (its class names, else distinct labels)."""
    if data.label_names is not None:
        return len(data.label_names)
    return len({str(v) for v in data.labels or []})


def _train_into(
    source: Any,
    cfg: FinetuneConfig,
    train_cfg: Any,
    train_data: Any,
    val_data: Any,
    directory: Path,
    transform: Callable[[Any], Any] | None = None,
    description: str = "finetune",
) -> tuple[dict[str, Any], list[str]]:
    """Fine-tune the model of `source` and save it into `directory`; returns the summary and
    the warnings for its manifest. `transform` turns the loaded, label-checked model into the
    one to train (the SVE step builds its ensemble there)."""
    summary: dict[str, Any] = {}
    warnings: list[str] = []
    from uqcompress.data.encoding import encode, make_loader
    from uqcompress.data.labels import map_labels
    from uqcompress.inference import predict_logits
    from uqcompress.models.loading import (
        calibration_dropped,
        has_default_labels,
        load_model,
        save_model,
    )
    from uqcompress.steps.init import model_summary
    from uqcompress.train import train
    from uqcompress.uq.metrics import accuracy, softmax

    loaded = load_model(source)
    if (dropped := calibration_dropped(loaded, source.path)) is not None:
        warnings.append(dropped)
    from uqcompress.data.encoding import check_input_kind

    for each in [train_data] + ([val_data] if val_data is not None else []):
        check_input_kind(each, loaded.input_kind, loaded.family.name)
    if _head_is_untrained(source, loaded):
        # An untrained head's size and label names came from the checkpoint's config, not
        # from any task: the training data decides both.
        from uqcompress.models.surgery import replace_classifier

        count = _class_count(train_data)
        replace_classifier(loaded, [f"LABEL_{i}" for i in range(count)], cfg.seed)
        summary["classifier_initialised"] = True
        warnings.append(
            f"{source.path} had no trained classifier; a new head for {count} classes "
            f"(from {train_data.spec}) was trained from scratch"
        )
    mapping = map_labels(train_data, loaded.labels, has_default_labels(loaded.labels))
    if mapping.adopted_labels is not None:
        _adopt_labels(loaded, mapping.adopted_labels)
        summary["labels_from_data"] = True
        warnings.append(
            f"the model had placeholder labels; adopted {len(loaded.labels)} label names "
            f"from {train_data.spec}: {', '.join(loaded.labels)}"
        )
    if transform is not None:
        loaded = transform(loaded)
    encoded = encode(train_data, loaded, mapping.ids, cfg.max_length)
    if encoded.truncated:
        summary["truncated"] = encoded.truncated
        warnings.append(f"{encoded.truncated} training texts were truncated to the max length")
    loader = make_loader(encoded, cfg.batch_size, shuffle=True, seed=cfg.seed)

    validate: Any = None
    if val_data is not None:
        val_ids = map_labels(val_data, loaded.labels, placeholder=False).ids
        val_encoded = encode(val_data, loaded, val_ids, cfg.max_length)

        def validate(model: Any) -> dict[str, float]:
            logits = predict_logits(model, val_encoded, device=cfg.device).member_logits
            return {"acc": accuracy(softmax(logits).mean(axis=1), val_ids)}

    result = train(
        loaded.model,
        loader,
        train_cfg,
        validate=validate,
        description=f"{description} {loaded.family.name}",
    )
    trained: Any = loaded.model
    trained.to("cpu")
    save_model(loaded, directory)
    summary.update(model_summary(loaded))
    summary.update(
        {
            "trained": True,
            "epochs": cfg.epochs,
            "steps": result.steps,
            "train_examples": len(train_data),
            "train_seconds": round(result.seconds, 3),
            "loss_curve": [round(v, 6) for v in result.loss_curve],
        }
    )
    if result.val_curve:
        summary["val_acc_curve"] = [round(m["acc"], 6) for m in result.val_curve]
        summary["val_acc"] = round(result.val_curve[-1]["acc"], 6)
    return summary, warnings


def _is_members(path: Path) -> bool:
    from uqcompress.artifacts import MANIFEST_NAME, read_manifest

    return (path / MANIFEST_NAME).is_file() and read_manifest(path).kind == "members"


def _run_members(
    path: Path,
    cfg: FinetuneConfig,
    train_cfg: Any,
    train_data: Any,
    val_data: Any,
    plan: OutputPlan,
    out: Path | None,
    force: bool,
) -> StepResult:
    """Fine-tune every member of a members artifact: member m with seed + m (its own
    initial head noise, dropout and data order), into a new members artifact."""
    from dataclasses import replace

    from uqcompress.artifacts import SourceRef, open_artifact
    from uqcompress.models.loading import resolve_model_source

    artifact = open_artifact(path, expect_kind="members")
    count = int(artifact.manifest.summary["members"])
    plan = replace(plan, kind="members", inputs=[SourceRef.of("members", artifact)])

    def build(writer: ArtifactWriter) -> None:
        curves = []
        for m in range(count):
            member_cfg = replace(cfg, seed=cfg.seed + m)
            summary, warnings = _train_into(
                resolve_model_source(path / f"member{m}"),
                member_cfg,
                replace(train_cfg, seed=cfg.seed + m),
                train_data,
                val_data,
                writer.dir / f"member{m}",
            )
            curves.append(summary)
            for warning in dict.fromkeys(warnings):
                writer.warn(f"member {m}: {warning}")
        first = curves[0]
        writer.summary.update(
            {
                **{
                    k: v
                    for k, v in artifact.manifest.summary.items()
                    if k
                    in (
                        "members",
                        "select",
                        "method",
                        "heads_per_member",
                        "kept_heads",
                        "jaccard_per_layer",
                        "jaccard_mean",
                        "family",
                    )
                },
                "labels": first["labels"],
                "trained": True,
                "epochs": cfg.epochs,
                "train_seconds": round(sum(c["train_seconds"] for c in curves), 3),
                "loss_curves": [c["loss_curve"] for c in curves],
                "parameters_per_member": [c["parameters"] for c in curves],
            }
        )
        if all("val_acc" in c for c in curves):
            writer.summary["val_acc_per_member"] = [c["val_acc"] for c in curves]

    return build_or_reuse(plan, out, force, build)
