"""`fuse --shared-layers K`: the first K blocks run once (a trunk with every head some
member kept), the members branch after it. Exact against a reference built by hand from the
base model: each member with its first K blocks replaced by the base's, pruned to the
trunk's heads."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tests.methods.test_hydra import LABELS, _alone, _batch, _fused, _pruned_copies
from uqcompress.errors import IncompatibleInputError
from uqcompress.methods.hydra import (
    check_shared_layers,
    fuse,
    shared_weight_members,
)
from uqcompress.models.factory import create_model
from uqcompress.models.loading import LoadedModel
from uqcompress.models.surgery import prune_heads, replace_module

# Per member and layer (2 layers, 4 heads in pairs over 2 key/value heads): every member
# reads each key/value head it keeps with the same number of query heads, and so does the
# union of layer 0 (all four heads in ALL_HEADS, heads 0 and 2 in TWO_HEADS).
ALL_HEADS = [[[0, 2], [1]], [[1, 3], [0, 2]], [[0, 2], [3]]]
TWO_HEADS = [[[0], [1, 3]], [[2], [0]], [[0, 2], [2]]]
FAMILIES = ["bert", "distilbert", "vit", "dinov2", "llama", "qwen3"]


def _base_and_members(
    family: str, keeps: list[list[list[int]]], seed: int = 0
) -> tuple[LoadedModel, list[LoadedModel]]:
    base = create_model(family, LABELS, preset="tiny", seed=seed)
    with torch.no_grad():  # logits of order 1 (not 0.01): differences are then worth checking
        base.family.head_parts(base.model).classifier.weight.mul_(100.0)
    members = _pruned_copies(base, keeps)
    return base, members


def _hand_reference(
    base: LoadedModel, members: list[LoadedModel], keeps: list[Any], shared: int
) -> list[LoadedModel]:
    """Each member with blocks 0..shared-1 taken from the base, pruned to the heads the
    members keep there together."""
    heads = int(base.config.num_attention_heads)
    layers = len(keeps[0])
    union = [
        sorted({h for keep in keeps for h in keep[layer]}) if layer < shared else list(range(heads))
        for layer in range(layers)
    ]
    trunk = copy.deepcopy(base)
    prune_heads(trunk, union)
    hybrids = []
    for member in members:
        hybrid = copy.deepcopy(member)
        names = {id(module): name for name, module in hybrid.model.named_modules()}
        for layer in range(shared):
            block = hybrid.family.blocks(hybrid.model)[layer]
            taken = copy.deepcopy(trunk.family.blocks(trunk.model)[layer])
            replace_module(hybrid.model, names[id(block)], taken)
        hybrids.append(hybrid)
    return hybrids


def _padded(member: LoadedModel) -> dict[str, torch.Tensor]:
    """`_batch` with the pad token where the mask is 0 (a decoder's classifier finds each
    row's last real token from the ids, as a tokenizer pads them)."""
    batch = _batch(member)
    if member.input_kind != "text":
        return batch
    pad = int(getattr(member.config, "pad_token_id", None) or 0)
    ids = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, pad)
    return {**batch, "input_ids": ids}


