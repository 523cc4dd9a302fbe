"""`uqc init`: a new, untrained model artifact from a family preset."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.errors import ConfigError
from uqcompress.steps.common import StepResult, build_or_reuse


@dataclass(frozen=True)
class InitConfig:
    family: str
    preset: str = "tiny"
    overrides: dict[str, Any] = field(default_factory=dict)
    labels: list[str] | None = None
    num_labels: int | None = None
    image_size: int | None = None
    patch_size: int | None = None
    seed: int = 0

    def resolved_labels(self) -> list[str]:
        if (
            self.labels is not None
            and self.num_labels is not None
            and len(self.labels) != self.num_labels
        ):
            raise ConfigError(
                f"--labels names {len(self.labels)} classes but --num-labels is {self.num_labels}",
                hint="pass only one of --labels and --num-labels",
            )
        if self.labels is not None:
            if len(set(self.labels)) != len(self.labels) or any(not x for x in self.labels):
                raise ConfigError(
                    f"--labels {','.join(self.labels)} has empty or repeated names",
                    hint="pass distinct names, e.g. --labels neg,pos",
                )
            return list(self.labels)
        if self.num_labels is not None:
            return [f"LABEL_{i}" for i in range(self.num_labels)]
        raise ConfigError(
            "the number of classes is unknown",
            hint="pass --labels a,b,c or --num-labels N (names then come from the data)",
        )


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
    config = {**asdict(cfg), "labels": labels}
    plan = OutputPlan(kind="model", step="init", config=config, id_config=config)

    def build(writer: ArtifactWriter) -> None:
        from uqcompress.models.loading import save_model

        loaded = create_model(
            cfg.family,
            labels,
            cfg.preset,
            cfg.overrides,
            cfg.image_size,
            cfg.patch_size,
            cfg.seed,
        )
        save_model(loaded, writer.dir)
        writer.summary.update(model_summary(loaded))
        writer.summary["trained"] = False

    return build_or_reuse(plan, out, force, build)


def model_summary(loaded: Any) -> dict[str, Any]:
    """The at-a-glance numbers of a model artifact."""
    from uqcompress.models.kinds import kind_summary

    config = loaded.config
    return {
        "family": loaded.family.name,
        "parameters": loaded.num_parameters(),
        "layers": int(config.num_hidden_layers),
        "heads": int(config.num_attention_heads),
        "hidden": int(config.hidden_size),
        "labels": list(loaded.labels),
        **kind_summary(loaded),  # members, method and layout numbers of an ensemble
    }
