"""Head gates and physical head pruning: pruned == gated, uneven and empty layers, reload; MLP
narrowing (`prune --mlp-ratio`): narrowed == gated neurons, reload, composition."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from uqcompress.methods.pruning import select_heads
from uqcompress.models.head_gates import (
    HeadGates,
    attention_probabilities,
    eager_attention,
    heads_per_layer,
)
from uqcompress.models.loading import LoadedModel, load_model, resolve_model_source, save_model
from uqcompress.models.surgery import kept_heads, prune_heads
from uqcompress.models.tiny import tiny_bert, tiny_vit


def _inputs(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    if loaded.tokenizer is not None:
        texts = ["a great film with fun acting and a good story", "bad", "the movie was dull"]
        return dict(loaded.tokenizer(texts, padding=True, return_tensors="pt"))
    return {"pixel_values": torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))}


def _spread(loaded: LoadedModel) -> LoadedModel:
    """Random tiny models barely depend on any one head; larger weights make it visible."""
    with torch.no_grad():
        for parts in loaded.family.attention_layers(loaded.model):
            parts.value.weight.mul_(8.0)
            parts.output.weight.mul_(8.0)
    return loaded


def _gated(loaded: LoadedModel, keep: list[list[int]]) -> torch.Tensor:
    with torch.no_grad(), HeadGates(loaded) as gates:
        for layer, heads in enumerate(keep):
            gates.gates[layer].zero_()
            gates.gates[layer][heads] = 1.0
        return loaded.model(**_inputs(loaded)).logits


@pytest.mark.parametrize("make", [tiny_bert, tiny_vit])
def test_gates_are_live_and_zeroing_equals_removing(make) -> None:  # type: ignore[no-untyped-def]
    loaded = _spread(make(seed=1))
    with torch.no_grad():
        full = loaded.model(**_inputs(loaded)).logits
    keep = [[0, 1, 3], [0, 1, 2, 3]]
    gated = _gated(loaded, keep)
    assert (gated - full).abs().max() > 1e-3  # the gate really changes the output
    prune_heads(loaded, keep)
    with torch.no_grad():
        pruned = loaded.model(**_inputs(loaded)).logits
    assert (pruned - gated).abs().max() < 1e-5
    assert heads_per_layer(loaded) == [3, 4]


@pytest.mark.parametrize("make", [tiny_bert, tiny_vit])
@pytest.mark.parametrize("scope", ["layer", "global"])
def test_pruned_equals_gated_for_both_scopes_and_reloads(
    make,
    scope: str,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    loaded = _spread(make(seed=2))
    scores = torch.rand(2, 4, generator=torch.Generator().manual_seed(3))
    keep = select_heads(scores, 0.5, scope)
    gated = _gated(loaded, keep)
    prune_heads(loaded, keep)
    with torch.no_grad():
        pruned = loaded.model(**_inputs(loaded)).logits
    assert (pruned - gated).abs().max() < 1e-5
    save_model(loaded, tmp_path / "m")
    back = load_model(resolve_model_source(tmp_path / "m"))
    assert kept_heads(back) == keep and heads_per_layer(back) == [len(k) for k in keep]
    with torch.no_grad():
        assert torch.equal(back.model(**_inputs(back)).logits, pruned)


@pytest.mark.parametrize("make", [tiny_bert, tiny_vit])
def test_a_layer_with_no_heads_equals_the_fully_gated_layer(make) -> None:  # type: ignore[no-untyped-def]
    loaded = _spread(make(seed=4))
    keep: list[list[int]] = [[2], []]
    gated = _gated(loaded, keep)
    prune_heads(loaded, keep)
    with torch.no_grad():
        pruned = loaded.model(**_inputs(loaded)).logits
    assert heads_per_layer(loaded) == [1, 0]
    assert (pruned - gated).abs().max() < 1e-5


def test_ratio_zero_is_the_identity() -> None:
    loaded = tiny_vit(seed=5)
    with torch.no_grad():
        before = loaded.model(**_inputs(loaded)).logits
    prune_heads(loaded, select_heads(torch.rand(2, 4), 0.0, "layer"))
    with torch.no_grad():
        assert torch.equal(loaded.model(**_inputs(loaded)).logits, before)


def test_pruning_composes_in_original_indices() -> None:
    loaded = tiny_bert(seed=6)
    prune_heads(loaded, [[0, 2, 3], [1, 2]])
    prune_heads(loaded, [[1, 2], [0]])
    assert kept_heads(loaded) == [[2, 3], [1]]


def test_padding_does_not_change_gated_logits() -> None:
    loaded = _spread(tiny_bert(seed=7))
    assert loaded.tokenizer is not None
    texts = ["a great film with fun acting", "bad"]
    with torch.no_grad(), HeadGates(loaded) as gates:
        gates.gates[0][1] = 0.0
        together = loaded.model(**loaded.tokenizer(texts, padding=True, return_tensors="pt")).logits
        for i, text in enumerate(texts):
            alone = loaded.model(**loaded.tokenizer([text], return_tensors="pt")).logits
            assert (together[i] - alone[0]).abs().max() < 1e-5


def test_attention_probabilities_come_back_under_eager() -> None:
    loaded = tiny_vit(seed=8)
    with eager_attention(loaded):
        outputs = loaded.model(**_inputs(loaded), output_attentions=True)
        probs = attention_probabilities(loaded, outputs)
    assert [tuple(p.shape) for p in probs] == [(4, 4, 17, 17)] * 2
    assert torch.allclose(probs[0].sum(-1), torch.ones(4, 4, 17), atol=1e-5)
    assert loaded.model.config._attn_implementation != "eager"  # restored afterwards


def _mlp_gated(loaded: LoadedModel, neurons: list[list[int]]) -> torch.Tensor:
    """Logits with every removed neuron's input to the down projection at 0."""
    family, hooks = loaded.family, []
    for block, kept in zip(family.blocks(loaded.model), neurons, strict=True):
        down = family.block_parts(block, loaded.config).mlp.down
        mask = torch.zeros(down.in_features)
        mask[kept] = 1.0
        hooks.append(down.register_forward_pre_hook(lambda _, a, mask=mask: (a[0] * mask,)))
    try:
        with torch.no_grad():
            return loaded.model(**_inputs(loaded)).logits
    finally:
        for hook in hooks:
            hook.remove()


