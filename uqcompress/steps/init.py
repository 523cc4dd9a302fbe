"""`uqc init`: a new, untrained model artifact from a family preset."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.errors import ConfigError
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse


def parse_sets(values: list[str]) -> dict[str, Any]:
    """`--set key=value` pairs; values are parsed as JSON when they can be (ints, floats)."""
    import json

    parsed: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r} is not key=value", hint="e.g. --set hidden_size=64")
        try:
            parsed[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            parsed[key.strip()] = raw
    return parsed


def split_labels(text: str | None) -> list[str] | None:
    """`--labels neg,pos`: comma-separated class names."""
    return [x.strip() for x in text.split(",")] if text is not None else None


@dataclass(frozen=True)
class InitConfig:
    family: str = fields.described(
        help="Model family. Text encoders: bert, roberta, xlm-roberta, distilbert, electra. "
        "Decoders: llama, qwen2, qwen3, mistral. Images: vit, deit, dinov2."
    )
    preset: str = fields.described("tiny", help="Size preset: tiny, small or base.")
    overrides: dict[str, Any] = fields.option(
        name="set",
        kind=list[str],
        parse=lambda v: parse_sets(v or []),
        default_factory=dict,
        help="Override a transformers config value, key=value "
        "(repeatable), e.g. --set num_hidden_layers=6.",
    )
    labels: list[str] | None = fields.option(
        None, kind=str | None, parse=split_labels, help="Comma-separated class names, e.g. neg,pos."
    )
    num_labels: int | None = fields.described(
        None, help="Number of classes (names then come from the data)."
    )
    image_size: int | None = fields.described(
        None,
        help="Image families: input side in pixels. Default: the preset's (8 for tiny, "
        "224 for base).",
    )
    patch_size: int | None = fields.described(
        None,
        help="Image families: patch side in pixels. Default: the preset's (2 for tiny, "
        "16 for ViT/DeiT base, 14 for DINOv2).",
    )
    seed: int = 0
    # the weights' dtype as written (auto: float32, a new model has no checkpoint to follow)
    dtype: str = fields.dtype()

    def validate(self) -> None:
        problems = fields.problems(self)
        if (
            self.labels is not None
            and self.num_labels is not None
            and len(self.labels) != self.num_labels
        ):
            problems.add(
                f"--labels names {len(self.labels)} classes but --num-labels is {self.num_labels}",
                hint="pass only one of --labels and --num-labels",
            )
        if self.labels is not None:
            if len(set(self.labels)) != len(self.labels) or any(not x for x in self.labels):
                problems.add(
                    f"--labels {','.join(self.labels)} has empty or repeated names",
                    hint="pass distinct names, e.g. --labels neg,pos",
                )
        elif self.num_labels is None:
            problems.add(
                "the number of classes is unknown",
                hint="pass --labels a,b,c or --num-labels N (names then come from the data)",
            )
        problems.raise_any()

    def resolved_labels(self) -> list[str]:
        self.validate()
        if self.labels is not None:
            return list(self.labels)
        assert self.num_labels is not None
        return [f"LABEL_{i}" for i in range(self.num_labels)]


def run(cfg: InitConfig, out: Path | None = None, force: bool = False) -> StepResult:
    from uqcompress.models.factory import check_overrides, create_model
    from uqcompress.models.families import family_by_name

    labels = cfg.resolved_labels()
    family = family_by_name(cfg.family)
    if cfg.preset not in family.presets:
        raise ConfigError(
            f"unknown preset {cfg.preset!r} for family {cfg.family}",
            hint=f"use --preset with one of: {', '.join(family.presets)}",
        )
    # Before the id is computed: an artifact a typo once made must not be reused silently.
    check_overrides(family, cfg.preset, cfg.overrides)
    if cfg.dtype == "auto":
        cfg = replace(cfg, dtype="float32")
    config = {**asdict(cfg), "labels": labels}
    # float32 is left out of the id (`fields.dtype`): inits made before --dtype keep theirs
    plan = OutputPlan(
        kind="model", step="init", config=config, id_config=fields.id_config(cfg, config)
    )

    def build(writer: ArtifactWriter) -> None:
        from uqcompress.models.loading import save_model
        from uqcompress.models.summary import model_summary
        from uqcompress.runtime.console import activity

        with activity(f"creating a {cfg.family} model") as work:
            work.step("building it from its config")
            loaded = create_model(
                cfg.family,
                labels,
                cfg.preset,
                cfg.overrides,
                cfg.image_size,
                cfg.patch_size,
                cfg.seed,
                cfg.dtype,
            )
            work.step("writing the model artifact")
            save_model(loaded, writer.dir)
        writer.summary.update(model_summary(loaded))
        writer.summary["trained"] = False

    return build_or_reuse(plan, out, force, build)
