"""benchmarks/hydra_mlp_width.py: the narrowed member it trains and the FLOPs it reports (the
measurement itself needs the real packages and runs by hand)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tests.benchmarks.script_args import benchmark
from uqcompress.methods.mlp_width import member_neurons, neuron_order
from uqcompress.models.loading import load_model, resolve_model_source
from uqcompress.models.tiny import tiny_bert

width = benchmark("hydra_mlp_width")


def test_the_cut_member_computes_what_gating_its_dropped_neurons_computes(
    tmp_path: Path,
) -> None:
    loaded = tiny_bert(["a", "b"], seed=3)
    reference = copy.deepcopy(loaded.model).eval()
    source = tmp_path / "member"
    from uqcompress.models.loading import save_model

    save_model(loaded, source)
    cut = width.narrowed_member(source, 1, 1 / 3, tmp_path / "cut")
    narrow = load_model(resolve_model_source(cut))
    inner = int(loaded.config.intermediate_size)
    assert int(narrow.config.intermediate_size) == len(range(inner)[1::3])
    for block in narrow.family.blocks(reference):
        mlp = narrow.family.block_parts(block, loaded.config).mlp
        keep = member_neurons(neuron_order(mlp.up, mlp.down, mlp.gate), 3, 1, 1 / 3)
        mask = torch.zeros(inner)
        mask[keep] = 1.0
        mlp.down.register_forward_pre_hook(lambda _, args, mask=mask: (args[0] * mask,))
    ids = torch.randint(
        5, int(loaded.config.vocab_size), (2, 9), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        want = reference(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        got = narrow.model.eval()(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert torch.allclose(got, want, atol=1e-5)
    with torch.no_grad():
        full = loaded.model.eval()(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert float((want - full).abs().max()) > 10 * 1e-5  # the cut changed the function


def test_the_fused_flops_of_a_third_each_are_one_models() -> None:
    config = {"hidden_size": 384, "intermediate_size": 1536}
    assert width.fused_flops_ratio(config, 64, 1 / 3) == pytest.approx(1.0)
    assert width.fused_flops_ratio(config, 64, 1.0) == pytest.approx(4_227_072 / 1_867_776)
