"""The facts each family declares for the methods that build their own modules: the config keys
Hydra members must share (`shape_keys`), MC Dropout's sites (`dropout_sites`) and the Hydra
model's per-member norm (`member_norm`). Each is read from the family, never from a table of
family names elsewhere."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from uqcompress.errors import IncompatibleInputError
from uqcompress.methods.hydra import check_fusable
from uqcompress.models.families import FAMILIES, Family, family_by_name
from uqcompress.models.families.base import BLOCK_SHAPE_KEYS, DropoutSites
from uqcompress.models.mc_dropout_model import MC_DROPOUT_FAMILIES, mc_dropout_family

# The config keys Hydra compared for every family before each family declared its own: a
# family's `shape_keys` must keep every one of them its configs carry, in this order.
ARCHITECTURE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "layer_norm_eps",
    "vocab_size",
    "max_position_embeddings",
    "type_vocab_size",
    "embedding_size",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "mlp_ratio",
    "use_swiglu_ffn",
    "image_size",
    "patch_size",
    "num_channels",
)


def _tiny_config(family: Family) -> Any:
    sizes = {"image_size": 8, "patch_size": 2} if family.input_kind == "image" else {}
    return family.build_config("tiny", {}, ["a", "b"], **sizes)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_shape_keys_keep_every_architecture_key_the_config_carries(name: str) -> None:
    family = family_by_name(name)
    config = _tiny_config(family)
    carried = [key for key in ARCHITECTURE_KEYS if getattr(config, key, None) is not None]
    assert family.shape_keys[: len(BLOCK_SHAPE_KEYS)] == BLOCK_SHAPE_KEYS
    assert len(set(family.shape_keys)) == len(family.shape_keys)
    # every carried key is checked, in the order a refusal has always named the first
    assert [key for key in family.shape_keys if key in carried] == carried


def _changed(value: Any) -> Any:
    """Another value of the same type."""
    if isinstance(value, bool):
        return not value
    return "other" if isinstance(value, str) else value * 2


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_hydra_refuses_members_that_differ_at_a_shape_key(name: str) -> None:
    family = family_by_name(name)
    config = _tiny_config(family)
    first = SimpleNamespace(config=config, family=family, labels=["a", "b"])
    carried = [key for key in family.shape_keys if getattr(config, key, None) is not None]
    assert carried
    for key in carried:
        other = copy.deepcopy(config)
        setattr(other, key, _changed(getattr(config, key)))
        member = SimpleNamespace(config=other, family=family, labels=["a", "b"])
        with pytest.raises(IncompatibleInputError, match=f"different base models: {key} is"):
            check_fusable([first, member], ["first", "other"])  # type: ignore[list-item]
    check_fusable([first, copy.deepcopy(first)], ["first", "same"])  # type: ignore[list-item]


def test_mc_dropout_reads_each_familys_dropout_sites() -> None:
    declared = {name: family.dropout_sites for name, family in FAMILIES.items()}
    assert declared["bert"] == DropoutSites(classifier=True)
    assert declared["vit"] == DropoutSites(classifier=False)
    assert MC_DROPOUT_FAMILIES == ("bert", "vit")
    assert {name for name, sites in declared.items() if sites is not None} == {"bert", "vit"}
    from uqcompress.errors import ConfigError

    for name in FAMILIES:
        if name in MC_DROPOUT_FAMILIES:
            assert mc_dropout_family(family_by_name(name)).name == name
        else:
            with pytest.raises(ConfigError, match="MC Dropout supports the bert and vit families"):
                mc_dropout_family(family_by_name(name))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_member_norm_is_the_familys_norm_per_member(name: str) -> None:
    family = family_by_name(name)
    norm = family.member_norm(3, 8, 1e-5)
    expected = {"layernorm": "MemberLayerNorm", "rmsnorm": "MemberRMSNorm"}[family.layout.norm]
    assert type(norm).__name__ == expected
    weight: Any = norm.weight
    assert tuple(weight.shape) == (3, 8)
    x = torch.randn(3 * 2, 5, 8)  # [M*B, T, d]
    assert norm(x).shape == x.shape


def test_the_registry_lists_every_registered_family_by_kind() -> None:
    from uqcompress.models.families import _listed
    from uqcompress.models.families.bert import BertFamily

    assert list(FAMILIES) == [
        *("bert", "roberta", "xlm-roberta", "distilbert", "electra"),
        *("llama", "qwen2", "qwen3", "mistral"),
        *("vit", "deit", "dinov2"),
    ]

    class Unlisted(BertFamily):
        name = "unlisted-encoder"

    order = [f.name for f in _listed([*FAMILIES.values(), Unlisted()])]
    assert order.index("unlisted-encoder") == order.index("electra") + 1  # last encoder
