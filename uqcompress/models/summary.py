"""The at-a-glance numbers of a model artifact's summary, shared by every step that writes one."""

from __future__ import annotations

from typing import Any

from uqcompress.models.kinds import kind_summary


def model_summary(loaded: Any) -> dict[str, Any]:
    """The at-a-glance numbers of a model artifact (`loaded`: a LoadedModel)."""
    config = loaded.config
    return {
        "family": loaded.family.name,
        "parameters": loaded.num_parameters(),
        "layers": int(config.num_hidden_layers),
        "heads": int(config.num_attention_heads),
        "hidden": int(config.hidden_size),
        "labels": list(loaded.labels),
        "dtype": loaded.dtype,  # what its weights were computed in (--dtype)
        **kind_summary(loaded),  # members, method and layout numbers of an ensemble
    }
