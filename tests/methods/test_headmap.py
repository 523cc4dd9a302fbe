"""HeadMap's layer-conditioned circuit locating (`--method headmap`): on hand-built models whose
decisive heads are known, against a line-by-line port of HeadMap's `locating.py`, its cost, and
where it differs from uqc's greedy circuit search."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.methods.test_scoring import decisive_vit, image_batches
from uqcompress.errors import ConfigError, DataError
from uqcompress.methods.scoring import (
    circuit_scores,
    example_losses,
    headmap_evaluations,
    headmap_scores,
    lowest_loss,
)
from uqcompress.models.head_gates import HeadGates
from uqcompress.models.loading import LoadedModel
from uqcompress.models.tiny import tiny_bert, tiny_vit


def _mean_nll(loaded: LoadedModel, batches: list[dict[str, Any]]) -> float:
    total, count = 0.0, 0
    for batch in batches:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        with torch.no_grad():
            logits = loaded.model(**inputs).logits.double()
        total += float(F.cross_entropy(logits, batch["labels"], reduction="sum"))
        count += len(batch["labels"])
    return total / count


def _reference(loaded: LoadedModel, batches: list[dict[str, Any]], k: int) -> Any:
    """HeadMap's `layer_conditioned_locating`, written out naively: mask path + [(l, [h])],
    evaluate the loss, append the top-k heads of the layer to the path."""
    path: list[tuple[int, list[int]]] = []
    table = []
    counts = [g.numel() for g in HeadGates(loaded).gates]
    loaded.model.eval()
    with torch.no_grad():
        for layer, heads in enumerate(counts):
            row = []
            for head in range(heads):
                with HeadGates(loaded) as gates:
                    for masked_layer, masked in [*path, (layer, [head])]:
                        for h in masked:
                            gates.gates[masked_layer][h] = 0.0
                    row.append(_mean_nll(loaded, batches))
            table.append(row)
            top = sorted(range(heads), key=lambda h: (-row[h], h))[:k]
            path.append((layer, sorted(top)))
    return torch.tensor(table, dtype=torch.float64), [heads for _, heads in path]


def test_headmap_keeps_the_decisive_head_of_every_layer() -> None:
    """Per layer only one head writes into the residual stream: masking it is the only mask
    that changes the output, so it is the head HeadMap keeps, and every other head's loss is
    that of the circuit masked so far."""
    loaded, batches = decisive_vit({0: 2, 1: 1})
    calls: list[tuple[int, int]] = []
    score, kept = headmap_scores(
        loaded, batches, [1, 1], progress=lambda d, t: calls.append((d, t))
    )
    assert kept == [[2], [1]]
    full = _mean_nll(loaded, batches)
    # layer 0: the three silent heads leave the full model's loss; the decisive one raises it
    silent = [h for h in range(4) if h != 2]
    assert score[0, silent].tolist() == pytest.approx([full] * 3, rel=1e-5)
    assert float(score[0, 2]) > full + 1.0
    # layer 1 is measured with head (0, 2) masked: its silent heads score that loss
    assert score[1, [0, 2, 3]].tolist() == pytest.approx([float(score[0, 2])] * 3, rel=1e-5)
    assert float(score[1, 1]) > float(score[0, 2])
    # cost: one evaluation per head, H per layer
    assert calls == [(i, 8) for i in range(1, 9)]
    assert headmap_evaluations([4, 4]) == headmap_evaluations(4, 2) == 8


def test_headmap_equals_a_port_of_headmaps_locating() -> None:
    loaded = tiny_vit(seed=5)
    batches = image_batches(16, 8, seed=6)
    score, kept = headmap_scores(loaded, batches, [2, 2])
    table, path = _reference(loaded, batches, 2)
    assert kept == path
    assert torch.allclose(score.double(), table, rtol=1e-5, atol=1e-6)


def test_headmap_masks_its_circuit_where_greedy_keeps_it_open() -> None:
    """The two searches differ: HeadMap searches later layers with the kept heads of earlier
    layers masked, the greedy search with only those heads open. On this model layer 1's
    decisive head lowers the loss when masked on top of layer 0's (the model is already
    broken), so HeadMap does not keep it; the greedy search does."""
    loaded, batches = decisive_vit({0: 0, 1: 3})
    _, headmap = headmap_scores(loaded, batches, [1, 1])
    _, greedy = circuit_scores(loaded, batches, [1, 1])
    assert headmap[0] == greedy[0] == [0]
    assert greedy[1] == [3] and headmap[1] != [3]


def test_headmap_on_padded_text_and_keep_all() -> None:
    from tests.methods.test_scoring import LABELS, TEXTS, text_batches

    bert = tiny_bert(seed=1)
    batches = text_batches(bert, TEXTS, LABELS, batch_size=4)
    score, kept = headmap_scores(bert, batches, [4, 2])
    assert kept[0] == [0, 1, 2, 3] and len(kept[1]) == 2
    assert bool(torch.isfinite(score).all()) and score.shape == (2, 4)
    # keeping a layer whole masks it whole for the next layer
    _table, path = _reference(bert, batches, 4)
    assert path[0] == [0, 1, 2, 3]


def test_lowest_loss_picks_the_easiest_examples() -> None:
    losses = torch.tensor([0.5, 0.1, 0.9, 0.1, 0.3], dtype=torch.float64)
    assert lowest_loss(losses, 3) == [1, 3, 4]
    assert lowest_loss(losses, 10) == [0, 1, 2, 3, 4]
    loaded, batches = decisive_vit({0: 2})
    per_example = example_losses(loaded, batches)
    assert per_example.shape == (48,)
    assert float(per_example.mean()) == pytest.approx(_mean_nll(loaded, batches), rel=1e-9)


def test_headmap_refuses_bad_keep_and_empty_data() -> None:
    loaded = tiny_vit(seed=0)
    with pytest.raises(ConfigError):
        headmap_scores(loaded, image_batches(4, 4, seed=0), [5, 1])
    with pytest.raises(DataError, match="empty"):
        headmap_scores(loaded, [], [1, 1])
