"""Create new, untrained classifiers from a family preset (what `uqc init` runs)."""

from __future__ import annotations

import difflib
import math
from typing import Any

from uqcompress.errors import ConfigError
from uqcompress.models.families import Family, family_by_name
from uqcompress.models.loading import LoadedModel, first_line
from uqcompress.models.preprocessing import ImagePreprocessing

# Sizes that must be positive integers for a model to exist at all.
POSITIVE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "image_size",
    "patch_size",
    "num_channels",
    "vocab_size",
    "max_position_embeddings",
)

# `uqc init` builds random models for tests, demos and experiments (real ones are imported):
# far beyond any of those, these stop a typo such as num_hidden_layers=100000 (12.5 GB of
# weights, then a SafetensorError) before any memory is allocated.
SIZE_LIMITS = {
    "num_hidden_layers": 256,
    "hidden_size": 16_384,
    "num_attention_heads": 256,
    "num_key_value_heads": 256,
    "intermediate_size": 65_536,
    "vocab_size": 1_000_000,
    "max_position_embeddings": 131_072,
    "image_size": 4096,
    "num_channels": 64,
}
# The weights uqc init builds at most: 1B parameters in float32, 2B in a half dtype.
MAX_INIT_BYTES = 4_000_000_000

# Declared config keys that other flags own: --set would fight them.
OWNED_BY_FLAGS = {
    "id2label": "--labels",
    "label2id": "--labels",
    "num_labels": "--labels or --num-labels",
}
# Bookkeeping transformers writes itself; setting it changes nothing a user wants.
NOT_SETTABLE = ("transformers_version", "model_type", "_name_or_path")


def known_config_keys(family: Family, preset: str) -> list[str]:
    """The keys `--set` accepts for a family: what its transformers config declares (the
    preset's config as saved, plus attribute aliases) and what its model reads on top."""
    config = family.build_config(preset, {}, ["a", "b"])
    keys = set(config.to_dict()) | set(getattr(config, "attribute_map", {}))
    keys |= set(family.extra_config_keys)  # read by the model, not declared by its config
    keys -= set(NOT_SETTABLE) | set(OWNED_BY_FLAGS)
    return sorted(k for k in keys if not k.startswith("_"))


def check_overrides(family: Family, preset: str, overrides: dict[str, Any]) -> None:
    """Refuse a `--set` key the config does not know (a typo would be silently ignored:
    transformers stores unknown keys as inert attributes) and non-finite numbers."""
    known: list[str] | None = None
    for key, value in overrides.items():
        if key in OWNED_BY_FLAGS:
            raise ConfigError(
                f"--set {key} is not a config value to set by hand",
                hint=f"set the classes with {OWNED_BY_FLAGS[key]}",
            )
        if known is None:
            known = known_config_keys(family, preset)
        if key not in known:
            close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
            also = f" (also close: {', '.join(close[1:])})" if close[1:] else ""
            hint = (
                f"did you mean {close[0]}?{also}"
                if close
                else f"a {family.name} config has: {', '.join(known)}"
            )
            raise ConfigError(f"--set {key}: unknown {family.name} config key", hint=hint)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(
                f"--set {key}={value} is not a finite number",
                hint=f"pass a finite number for {key}",
            )


