"""head_dim comes from one function that honours `config.head_dim` (issue 14, item 19)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from uqcompress.models.director_model import Transition
from uqcompress.models.families import family_by_name
from uqcompress.models.families.base import config_head_dim
from uqcompress.models.head_gates import head_dim
from uqcompress.models.hydra_model import HydraLayer


def _config(**extra: Any) -> SimpleNamespace:
    return SimpleNamespace(
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        layer_norm_eps=1e-12,
        attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
        hidden_act="gelu",
        **extra,
    )


def test_config_head_dim_honours_an_explicit_head_dim() -> None:
    assert config_head_dim(_config()) == 8  # hidden / heads
    assert config_head_dim(_config(head_dim=16)) == 16  # wider heads than hidden / heads
    assert config_head_dim(_config(head_dim=None)) == 8  # transformers' "not set"
    loaded = SimpleNamespace(config=_config(head_dim=16))
    assert head_dim(loaded) == 16  # type: ignore[arg-type]  # gates and surgery use it


def test_the_hydra_layer_uses_the_configs_head_dim() -> None:
    config = _config(head_dim=16)
    vit = family_by_name("vit")
    sizes = vit.sizes(config)  # type: ignore[arg-type]
    layer = HydraLayer(sizes, config_head_dim(config), members=2, slots=3, family=vit)
    assert layer.attention.head_dim == 16
    x = torch.randn(2 * 5, 7, 32)  # [M*B, T, d]
    assert layer(x, None).shape == x.shape


def test_directors_transition_uses_the_configs_head_dim() -> None:
    transition = Transition(32, 4, config_head_dim(_config(head_dim=16)), depth=1)
    block = transition.blocks[0]
    assert block.head_dim == 16 and block.qkv.out_features == 3 * 4 * 16
    mean, std = transition(torch.randn(3, 5, 32), 0, None)
    assert mean.shape == std.shape == (3, 5, 32)


def test_the_director_student_reads_head_dim_from_the_teachers_config() -> None:
    from uqcompress.methods.director import build_student
    from uqcompress.models.factory import create_model

    teacher = create_model("bert", ["a", "b"], preset="tiny")
    teacher.config.head_dim = 16  # the DiT's attention is the student's own: any width works
    student = build_student(teacher, None, 1, 2, seed=0)
    assert student.transition.blocks[0].head_dim == 16
    ids = torch.randint(5, 700, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = student(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert out.member_logits.shape == (2, 2, 2)