@pytest.mark.parametrize("make", [tiny_bert, tiny_vit])
def test_narrowed_mlp_equals_gated_neurons_reloads_and_composes(make, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from uqcompress.models.surgery import KEPT_NEURONS_KEY, narrow_mlp

    loaded = make(seed=6)
    with torch.no_grad():
        for block in loaded.family.blocks(loaded.model):
            loaded.family.block_parts(block, loaded.config).mlp.down.weight.mul_(8.0)
        full = loaded.model(**_inputs(loaded)).logits
    inner = int(loaded.config.intermediate_size)
    keep = [list(range(0, inner, 2)), list(range(1, inner, 2))]
    gated = _mlp_gated(loaded, keep)
    assert (gated - full).abs().max() > 1e-3  # the removed neurons mattered
    narrow_mlp(loaded, keep)
    with torch.no_grad():
        narrow = loaded.model(**_inputs(loaded)).logits
    assert (narrow - gated).abs().max() < 1e-5
    assert loaded.config.intermediate_size == inner // 2
    save_model(loaded, tmp_path / "m")
    back = load_model(resolve_model_source(tmp_path / "m"))
    with torch.no_grad():
        assert torch.equal(back.model(**_inputs(back)).logits, narrow)
    # a second narrowing records the original indices
    narrow_mlp(back, [[0, 1], [1, 2]])
    assert getattr(back.config, KEPT_NEURONS_KEY) == [[0, 2], [3, 5]]


def test_narrowing_refuses_uneven_or_unsorted_keeps() -> None:
    from uqcompress.models.surgery import narrow_mlp

    loaded = tiny_bert(seed=7)
    with pytest.raises(ValueError, match="all of one length"):
        narrow_mlp(loaded, [[0, 1], [0]])
    with pytest.raises(ValueError, match="sorted subset"):
        narrow_mlp(loaded, [[1, 0], [0, 1]])