def create_model(
    family_name: str,
    labels: list[str],
    preset: str = "tiny",
    overrides: dict[str, Any] | None = None,
    image_size: int | None = None,
    patch_size: int | None = None,
    seed: int = 0,
    dtype: str = "float32",
) -> LoadedModel:
    """A randomly initialised classifier; the same arguments always give the same weights.
    `dtype` ("float32", "bfloat16", "float16"): built directly in it (a half-precision model
    never exists in float32 first; its random values are drawn in that dtype)."""
    import torch

    from uqcompress.models.precision import torch_dtype

    family = family_by_name(family_name)
    if preset not in family.presets:
        raise ConfigError(
            f"unknown preset {preset!r} for family {family_name}",
            hint=f"use --preset with one of: {', '.join(family.presets)}",
        )
    if family.input_kind == "text" and (image_size is not None or patch_size is not None):
        raise ConfigError(
            "--image-size/--patch-size apply to image families only",
            hint="drop them, or use an image family (vit, deit, dinov2)",
        )
    if len(labels) < 2:
        raise ConfigError(
            f"a classifier needs at least 2 labels, got {len(labels)}",
            hint="pass --labels a,b[,c...] or --num-labels N with N >= 2",
        )
    for flag, value in (("--image-size", image_size), ("--patch-size", patch_size)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value} must be at least 1", hint=f"pass a positive {flag}")
    check_overrides(family, preset, overrides or {})
    try:
        config = family.build_config(preset, overrides or {}, labels, image_size, patch_size)
    except ConfigError:
        raise
    except Exception as exc:  # transformers/huggingface_hub validate configs in many ways
        raise ConfigError(
            f"invalid model config: {first_line(exc)}", hint="check the --set values"
        ) from exc
    for key in POSITIVE_KEYS:
        value = getattr(config, key, None)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise ConfigError(
                f"config value {key}={value!r} must be a positive integer",
                hint=f"pass --set {key}=N with N >= 1",
            )
    if family.input_kind == "text":
        from uqcompress.models.tokenizer import shipped_vocab_size

        if config.vocab_size < shipped_vocab_size():
            raise ConfigError(
                f"vocab_size {config.vocab_size} is smaller than the shipped tokenizer's "
                f"{shipped_vocab_size()} tokens",
                hint=f"drop --set vocab_size or pass at least {shipped_vocab_size()}",
            )
    if config.hidden_size % config.num_attention_heads != 0:
        raise ConfigError(
            f"hidden_size {config.hidden_size} is not a multiple of num_attention_heads "
            f"{config.num_attention_heads}",
            hint="choose --set values where the heads divide the hidden size",
        )
    _check_size(family, config, dtype)
    config.dtype = torch_dtype(dtype)  # transformers builds the modules in the config's dtype
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = family.classifier_class()(config).to(torch_dtype(dtype))
        except Exception as exc:  # a config transformers accepted but cannot build
            raise ConfigError(
                f"cannot build a {family_name} model from this config: {first_line(exc)}",
                hint="check the --set values",
            ) from exc
    model.eval()
    loaded = LoadedModel(
        model=model, family=family, config=model.config, labels=list(labels), dtype=dtype
    )
    if family.input_kind == "text":
        from uqcompress.models.tokenizer import shipped_tokenizer

        loaded.tokenizer = shipped_tokenizer(family.max_length(config) or 512)
    else:
        loaded.preprocessing = ImagePreprocessing.default_for(
            int(config.image_size), int(config.num_channels)
        )
    return loaded


def _check_size(family: Family, config: Any, dtype: str = "float32") -> None:
    """Refuse a config above `SIZE_LIMITS`, or one whose weights in `dtype` would exceed
    `MAX_INIT_BYTES` (counted on the meta device: nothing is allocated)."""
    import torch

    for key, limit in SIZE_LIMITS.items():
        value = getattr(config, key, None)
        if isinstance(value, int) and value > limit:
            raise ConfigError(
                f"config value {key}={value} is more than {limit:,}, the most uqc init builds",
                hint=f"pass --set {key}=N with N <= {limit}, or uqc import a real checkpoint",
            )
    try:
        with torch.device("meta"):
            skeleton = family.classifier_class()(config)
    except Exception:
        return  # building it for real reports what is wrong
    parameters = sum(p.numel() for p in skeleton.parameters())
    size = parameters * (4 if dtype == "float32" else 2)
    if size > MAX_INIT_BYTES:
        raise ConfigError(
            f"this config has {parameters:,} parameters ({size / 2**30:.1f} GiB in {dtype}), "
            f"more than the {MAX_INIT_BYTES / 2**30:.1f} GiB of weights uqc init builds",
            hint="choose smaller --set values, or uqc import a real checkpoint",
        )
