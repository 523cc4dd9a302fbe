"""Family anatomy: the parts a family names are the model's modules, and embed -> blocks ->
head, run through the family, is exactly the transformers forward."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from uqcompress.models.factory import create_model
from uqcompress.models.families import FAMILIES, BlockParts, family_by_name
from uqcompress.models.families.base import rotate
from uqcompress.models.loading import LoadedModel
from uqcompress.models.surgery import prune_heads

LABELS = ["a", "b", "c"]


def _model(family: str, preset: str = "tiny") -> LoadedModel:
    loaded = create_model(family, LABELS, preset=preset, seed=4)
    loaded.model.eval()
    return loaded


def _batch(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    if loaded.input_kind == "image":
        config: Any = loaded.config
        size, channels = int(config.image_size), int(config.num_channels)
        return {"pixel_values": torch.randn(5, channels, size, size, generator=generator)}
    ids = torch.randint(5, 700, (5, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0  # padding: the family's mask must hide these positions exactly
    mask[3, 2:] = 0
    ids[mask == 0] = int(loaded.config.pad_token_id or 0)  # padding is the padding token
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def _through_family(loaded: LoadedModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    family, model = loaded.family, loaded.model
    hidden, mask = family.embed(family.embeddings(model), batch)
    for block in family.blocks(model):
        hidden = family.run_block(block, hidden, mask)
    return family.head(model, hidden, batch.get("attention_mask"))


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_embed_blocks_head_is_exactly_the_model(name: str, preset: str) -> None:
    loaded = _model(name, preset)
    batch = _batch(loaded)
    with torch.no_grad():
        assert torch.equal(_through_family(loaded, batch), loaded.model(**batch).logits)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_flow_holds_for_a_pruned_model_with_an_empty_layer(name: str) -> None:
    loaded = _model(name)
    prune_heads(loaded, [[0, 2], []])
    batch = _batch(loaded)
    with torch.no_grad():
        assert torch.equal(_through_family(loaded, batch), loaded.model(**batch).logits)
    heads = [parts.heads for parts in loaded.family.attention_layers(loaded.model)]
    assert heads == [2, 0]
    assert [p.kv_heads for p in loaded.family.attention_layers(loaded.model)] == [2, 0]


def _reference_block(
    loaded: LoadedModel, parts: BlockParts, x: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """A block written from the anatomy alone: the parts, the norm order, plain attention
    (with the family's rotary positions, per-head q/k norms and key/value groups)."""
    family = loaded.family
    attention, mlp = parts.attention, parts.mlp
    activation = ACT2FN[mlp.activation]

    def attend(h: torch.Tensor) -> torch.Tensor:
        batch, length, _ = h.shape
        split = (batch, length, -1, attention.head_dim)
        q, k, v = (p(h).view(split) for p in (attention.query, attention.key, attention.value))
        if attention.query_norm is not None and attention.key_norm is not None:
            q, k = attention.query_norm(q), attention.key_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        positions = family.rotary_positions(loaded.config, h)
        if positions is not None:
            q, k = rotate(q, *positions), rotate(k, *positions)
        k = k.repeat_interleave(attention.group_size, dim=1)
        v = v.repeat_interleave(attention.group_size, dim=1)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return attention.output(context.transpose(1, 2).reshape(batch, length, -1))

    def feed_forward(h: torch.Tensor) -> torch.Tensor:
        if mlp.gate is not None:
            return mlp.down(activation(mlp.gate(h)) * mlp.up(h))
        return mlp.down(activation(mlp.up(h)))

    if family.layout.norm_order == "pre":
        x = x + attend(parts.norm_attention(x))
        return x + feed_forward(parts.norm_mlp(x))
    x = parts.norm_attention(x + attend(x))
    return parts.norm_mlp(x + feed_forward(x))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_block_parts_and_norm_order_describe_the_block(name: str) -> None:
    loaded = _model(name)
    family, model = loaded.family, loaded.model
    batch = _batch(loaded)
    with torch.no_grad():
        hidden, mask = family.embed(family.embeddings(model), batch)
        for block in family.blocks(model):
            parts = family.block_parts(block, loaded.config)
            want = family.run_block(block, hidden, mask)
            got = _reference_block(loaded, parts, hidden, mask)
            valid = batch.get("attention_mask", torch.ones(hidden.shape[:2]))[:, :, None].bool()
            torch.testing.assert_close(got * valid, want * valid, rtol=1e-5, atol=1e-5)
            hidden = want


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_mlp_sublayer_finishes_the_block_from_its_entry(name: str) -> None:
    loaded = _model(name)
    family, model = loaded.family, loaded.model
    batch = _batch(loaded)
    block = family.blocks(model)[0]
    seen: list[torch.Tensor] = []
    handle = family.mlp_entry(block).register_forward_pre_hook(
        lambda _m, args: seen.append(args[0])
    )
    try:
        with torch.no_grad():
            hidden, mask = family.embed(family.embeddings(model), batch)
            out = family.run_block(block, hidden, mask)
    finally:
        handle.remove()
    assert len(seen) == 1  # the entry runs once, on the stream after the attention sublayer
    with torch.no_grad():
        finished = family.run_mlp_sublayer(family.mlp_sublayer(block), seen[0])
    assert torch.equal(finished, out)


def test_bert_parts_are_its_modules_and_it_is_post_ln() -> None:
    loaded = _model("bert")
    family, model = loaded.family, loaded.model
    root: Any = model
    layer = root.bert.encoder.layer[1]
    parts = family.block_parts(family.blocks(model)[1], loaded.config)
    assert family.layout.norm_order == "post" and not family.layout.final_norm
    assert family.layout.pooler_activation == "tanh" and not family.layout.gated_mlp
    assert family.embeddings(model) is root.bert.embeddings
    assert parts.attention.query is layer.attention.self.query
    assert parts.attention.output is layer.attention.output.dense
    assert (parts.attention.heads, parts.attention.kv_heads, parts.attention.head_dim) == (4, 4, 8)
    assert parts.mlp.up is layer.intermediate.dense and parts.mlp.down is layer.output.dense
    assert not parts.mlp.gated and parts.mlp.activation == loaded.config.hidden_act
    assert parts.norm_attention is layer.attention.output.LayerNorm
    assert parts.norm_mlp is layer.output.LayerNorm
    head = family.head_parts(model)
    assert head.final_norm is None and head.pooler is root.bert.pooler.dense
    assert head.classifier is root.classifier and family.classifier_name(model) == "classifier"
    assert list(family.mlp_sublayer(layer)) == ["intermediate", "output"]
    assert family.mlp_entry(layer) is layer.intermediate
    assert family.fixed_tokens(loaded.config) is None
    assert family.max_length(loaded.config) == 128


def test_vit_parts_are_its_modules_and_it_is_pre_ln() -> None:
    loaded = _model("vit")
    family, model = loaded.family, loaded.model
    root: Any = model
    layer = root.vit.layers[0]
    parts = family.block_parts(family.blocks(model)[0], loaded.config)
    assert family.layout.norm_order == "pre" and family.layout.final_norm
    assert family.layout.pooler_activation is None
    assert family.embeddings(model) is root.vit.embeddings
    assert parts.attention.key is layer.attention.k_proj
    assert parts.attention.output is layer.attention.o_proj
    assert (parts.attention.heads, parts.attention.kv_heads, parts.attention.head_dim) == (4, 4, 8)
    assert parts.mlp.up is layer.mlp.fc1 and parts.mlp.down is layer.mlp.fc2
    assert parts.norm_attention is layer.layernorm_before
    assert parts.norm_mlp is layer.layernorm_after
    head = family.head_parts(model)
    assert head.final_norm is root.vit.layernorm and head.pooler is None
    assert head.classifier is root.classifier
    assert family.mlp_entry(layer) is layer.layernorm_after
    with torch.no_grad():
        hidden, mask = family.embed(family.embeddings(model), _batch(loaded))
    assert mask is None and hidden.shape[1] == family.fixed_tokens(loaded.config) == 17


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_fresh_embeddings_module_has_the_models_shapes(name: str) -> None:
    loaded = _model(name)
    family = family_by_name(name)
    fresh = family.build_embeddings(loaded.config)
    mine = family.embeddings(loaded.model).state_dict()
    assert {k: v.shape for k, v in fresh.state_dict().items()} == {
        k: v.shape for k, v in mine.items()
    }


def test_head_modules_run_like_the_head_on_copies() -> None:
    import copy

    loaded = _model("bert")
    family, model = loaded.family, loaded.model
    copies = {k: copy.deepcopy(v) for k, v in family.head_modules(model).items()}
    hidden = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(family.run_head(copies, hidden), family.head(model, hidden))
