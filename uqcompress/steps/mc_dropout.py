"""`uqc mc-dropout`: MC Dropout, a classifier sampled S times with dropout on at inference."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.errors import ConfigError
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse, with_planned_dtype


@dataclass(frozen=True)
class MCDropoutConfig:
    samples: int = fields.described(10, help="Dropout samples S averaged per input (members).")
    rate: float | None = fields.described(
        None,
        help="Drop probability p in [0, 1) at every site. Default: the model's own "
        "hidden_dropout_prob (0.1 for BERT).",
    )  # None: the model's own hidden_dropout_prob (recorded resolved)
    seed: int = fields.described(
        0, help="Seed of the per-example dropout masks."
    )  # of the per-example dropout masks
    device: str = fields.device("cpu")
    threads: int | None = fields.threads()
    dtype: str = fields.dtype()

    def validate(self) -> None:
        problems = fields.problems(self)
        if self.rate is not None and not 0 <= self.rate < 1:
            problems.add(
                f"--rate {self.rate} is outside [0, 1) (the probability of dropping a unit)",
                hint="pass --rate 0.1, or drop --rate for the model's own dropout rate",
            )
        problems.raise_any()


def resolve(source: Any, cfg: MCDropoutConfig) -> MCDropoutConfig:
    """Refuse what MC Dropout cannot take before any work (ensembles, unmapped families, a
    model without dropout and no --rate), and resolve the rate from the model's config."""
    from uqcompress.models.families import FAMILIES
    from uqcompress.models.loading import raw_config, refuse_fused
    from uqcompress.models.mc_dropout_model import MC_DROPOUT_FAMILIES, config_rate

    refuse_fused(source, "mc-dropout")
    raw = raw_config(source.path)
    model_type = raw.get("model_type")
    family = next((f.name for f in FAMILIES.values() if model_type in f.model_types), None)
    if family not in MC_DROPOUT_FAMILIES:
        raise ConfigError(
            f"{source.path} is a {family or model_type} model; MC Dropout supports the "
            f"{' and '.join(MC_DROPOUT_FAMILIES)} families",
            hint="use a bert or vit model, or a deep ensemble (uqc eval M1 M2 M3)",
        )
    if cfg.rate is not None:
        return cfg
    from transformers import AutoConfig

    # transformers' config (not config.json alone, which omits values at their defaults)
    rate = config_rate(AutoConfig.from_pretrained(str(source.path)))
    if rate <= 0:
        raise ConfigError(
            f"{source.path} has hidden_dropout_prob {rate:g} (it trained without dropout), so "
            "MC Dropout at its own rate would repeat the base model",
            hint="pass --rate 0.1",
        )
    return replace(cfg, rate=rate)


def run(
    model_path: Path, cfg: MCDropoutConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.models.loading import resolve_model_source

    cfg.validate()
    source = resolve_model_source(model_path)
    rate_given = cfg.rate is not None
    cfg = with_planned_dtype(resolve(source, cfg), source)
    config = asdict(cfg)
    plan = OutputPlan(
        kind="model",
        step="mc-dropout",
        config=config,
        id_config=fields.id_config(cfg, config),
        inputs=[source.ref],
        device=cfg.device,
    )

    def build(writer: ArtifactWriter) -> None:
        from uqcompress.methods.mc_dropout import build_mc_dropout
        from uqcompress.models.loading import calibration_dropped, load_model, save_model
        from uqcompress.models.summary import model_summary
        from uqcompress.runtime.console import activity

        with activity("making an MC Dropout model") as work:
            work.step("loading the model")
            base = load_model(source, cfg.dtype)
            if (dropped := calibration_dropped(base, source.path)) is not None:
                writer.warn(dropped)
            assert cfg.rate is not None
            loaded = build_mc_dropout(base, cfg.samples, cfg.rate, cfg.seed)
            work.step("writing the model artifact")
            save_model(loaded, writer.dir)
        summary = model_summary(loaded)
        summary["rate_from"] = "--rate" if rate_given else "hidden_dropout_prob"
        writer.summary.update(summary)
        if cfg.rate == 0:
            writer.warn("--rate 0 drops nothing: every sample is the base model")

    return build_or_reuse(plan, out, force, build)
