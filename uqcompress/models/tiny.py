"""Tiny random models for tests: 2 layers, 4 heads, hidden 32; no download, milliseconds to build.

Also reachable as `uqc init --family bert|vit --preset tiny`.
"""

from __future__ import annotations

from uqcompress.models.factory import create_model
from uqcompress.models.loading import LoadedModel


def tiny_bert(labels: list[str] | None = None, seed: int = 0) -> LoadedModel:
    """A 2-layer BERT text classifier over the shipped WordPiece vocabulary."""
    return create_model("bert", labels or ["neg", "pos"], preset="tiny", seed=seed)


def tiny_vit(labels: list[str] | None = None, seed: int = 0) -> LoadedModel:
    """A 2-layer ViT for 8x8 grey images in 2x2 patches (scikit-learn's digits)."""
    return create_model("vit", labels or [str(d) for d in range(10)], preset="tiny", seed=seed)