def _left_padded(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same rows with their padding moved to the left (how decoders are often fed)."""
    ids, mask = batch["input_ids"].clone(), batch["attention_mask"].clone()
    for row in range(len(ids)):
        real = int(mask[row].sum())
        ids[row] = torch.roll(ids[row], ids.shape[1] - real)
        mask[row] = torch.roll(mask[row], ids.shape[1] - real)
    return {**batch, "input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("keeps", [ALL_HEADS, TWO_HEADS], ids=["all-heads", "two-heads"])
def test_a_shared_trunk_equals_the_members_on_the_bases_first_blocks(
    family: str, keeps: list[Any]
) -> None:
    base, members = _base_and_members(family, keeps)
    hydra = fuse(members, shared_layers=1)
    spec: Any = hydra.model.spec
    assert spec.shared_layers == 1 and spec.slots(0) == len(spec.trunk_heads(0))
    hand = _hand_reference(base, members, keeps, shared=1)
    batches = [_padded(members[0])]
    if members[0].input_kind == "text":
        batches.append(_left_padded(batches[0]))
    for batch in batches:
        fused, reference = _fused(hydra, batch), _alone(hand, batch)
        assert fused.shape == (5, 3, len(LABELS))
        torch.testing.assert_close(fused, reference, atol=1e-5, rtol=0)
        # the members differ after the trunk, and the trunk is not the members' own first
        # block: either mix-up would show
        assert (reference[:, 0] - reference[:, 1]).abs().max() > 1e-4
        assert (reference - _alone(members, batch)).abs().max() > 1e-4
    # the package's own reference (what `uqc fuse` gates on) is the same function
    torch.testing.assert_close(
        _alone(shared_weight_members(members, shared_layers=1), batches[0]),
        _alone(hand, batches[0]),
        atol=1e-5,
        rtol=0,
    )


def test_no_shared_layers_is_todays_hydra_bit_for_bit() -> None:
    _, members = _base_and_members("bert", ALL_HEADS)
    batch = _batch(members[0])
    today, trunkless = fuse(members), fuse(members, shared_layers=0)
    assert torch.equal(_fused(today, batch), _fused(trunkless, batch))
    assert "shared_layers" not in today.config.uqc_hydra  # configs and ids as before


def test_members_fine_tuned_apart_share_the_average_of_their_first_blocks() -> None:
    _, members = _base_and_members("vit", ALL_HEADS)
    with torch.no_grad():  # move member 1's first block away from the others
        for parameter in members[1].family.blocks(members[1].model)[0].parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    batch = _batch(members[0])
    fused = _fused(fuse(members, shared_layers=1), batch)
    reference = _alone(shared_weight_members(members, shared_layers=1), batch)
    torch.testing.assert_close(fused, reference, atol=1e-5, rtol=0)
    assert (reference - _alone(members, batch)).abs().max() > 1e-3  # averaging did something


def test_shared_layers_outside_the_model_or_uneven_groups_are_refused() -> None:
    _, members = _base_and_members("llama", ALL_HEADS)
    with pytest.raises(IncompatibleInputError, match=r"--shared-layers 2 is not 0\.\.1"):
        check_shared_layers(members, 2)
    with pytest.raises(IncompatibleInputError, match=r"is not 0\.\.1"):
        check_shared_layers(members, -1)
    # layer 0's union {0, 1, 2} reads key/value head 0 twice and head 1 once
    _, uneven = _base_and_members("llama", [[[0, 1], [0]], [[2], [1]]])
    with pytest.raises(IncompatibleInputError, match="read their key/value heads unevenly"):
        check_shared_layers(uneven, 1)
    check_shared_layers(uneven, 0)  # no trunk: nothing to check


def test_uqc_fuse_shared_layers_end_to_end(cli: Any, tiny_bert_artifact: Any) -> None:
    """`uqc fuse --shared-layers 1`: gated on parity, recorded, loaded back and exported to
    ONNX with the Predictor equal to torch; bad counts get one line and no artifact."""
    import json
    from pathlib import Path

    from tests.conftest import ok
    from uqcompress.export.runtime import Predictor
    from uqcompress.models.loading import load_model, resolve_model_source

    scores = ok(cli("score", tiny_bert_artifact, "--method", "random", "--members", "3"))
    members = ok(cli("prune", scores, "--members", "3"))
    fused = Path(ok(cli("fuse", members, "--shared-layers", "1")))
    manifest = json.loads((fused / "manifest.json").read_text())
    assert manifest["config"]["shared_layers"] == 1
    assert manifest["summary"]["shared_layers"] == 1 and "trunk" in manifest["summary"]
    assert json.loads((fused / "parity.json").read_text())["passed"]
    from uqcompress.steps import config as fields
    from uqcompress.steps.fuse import FuseConfig

    # K = 0 stays out of the id: fused artifacts made before the option keep their ids
    assert "shared_layers" not in fields.id_config(FuseConfig())
    assert fields.id_config(FuseConfig(shared_layers=1))["shared_layers"] == 1

    loaded = load_model(resolve_model_source(fused))
    assert loaded.model.spec.shared_layers == 1
    onnx = Path(ok(cli("export", fused, "--format", "onnx")))
    texts = ["good film", "the worst, most boring plot", "fine"]
    probs = Predictor(onnx).predict_texts(texts).probs
    tokenizer = loaded.tokenizer
    assert tokenizer is not None
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        member_logits = loaded.model(**batch).member_logits
    want = torch.softmax(member_logits, -1).mean(1).numpy()
    assert abs(probs - want).max() < 1e-5

    for bad, words in [("-1", "must be 0 or more"), ("2", "is not 0..1")]:
        out = Path(str(fused) + f"-bad{bad}")
        result = cli("fuse", members, "--shared-layers", bad, "--out", out)
        assert result.code == 1 and words in result.err, result.err
        assert len(result.err.strip().splitlines()) == 1 and not out.exists()
