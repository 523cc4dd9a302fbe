"""`uqc svd-ensemble`: a Singular Value Ensemble of a fine-tuned classifier, trained jointly."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.errors import ConfigError
from uqcompress.steps import config as fields
from uqcompress.steps.common import (
    StepResult,
    build_or_reuse,
    load_training_data,
    with_planned_dtype,
)

HEADS = ("auto", "copy", "fresh")
# The default peak learning rate (--lr left out) by what the members' heads start from.
# Copies of a trained head: the singular values move a little around a trained classifier.
POST_HOC_LR = 1e-3
# Fresh heads (SVE as the fine-tuning of a pretrained backbone): measured on the real-data
# benchmark's val split (benchmarks/real_text_sweep.py, all-MiniLM-L6-v2 on BBC News, 3
# epochs), val NLL: 1e-3 1.046 (the old default: the fresh heads barely learned), 3e-3 0.348,
# 1e-2 0.269, 3e-2 0.240, 1e-1 diverged (val acc 0.59). 1e-2, not the val optimum 3e-2:
# that one sits one step from divergence on a 6-layer model, and larger models have more
# small singular values for a step to overshoot (docs/benchmarks.md).
FINETUNE_LR = 1e-2
# The default passes over the data (--epochs left out): 3 copying a trained head; fresh heads
# at 1e-2 reached val NLL 0.269 in 3 epochs and 0.251 in 6 (best epoch 6 of 6), so 6.
POST_HOC_EPOCHS = 3
FINETUNE_EPOCHS = 6
OTHER_LABELS_HINT = (
    "pass --heads fresh to give every member a new head for the data's classes (SVE as "
    "fine-tuning from a backbone trained on other labels), or fix the label column"
)


@dataclass(frozen=True)
class SVEConfig(fields.TrainingOptions):
    # runtime: the data's content fingerprints, which cover the columns used, are in the id
    data: str = fields.runtime(
        help="Training data: builtin:NAME\\[@split], FILE.csv, a "
        "folder or hf:NAME\\[/CONFIG]@SPLIT."
    )
    val: str | None = fields.runtime(None, help="Validation data, scored after every epoch.")
    members: int = fields.described(4, help="Ensemble members M.")
    sigma_init: float = fields.described(
        0.01, help="Relative noise on each member's initial singular values."
    )
    targets: str = fields.described(
        "default",
        help="Linears to decompose: default (attention Q/K/V/O and both MLP "
        "projections), attention, or comma-separated regular expressions over module names.",
    )
    rank: str = fields.described(
        "full", help="full, or N: keep the top N singular directions."
    )  # or a number: every target truncated to that rank
    # auto: fresh heads for a base without a trained head, else copies of its head
    heads: str = fields.added(
        "auto",
        help="The members' classifier heads: copy (each a copy of the model's trained "
        "head: SVE post hoc on a fine-tuned classifier), fresh (each member its own "
        "randomly initialised head for the data's classes, the model's head and labels "
        "discarded: SVE as fine-tuning from a pretrained backbone), or auto (fresh for a "
        "model without a trained head, else copy).",
    )
    # the paper's SVE: per-member biases only where the base has biases; True: on every
    # target (what every SVE before this option did, so it keeps their ids)
    extra_biases: bool = fields.added(
        False,
        omit=True,
        help="Give every target layer per-member biases, also layers without a bias "
        "(Llama/Qwen projections); counted apart from the paper's overhead. Default: "
        "the paper's SVE, members' biases only where the model has biases.",
    )
    # None: POST_HOC_EPOCHS or FINETUNE_EPOCHS, by the heads (`resolve_defaults`)
    epochs: int | None = fields.described(
        None, help="Passes over the data. Default: 3 for copied heads, 6 for fresh ones."
    )
    # None: POST_HOC_LR or FINETUNE_LR, by the heads (`resolve_defaults`, before the id is made)
    lr: float | None = fields.described(
        None,
        help="Peak learning rate (singular values, biases, heads). Default: 1e-3 for copied "
        "heads (SVE post hoc), 1e-2 for fresh ones (SVE as the fine-tuning).",
    )
    weight_decay: float = 0.01
    batch_size: int = 32
    seed: int = 0
    max_length: int | None = None
    text_column: str = fields.runtime("text")
    label_column: str = fields.runtime("label")
    text_pair_column: str | None = fields.runtime(None)
    precision: str = fields.described(
        "fp32", help="fp32, or bf16 / fp16 mixed precision (through accelerate)."
    )
    device: str = fields.device()
    threads: int | None = fields.threads()
    # the frozen base's dtype; the singular values and biases train in float32 whatever it is
    dtype: str = fields.dtype()

    def train_config(self) -> Any:
        """The training options; a config whose --lr or --epochs is not resolved yet
        (`resolve_defaults`) is checked with the post-hoc defaults, which no other option
        depends on."""
        from dataclasses import replace

        from uqcompress.engine.train import TrainConfig

        checked = replace(
            self,
            lr=POST_HOC_LR if self.lr is None else self.lr,
            epochs=POST_HOC_EPOCHS if self.epochs is None else self.epochs,
        )
        return TrainConfig.of(checked)

    def validate(self) -> None:
        problems = fields.problems(self)
        if not self.sigma_init >= 0:
            problems.add(
                f"--sigma-init {self.sigma_init} must be 0 or more (it is a noise scale)",
                hint="pass --sigma-init 0.01 (the paper finds 0.001 to 0.1 robust)",
            )
        if self.heads not in HEADS:
            problems.add(f"unknown --heads {self.heads!r}", hint=f"use one of: {', '.join(HEADS)}")
        problems.check(self.rank_value)
        if not self.targets.strip():
            problems.add("--targets is empty", hint="pass default, attention or a pattern")
        problems.check(self.train_config().validate)
        problems.raise_any()

    def rank_value(self) -> int | None:
        """None for full rank."""
        if self.rank == "full":
            return None
        try:
            value = int(self.rank)
        except ValueError:
            value = 0
        if value < 1:
            raise ConfigError(
                f"--rank {self.rank!r} is neither 'full' nor a positive number",
                hint="pass --rank full, or e.g. --rank 64",
            )
        return value


def run(
    model_path: Path, cfg: SVEConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.models.loading import head_never_trained, refuse_fused, resolve_model_source

    cfg.validate()
    cfg = fields.resolve_training(cfg)
    source = resolve_model_source(model_path)
    refuse_fused(source, "svd-ensemble")
    # decided before loading (the id depends on it through --lr/--epochs), checked after
    planned_fresh = gets_fresh_heads(cfg.heads, head_never_trained(source))
    defaulted = cfg.lr is None or cfg.epochs is None
    cfg = with_planned_dtype(resolve_defaults(cfg, planned_fresh), source)
    train_cfg = cfg.train_config()
    loaded_data = load_training_data(
        cfg.data, cfg.val, cfg.text_column, cfg.label_column, cfg.text_pair_column
    )
    train_data, val_data = loaded_data.train, loaded_data.val
    config = asdict(cfg)
    plan = OutputPlan(
        kind="model",
        step="svd-ensemble",
        config=config,
        id_config=fields.id_config(cfg, config),
        inputs=[source.ref],
        data=loaded_data.entries,
        device=cfg.device,
    )

    def build(writer: ArtifactWriter) -> None:
        from uqcompress.methods.sve import build_sve, parameter_report
        from uqcompress.steps.common import checkpointing, train_into

        built: dict[str, Any] = {}

        def to_sve(loaded: Any, new_head: bool) -> Any:
            built["base"] = loaded.model
            fresh = gets_fresh_heads(cfg.heads, new_head)
            built["heads"] = "fresh" if fresh else "copy"
            if defaulted and fresh != planned_fresh:  # a config.json that misnames its head
                built["defaults_for"] = "fresh" if planned_fresh else "copied"
            sve = build_sve(
                loaded,
                cfg.members,
                cfg.targets,
                cfg.rank_value(),
                cfg.sigma_init,
                cfg.seed,
                fresh_heads=fresh,
                extra_biases=cfg.extra_biases,
            )
            built["sve"] = sve.model
            return sve

        summary, warnings = train_into(
            source,
            train_cfg,
            train_data,
            val_data,
            writer.dir,
            max_length=cfg.max_length,
            transform=to_sve,
            description="svd-ensemble",
            checkpoint=checkpointing(cfg, writer),
            replace_head=cfg.heads == "fresh",
            labels_hint=None if cfg.heads == "fresh" else OTHER_LABELS_HINT,
            dtype=cfg.dtype,
        )
        report = parameter_report(built["base"], built["sve"])
        weights = writer.dir / "model.safetensors"
        summary.update(
            {
                "heads": built["heads"],
                "parameters_base": report.base,
                "parameters_trainable": report.trainable,
                "parameters_extra": report.extra,
                "parameter_overhead": round(report.overhead, 6),  # as the paper counts it
                "parameters_added_biases": report.added_biases,
                "parameter_overhead_with_added_biases": round(report.overhead_with_added_biases, 6),
                "stored_values": report.stored,
                "stored_values_base": report.stored_base,
                "stored_ratio_to_base": round(report.stored_ratio, 4),
                "stored_bytes": weights.stat().st_size,
            }
        )
        writer.summary.update(summary)
        for warning in warnings:
            writer.warn(warning)
        if "defaults_for" in built:
            writer.warn(
                f"--lr {cfg.lr:g} and --epochs {cfg.epochs} are the defaults for "
                f"{built['defaults_for']} heads, decided from the model's config.json before "
                f"loading, but the members got {built['heads']} heads; pass --lr and --epochs "
                "(or --heads) to choose"
            )

    return build_or_reuse(plan, out, force, build)


def gets_fresh_heads(heads: str, head_untrained: bool) -> bool:
    """Whether the members get fresh heads: --heads fresh, or auto on a model whose head
    was never trained."""
    return heads == "fresh" or (heads == "auto" and head_untrained)


def resolve_defaults(cfg: SVEConfig, fresh: bool) -> SVEConfig:
    """`cfg` with --lr and --epochs as the run uses them: as given, else the fine-tuning
    defaults (FINETUNE_LR, FINETUNE_EPOCHS) when the members get `fresh` heads and the
    post-hoc ones (POST_HOC_LR, POST_HOC_EPOCHS) when they copy a trained one. Resolved
    before the artifact id is made, so a post-hoc SVE keeps the id it had when 1e-3 and 3
    were every SVE's defaults."""
    from dataclasses import replace

    lr = cfg.lr if cfg.lr is not None else (FINETUNE_LR if fresh else POST_HOC_LR)
    epochs = cfg.epochs
    if epochs is None:
        epochs = FINETUNE_EPOCHS if fresh else POST_HOC_EPOCHS
    return replace(cfg, lr=lr, epochs=epochs)
