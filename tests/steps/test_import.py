"""Import round trip per family: a checkpoint written by transformers' own `save_pretrained`
(with its family's tokenizer or image processor) is imported by `uqc import`, and `uqc export
--format safetensors` of it loads back with transformers' Auto class, computing the same
logits and tokenising the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.checkpoints import IMAGE_FAMILIES, TEXT_FAMILIES, save_family_checkpoint
from tests.conftest import ok

LABELS = ("neg", "pos", "meh")
TEXTS = ["the movie was really good", "awful and boring", "it", "great acting, dull story"]


def _auto_class(family: str) -> Any:
    import transformers

    if family in TEXT_FAMILIES:
        return transformers.AutoModelForSequenceClassification
    return transformers.AutoModelForImageClassification


def _inputs(family: str, directory: Path) -> dict[str, torch.Tensor]:
    """A padded batch as the checkpoint's own tokenizer makes it, or random 8x8 images."""
    if family in IMAGE_FAMILIES:
        generator = torch.Generator().manual_seed(0)
        return {"pixel_values": torch.randn(4, 1, 8, 8, generator=generator)}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    return dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))


@pytest.mark.parametrize("family", TEXT_FAMILIES + IMAGE_FAMILIES)
def test_a_save_pretrained_checkpoint_round_trips_through_uqc(
    family: str, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    source = save_family_checkpoint(family, tmp_path / "checkpoint", LABELS, seed=3)
    imported = Path(ok(cli("import", source, "--out", tmp_path / "imported")))
    summary = json.loads((imported / "manifest.json").read_text())["summary"]
    assert summary["family"] == family and summary["labels"] == list(LABELS)

    exported = Path(
        ok(cli("export", imported, "--format", "safetensors", "--out", tmp_path / "st"))
    )
    auto = _auto_class(family)
    original = auto.from_pretrained(str(source)).eval()
    reloaded = auto.from_pretrained(str(exported)).eval()
    assert type(reloaded) is type(original)
    assert reloaded.config.id2label == original.config.id2label
    batch = _inputs(family, source)
    with torch.no_grad():
        expected = original(**batch).logits
        got = reloaded(**batch).logits
    assert expected.shape == (4, len(LABELS))
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()
    if family in TEXT_FAMILIES:  # the tokenizer travels unchanged
        assert _inputs(family, exported)["input_ids"].tolist() == batch["input_ids"].tolist()
