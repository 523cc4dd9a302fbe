"""Hydra fusion is exact: fused member logits equal the pruned members run one by one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from uqcompress.errors import IncompatibleInputError
from uqcompress.methods.hydra import (
    check_fusable,
    fuse,
    member_parts,
    mlp_spread,
    shared_weight_members,
)
from uqcompress.models.factory import create_model
from uqcompress.models.families import FAMILIES
from uqcompress.models.grouped import GroupedLinear
from uqcompress.models.hydra_model import hydra_families
from uqcompress.models.loading import LoadedModel, load_model, resolve_model_source, save_model
from uqcompress.models.surgery import prune_heads

LABELS = ["a", "b", "c"]
# Uneven on purpose: different counts per member and layer, a member with an empty layer,
# and (UNEVEN_WITH_EMPTY_LAYER) a layer where no member keeps any head.
UNEVEN = [[[0, 1], [2]], [[3], []], [[1, 2, 3], [0, 1]]]
UNEVEN_WITH_EMPTY_LAYER = [[[0, 1], []], [[3], []], [[2], []]]


def _batch(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    if loaded.input_kind == "image":
        return {"pixel_values": torch.randn(5, 1, 8, 8, generator=generator)}
    ids = torch.randint(5, 700, (5, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0  # padded rows: the fused mask must treat every member alike
    mask[3, 2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def _pruned_copies(base: LoadedModel, keeps: list[Any]) -> list[LoadedModel]:
    """One copy of `base` per entry of `keeps`, pruned to those heads: Hydra's members."""
    members = []
    for keep in keeps:
        member = copy.deepcopy(base)
        prune_heads(member, keep)
        members.append(member)
    return members


def _members(family: str, keeps: list[list[list[int]]], seed: int = 0) -> list[LoadedModel]:
    return _pruned_copies(create_model(family, LABELS, preset="tiny", seed=seed), keeps)


