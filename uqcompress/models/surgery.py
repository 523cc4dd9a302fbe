"""The only place that replaces modules inside a model, so shape surprises have one home.

Later issues add head pruning, Hydra fusion and SVD layers here.
"""

from __future__ import annotations

from typing import Any

from uqcompress.models.loading import LoadedModel


def replace_classifier(loaded: LoadedModel, labels: list[str], seed: int = 0) -> None:
    """Give the model a fresh linear classifier for ``labels`` (the same init as transformers).

    Used when a checkpoint had no trained head (an encoder), so the head's size comes from
    the data instead of the checkpoint's placeholder config.
    """
    import torch
    from torch import nn

    model: Any = loaded.model
    old: nn.Linear = model.classifier
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = nn.Linear(old.in_features, len(labels), bias=old.bias is not None)
        nn.init.normal_(head.weight, std=float(getattr(loaded.config, "initializer_range", 0.02)))
        if head.bias is not None:
            nn.init.zeros_(head.bias)
    model.classifier = head.to(old.weight.device, old.weight.dtype)
    model.num_labels = len(labels)
    model.config.num_labels = len(labels)
    model.config.id2label = dict(enumerate(labels))
    model.config.label2id = {name: i for i, name in enumerate(labels)}
    loaded.labels = list(labels)
