"""Hydra on grouped-query attention: each member keeps its own key/value heads (projected
once, read by its query heads through `enable_gqa`), not one K/V copy per query slot.

Exact against the members run alone (right and left padding, the four decoder families),
with the fused K/V projection as narrow as the members' own; layers whose members group
their queries unevenly fall back to the per-query layout, and so do Hydra models saved
before the grouped layout existed (no `kv_layout` in their config)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.methods.test_hydra import LABELS, _alone, _fused, _pruned_copies
from tests.methods.test_hydra_trunk import _left_padded, _padded
from uqcompress.methods.hydra import fuse
from uqcompress.models.factory import create_model
from uqcompress.models.loading import LoadedModel, load_model, resolve_model_source, save_model

DECODERS = ["llama", "qwen2", "qwen3", "mistral"]
# 8 query heads over 2 key/value heads (group 4): kv head 0 is read by heads 0-3, 1 by 4-7.
GQA_SHAPE = {"num_attention_heads": 8, "num_key_value_heads": 2}
# Whole key/value groups per member (`prune --unit kv`): layer 0 keeps 1, 1 and 2 groups.
KV_UNITS = [
    [[0, 1, 2, 3], [4, 5, 6, 7]],
    [[4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 6, 7]],
    [[0, 1, 2, 3, 4, 5, 6, 7], [2, 3, 6, 7]],
]
# Tiers of query heads from every group (`prune --unit query`): 1 or 2 per group.
QUERY_TIERS = [[[0, 4], [1, 2, 5, 6]], [[1, 2, 5, 6], [0, 4]], [[3, 7], [3, 7]]]
# Members grouped unevenly: one reads one kv head with 2 queries, the other 2 kv heads with 1.
UNEVEN = [[[0, 1], [0, 4]], [[0, 4], [0, 1, 2, 3]]]


def _members(family: str, keeps: list[Any]) -> list[LoadedModel]:
    base = create_model(family, LABELS, preset="tiny", overrides=GQA_SHAPE, seed=1)
    with torch.no_grad():  # logits of order 1: differences between members are then visible
        base.family.head_parts(base.model).classifier.weight.mul_(100.0)
    members = _pruned_copies(base, keeps)
    return members


def _qkv_widths(hydra: LoadedModel) -> list[int]:
    layers: Any = hydra.model.layers
    return [int(layer.attention.qkv.weight.shape[-1]) for layer in layers]


@pytest.mark.parametrize("family", DECODERS)
@pytest.mark.parametrize(
    ("keeps", "groups", "kv_slots"),
    [(KV_UNITS, [4, 4], [2, 2]), (QUERY_TIERS, [2, 2], [2, 2]), (UNEVEN, [1, 1], [2, 4])],
    ids=["kv-units", "query-tiers", "uneven"],
)
def test_grouped_fusion_equals_the_members_with_their_own_kv_heads(
    family: str, keeps: list[Any], groups: list[int], kv_slots: list[int]
) -> None:
    members = _members(family, keeps)
    hydra = fuse(members)
    spec: Any = hydra.model.spec
    assert spec.group == 4
    assert [spec.kv_group(layer) for layer in range(2)] == groups
    assert [spec.kv_slots(layer) for layer in range(2)] == kv_slots
    d = int(
        members[0]
        .family.block_parts(members[0].family.blocks(members[0].model)[0], members[0].config)
        .attention.head_dim
    )
    # [Q | K | V]: query slots plus one K and one V slot per key/value slot, nothing copied
    want = [(spec.slots(layer) + 2 * spec.kv_slots(layer)) * d for layer in range(2)]
    assert _qkv_widths(hydra) == want
    right = _padded(members[0])
    for batch in (right, _left_padded(right)):
        reference = _alone(members, batch)
        assert torch.allclose(_fused(hydra, batch), reference, atol=1e-5, rtol=0)
        assert (reference[:, 0] - reference[:, 1]).abs().max() > 1e-3  # members differ


def test_kv_units_project_half_the_per_query_qkv_columns() -> None:
    """The cost the grouped layout removes: with groups of 4, K/V columns of every query
    slot (the old layout) are 4x the members' own key/value heads, so [Q | K | V] halves."""
    members = _members("qwen2", KV_UNITS)
    grouped = _qkv_widths(fuse(members))
    spec: Any = fuse(members).model.spec
    per_query = [3 * spec.slots(layer) * 4 for layer in range(2)]  # head_dim 4 (32 / 8)
    assert grouped == [(8 + 2 * 2) * 4, (8 + 2 * 2) * 4]
    assert [g / p for g, p in zip(grouped, per_query, strict=True)] == [0.5, 0.5]


def test_the_batch_mask_is_broadcast_over_members_not_copied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every attention call gets the batch's one mask [B, ...]; the members' heads sit side
    by side on the head axis ([B, M*S, T, d_h]), so nothing is repeated M times."""
    from uqcompress.models import hydra_model

    members = _members("qwen2", KV_UNITS)
    hydra = fuse(members)
    batch = _padded(members[0])
    rows = int(batch["input_ids"].shape[0])
    seen: list[tuple[int, int, int]] = []
    attention = hydra_model.F.scaled_dot_product_attention

    def recording(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kw: Any) -> Any:
        mask = kw["attn_mask"]
        seen.append((int(mask.shape[0]), int(query.shape[0]), int(query.shape[1])))
        return attention(query, key, value, **kw)

    monkeypatch.setattr(hydra_model.F, "scaled_dot_product_attention", recording)
    _fused(hydra, batch)
    spec: Any = hydra.model.spec
    assert seen == [(rows, rows, len(members) * spec.slots(layer)) for layer in range(2)]


def test_models_fused_in_the_per_query_layout_still_load_and_run_exactly(
    tmp_path: Path,
) -> None:
    """A Hydra config without `kv_layout` (fused before the grouped layout) is read as one
    K/V copy per query slot: its saved weights keep their shapes and meaning."""
    members = _members("llama", KV_UNITS)
    old = fuse(members, grouped_kv=False)
    assert "kv_layout" not in old.config.uqc_hydra
    assert _qkv_widths(old) == [3 * 8 * 4, 3 * 8 * 4]
    save_model(old, tmp_path / "old")
    loaded = load_model(resolve_model_source(tmp_path / "old"))
    batch = _padded(members[0])
    assert _qkv_widths(loaded) == _qkv_widths(old)
    assert torch.allclose(_fused(loaded, batch), _alone(members, batch), atol=1e-5, rtol=0)


def test_grouped_hydra_saves_loads_and_exports_to_onnx_exactly(tmp_path: Path) -> None:
    import onnxruntime as ort

    from uqcompress.export.graph import graph_for
    from uqcompress.export.onnx import export_graph

    members = _members("qwen3", QUERY_TIERS)
    hydra = fuse(members)
    assert hydra.config.uqc_hydra["kv_layout"] == "grouped"
    save_model(hydra, tmp_path / "hydra")
    loaded = load_model(resolve_model_source(tmp_path / "hydra"))
    batch = _left_padded(_padded(members[0]))
    assert torch.equal(_fused(loaded, batch), _fused(hydra, batch))

    path = tmp_path / "hydra.onnx"
    export_graph(graph_for(loaded.model, "text"), loaded, path, opset=18)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feed = {k: v.numpy() for k, v in batch.items() if k in names}
    got = session.run(["member_logits"], feed)[0]
    want = _alone(members, batch).numpy()
    assert np.abs(got - want).max() < 1e-5