def _alone(members: list[LoadedModel], batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Shape: `[B, M, C]`, each member run by itself: the per-member loop reference."""
    with torch.inference_mode():
        return torch.stack([m.model(**batch).logits for m in members], dim=1)


def _fused(hydra: LoadedModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.inference_mode():
        out: Any = hydra.model(**batch)
        return out.member_logits


@pytest.mark.parametrize("family", ["vit", "bert"])
@pytest.mark.parametrize("keeps", [UNEVEN, UNEVEN_WITH_EMPTY_LAYER], ids=["uneven", "empty-layer"])
def test_fused_members_equal_members_run_alone(family: str, keeps: list[Any]) -> None:
    members = _members(family, keeps)
    batch = _batch(members[0])
    fused = _fused(fuse(members), batch)
    reference = _alone(members, batch)
    assert fused.shape == (5, len(keeps), len(LABELS))
    assert torch.allclose(fused, reference, atol=1e-5, rtol=0)
    # Members really differ, so the check above could fail on a member mix-up.
    assert (reference[:, 0] - reference[:, 1]).abs().max() > 1e-4


@pytest.mark.parametrize("family", ["bert", "qwen2"])
def test_rows_of_only_special_tokens_fuse_like_the_members(family: str) -> None:
    """Issue 26 item 11: the shortest row the data layer lets through (an empty text: [CLS]
    [SEP], then padding; rows with no token at all are refused there) gives the fused model
    the members' logits: the head pools where the members pool."""
    members = _members(family, [[[0, 1], [2, 3]], [[2, 3], [0, 1]]])  # whole GQA groups
    tokenizer = members[0].tokenizer
    assert tokenizer is not None
    empty = tokenizer([""])["input_ids"][0]  # special tokens only
    assert empty and set(empty) <= set(tokenizer.all_special_ids)
    ids = torch.full((3, 7), int(tokenizer.pad_token_id or 0))
    mask = torch.zeros_like(ids)
    ids[0, : len(empty)] = torch.tensor(empty)
    mask[0, : len(empty)] = 1
    ids[1], mask[1] = torch.randint(5, 700, (7,), generator=torch.Generator().manual_seed(1)), 1
    ids[2, :3], mask[2, :3] = torch.tensor([empty[0], 40, empty[-1]]), 1
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    fused, reference = _fused(fuse(members), batch), _alone(members, batch)
    assert torch.allclose(fused, reference, atol=1e-5, rtol=0), (fused - reference).abs().max()


@pytest.mark.parametrize("family", ["vit", "bert"])
def test_members_with_different_mlps_equal_the_averaged_reference(family: str) -> None:
    members = _members(family, UNEVEN)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # what separate fine-tuning does: every member's weights move
        for member in members:
            for param in member.model.parameters():
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
    batch = _batch(members[0])
    fused = _fused(fuse(members), batch)
    averaged = _alone(shared_weight_members(members), batch)
    assert torch.allclose(fused, averaged, atol=1e-5, rtol=0)
    assert (fused - _alone(members, batch)).abs().max() > 1e-3  # the averaging is real
    assert mlp_spread(members) > 0


def test_identical_mlps_fuse_bit_exactly_and_report_zero_spread() -> None:
    members = _members("vit", UNEVEN)
    assert mlp_spread(members) == 0.0
    hydra: Any = fuse(members).model
    first = member_parts(members[0])
    assert torch.equal(hydra.layers[0].mlp_in.weight, first.mlp_in[0].weight)


def test_grouped_linear_equals_a_per_member_loop() -> None:
    generator = torch.Generator().manual_seed(0)
    grouped = GroupedLinear(members=3, in_features=4, out_features=5)
    with torch.no_grad():
        grouped.weight.copy_(torch.randn(3, 4, 5, generator=generator))
        grouped.bias.copy_(torch.randn(3, 1, 5, generator=generator))
    x = torch.randn(3 * 2, 7, 4, generator=generator)  # M*B rows, member-major
    want = torch.cat(
        [
            F.linear(x[2 * m : 2 * m + 2], grouped.weight[m].t(), grouped.bias[m, 0])
            for m in range(3)
        ]
    )
    assert torch.allclose(grouped(x), want, atol=1e-6)


def test_padding_stays_exactly_zero_through_training() -> None:
    from torch.utils.data import DataLoader

    from uqcompress.engine.train import TrainConfig, train

    hydra = fuse(_members("vit", UNEVEN))
    model: Any = hydra.model
    images = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    rows = [{"pixel_values": images[i], "labels": torch.tensor(i % 3)} for i in range(16)]
    loader = DataLoader(rows, batch_size=8)  # type: ignore[arg-type]
    train(model, loader, TrainConfig(epochs=2, lr=1e-2, batch_size=8))
    attention = model.layers[1].attention  # slots 2: member 1 has none, member 0 has one
    d, width = attention.head_dim, 2 * attention.head_dim
    qkv = attention.qkv.weight  # [M, hidden, 3 * width], blocks [Q | K | V]
    assert torch.count_nonzero(qkv[1]) == 0 and torch.count_nonzero(attention.qkv.bias[1]) == 0
    assert torch.count_nonzero(attention.output.weight[1]) == 0
    for block in range(3):  # member 0: its one head's columns trained, the padded slot zero
        assert torch.count_nonzero(qkv[0, :, block * width + d : (block + 1) * width]) == 0
        assert torch.count_nonzero(qkv[0, :, block * width : block * width + d]) > 0
    assert torch.count_nonzero(attention.output.weight[0, d:]) == 0


def test_training_loss_is_the_mean_of_member_cross_entropies() -> None:
    from uqcompress.engine.train import classification_loss

    hydra = fuse(_members("vit", UNEVEN))
    batch: dict[str, Any] = _batch(hydra)
    labels = torch.tensor([0, 1, 2, 0, 1])
    logits = _fused(hydra, batch)
    want = sum(F.cross_entropy(logits[:, m], labels) for m in range(3)) / 3
    with torch.inference_mode():
        got = classification_loss(hydra.model, {**batch, "labels": labels})
    assert float(got) == pytest.approx(float(want), rel=1e-6)


@pytest.mark.parametrize("family", ["vit", "bert"])
def test_saved_hydra_loads_back_identically(family: str, tmp_path: Path) -> None:
    hydra = fuse(_members(family, UNEVEN))
    save_model(hydra, tmp_path / "hydra")
    loaded = load_model(resolve_model_source(tmp_path / "hydra"))
    assert loaded.members == 3 and loaded.labels == LABELS
    batch = _batch(hydra)
    assert torch.equal(_fused(loaded, batch), _fused(hydra, batch))


def test_unfusable_members_are_refused_with_the_reason() -> None:
    vit = _members("vit", UNEVEN[:2])
    with pytest.raises(IncompatibleInputError, match="got 1"):
        check_fusable(vit[:1], ["a"])
    bert = _members("bert", UNEVEN[:1])
    with pytest.raises(IncompatibleInputError, match="different families"):
        check_fusable([vit[0], bert[0]], ["v", "b"])
    relabelled = copy.deepcopy(vit[1])
    relabelled.labels = ["x", "y", "z"]
    with pytest.raises(IncompatibleInputError, match="different label sets"):
        check_fusable([vit[0], relabelled], ["v", "r"])
    wider = create_model("vit", LABELS, preset="small")
    with pytest.raises(IncompatibleInputError, match="different base models"):
        check_fusable([vit[0], wider], ["v", "w"])


NARROW_FAMILIES = [name for name in hydra_families() if FAMILIES[name].mlp_width_key is not None]


@pytest.mark.parametrize("family", NARROW_FAMILIES)
def test_members_with_their_own_mlp_neurons_fuse_exactly_in_every_family(
    family: str, tmp_path: Path
) -> None:
    """`prune --mlp-ratio`: each member keeps its own narrower MLP in the fused model."""
    from uqcompress.methods.mlp_width import member_neurons
    from uqcompress.models.surgery import narrow_mlp

    keeps = [[[0, 1], [2, 3]], [[2, 3], [0, 1]]]
    members = _members(family, keeps, seed=4)
    inner = members[0].family.sizes(members[0].config).intermediate
    order = torch.randperm(inner, generator=torch.Generator().manual_seed(5)).tolist()
    for m, member in enumerate(members):
        narrow_mlp(member, [member_neurons(order, 2, m, 0.5) for _ in keeps[0]])
    batch = _batch(members[0])
    if "attention_mask" in batch:  # unpadded: a decoder's transformers head finds its last
        batch["attention_mask"] = torch.ones_like(batch["attention_mask"])  # token by pad id
    hydra = fuse(members)
    assert all(layer.member_mlps is not None for layer in hydra.model.layers)
    reference = _alone(members, batch)
    assert torch.allclose(_fused(hydra, batch), reference, atol=1e-5, rtol=0)
    save_model(hydra, tmp_path / "hydra")
    back = load_model(resolve_model_source(tmp_path / "hydra"))
    assert torch.equal(_fused(back, batch), _fused(hydra, batch))
    # the members' MLPs really differ (a mix-up of two would fail the check above)
    assert (reference[:, 0] - reference[:, 1]).abs().max() > 1e-5


def test_a_family_whose_mlp_width_is_derived_is_not_narrowed() -> None:
    from uqcompress.models.surgery import narrow_mlp

    (member,) = _members("dinov2", [[[0, 1], [2, 3]]])
    with pytest.raises(ValueError, match="cannot be narrowed"):
        narrow_mlp(member, [[0], [0]])
