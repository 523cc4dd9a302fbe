"""Singular Value Ensembles: exact where they must be, trainable only where they should be."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from uqcompress.errors import ConfigError
from uqcompress.methods.sve import (
    build_sve,
    materialize,
    overhead_closed_form,
    overhead_paper_fraction,
    parameter_report,
    resolve_targets,
)
from uqcompress.models.factory import create_model
from uqcompress.models.loading import LoadedModel, load_model, resolve_model_source, save_model
from uqcompress.models.sve_model import SVDLinear

LABELS = ["a", "b", "c"]


def _batch(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    if loaded.input_kind == "image":
        return {"pixel_values": torch.randn(5, 1, 8, 8, generator=generator)}
    ids = torch.randint(5, 700, (5, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def _member_logits(loaded: LoadedModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.inference_mode():
        out: Any = loaded.model(**batch)
        return out.member_logits


@pytest.mark.parametrize("family", ["vit", "bert"])
def test_one_noiseless_full_rank_member_reproduces_the_base(family: str) -> None:
    base = create_model(family, LABELS, preset="tiny")
    sve = build_sve(base, members=1, targets="default", rank=None, sigma_init=0.0, seed=0)
    batch = _batch(base)
    with torch.inference_mode():
        want = base.model(**batch).logits
    got = _member_logits(sve, batch)
    assert got.shape == (5, 1, 3)
    assert torch.allclose(got[:, 0], want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["vit", "bert"])
def test_members_start_apart_and_the_base_is_left_alone(family: str) -> None:
    base = create_model(family, LABELS, preset="tiny")
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    sve = build_sve(base, members=3, targets="default", rank=None, sigma_init=0.05, seed=0)
    logits = _member_logits(sve, _batch(base))
    assert (logits[:, 0] - logits[:, 1]).abs().max() > 1e-6  # tiny random models: small logits
    assert all(torch.equal(before[k], v) for k, v in base.model.state_dict().items())


def test_factorised_forward_equals_the_materialised_weights() -> None:
    generator = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(6, 4)
    layer = SVDLinear.from_linear(linear, members=3, rank=4, sigma_init=0.3, generator=generator)
    with torch.no_grad():
        layer.singular_values[1, 0] = -0.5  # a negative value: the clamp must apply in both
    x = torch.randn(3 * 2, 5, 6, generator=generator)
    out = layer(x)
    for m in range(3):
        s = layer.singular_values[m].clamp(min=0)
        dense = layer.u @ torch.diag(s) @ layer.v.t()  # U diag(s_m) V^T, [out, in]
        want = F.linear(x[2 * m : 2 * m + 2], dense, layer.bias[m])
        assert torch.allclose(out[2 * m : 2 * m + 2], want, atol=1e-5)
        assert torch.allclose(layer.dense_weight()[m], dense.t(), atol=1e-6)


@pytest.mark.parametrize("family", ["vit", "bert"])
def test_materialised_model_computes_the_same_function(family: str) -> None:
    base = create_model(family, LABELS, preset="tiny")
    sve: Any = build_sve(base, members=3, targets="default", rank=None, sigma_init=0.1, seed=1)
    batch = _batch(base)
    with torch.inference_mode():
        dense = materialize(sve.model)(**batch).member_logits
    assert torch.allclose(dense, _member_logits(sve, batch), atol=1e-5)


def test_only_member_parameters_train_and_singular_vectors_stay_bitwise() -> None:
    from torch.utils.data import DataLoader

    from uqcompress.engine.train import TrainConfig, train

    base = create_model("vit", LABELS, preset="tiny")
    sve: Any = build_sve(base, members=2, targets="default", rank=None, sigma_init=0.01, seed=0)
    model = sve.model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    heads = {"inner.classifier.weight", "inner.classifier.bias"}
    assert heads <= trainable
    assert all(n.endswith((".singular_values", ".bias")) for n in trainable - heads)
    assert not any("layernorm" in n or "embeddings" in n for n in trainable)
    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    vectors = {n: b.clone() for n, b in model.named_buffers()}
    trained_before = {n: p.clone() for n, p in model.named_parameters() if p.requires_grad}
    images = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    rows = [{"pixel_values": images[i], "labels": torch.tensor(i % 3)} for i in range(16)]
    train(model, DataLoader(rows, batch_size=8), TrainConfig(epochs=2, lr=1e-2, batch_size=8))  # type: ignore[arg-type]
    assert all(torch.equal(b, vectors[n]) for n, b in model.named_buffers())
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    moved = [n for n, p in model.named_parameters() if n in trained_before]
    assert all(not torch.equal(dict(model.named_parameters())[n], trained_before[n]) for n in moved)


def test_counted_overhead_matches_the_closed_form() -> None:
    base = create_model("vit", LABELS, preset="tiny")  # d 32, I 64, 2 layers, 3 classes
    for members in (1, 4, 8):
        sve: Any = build_sve(base, members, "default", None, 0.01, 0)
        report = parameter_report(base.model, sve.model)
        config = base.config
        assert report.extra == overhead_closed_form(
            int(config.num_hidden_layers),
            int(config.hidden_size),
            int(config.intermediate_size),
            len(LABELS),
            members,
        )
    # At BERT-base's d = 768 and I = 4d the per-layer closed form is the paper's 5 (M-1) / 4d.
    per_layer = overhead_closed_form(1, 768, 3072, 0, 8) / (12 * 768 * 768)
    assert per_layer == pytest.approx(overhead_paper_fraction(768, 8))
    assert round(100 * per_layer, 2) == 1.14


def test_targets_presets_patterns_and_misses() -> None:
    base = create_model("bert", LABELS, preset="tiny")
    assert len(resolve_targets(base, "default")) == 6 * 2
    assert len(resolve_targets(base, "attention")) == 4 * 2
    assert resolve_targets(base, r"layer\.0\..*query") == [
        "bert.encoder.layer.0.attention.self.query"
    ]
    with pytest.raises(ConfigError, match=r"matches no linear layer.*bert\.encoder\.layer\.N\."):
        resolve_targets(base, "nothing_like_this")
    with pytest.raises(ConfigError, match="larger than"):
        build_sve(base, 2, "default", 33, 0.01, 0)


@pytest.mark.parametrize("family", ["vit", "bert"])
def test_saved_sve_loads_back_identically(family: str, tmp_path: Path) -> None:
    base = create_model(family, LABELS, preset="tiny")
    sve = build_sve(base, members=3, targets="attention", rank=4, sigma_init=0.05, seed=2)
    save_model(sve, tmp_path / "sve")
    loaded = load_model(resolve_model_source(tmp_path / "sve"))
    assert loaded.members == 3 and loaded.labels == LABELS
    batch = _batch(base)
    assert torch.equal(_member_logits(loaded, batch), _member_logits(sve, batch))
    assert loaded.num_parameters() == sve.num_parameters()


@pytest.mark.parametrize("family", ["vit", "bert"])
def test_each_folded_member_equals_a_dense_model_with_its_own_weights(family: str) -> None:
    import copy

    from uqcompress.models.surgery import replace_module

    base = create_model(family, LABELS, preset="tiny")
    sve: Any = build_sve(base, members=3, targets="default", rank=None, sigma_init=0.2, seed=4)
    batch = _batch(base)
    folded = _member_logits(sve, batch)
    for m in range(3):
        dense: Any = copy.deepcopy(base.model)
        for name, module in sve.model.inner.named_modules():
            if isinstance(module, SVDLinear):
                linear = torch.nn.Linear(module.in_features, module.out_features)
                with torch.no_grad():
                    linear.weight.copy_(module.dense_weight()[m].t())
                    linear.bias.copy_(module.bias[m])
                replace_module(dense, name, linear)
        head = sve.model.inner.classifier
        with torch.no_grad():
            dense.classifier.weight.copy_(head.weight[m].t())
            dense.classifier.bias.copy_(head.bias[m, 0])
            want = dense.eval()(**batch).logits
        assert torch.allclose(folded[:, m], want, atol=1e-5), m
    assert (folded[:, 0] - folded[:, 1]).abs().max() > 1e-4


# --------------------------------------------------------------- biases (issue 26 item 9)


def _svd_layers(sve: Any) -> dict[str, Any]:
    from uqcompress.models.sve_model import SVDLinear

    return {n: m for n, m in sve.model.inner.named_modules() if isinstance(m, SVDLinear)}


def test_layers_without_bias_get_no_member_bias_by_default() -> None:
    base = create_model("llama", LABELS, preset="tiny")  # no projection has a bias
    sve: Any = build_sve(base, 4, "default", None, 0.01, 0)
    layers = _svd_layers(sve)
    assert layers and all(base.model.get_submodule(n).bias is None for n in layers)
    assert all(layer.bias is None for layer in layers.values())
    assert sve.model.spec.biases == [False] * len(layers)
    extra: Any = build_sve(base, 4, "default", None, 0.01, 0, extra_biases=True)
    assert all(layer.bias is not None for layer in _svd_layers(extra).values())
    # the members' singular values are the same draws either way
    for name, layer in _svd_layers(extra).items():
        assert torch.equal(layer.singular_values, layers[name].singular_values)
    # BERT's projections all have biases: kept, as before
    bert: Any = build_sve(create_model("bert", LABELS, preset="tiny"), 2, "default", None, 0.01, 0)
    assert all(layer.bias is not None for layer in _svd_layers(bert).values())


def test_overhead_counts_added_biases_apart() -> None:
    base = create_model("llama", LABELS, preset="tiny")
    members = 4
    paper: Any = build_sve(base, members, "default", None, 0.01, 0)
    extra: Any = build_sve(base, members, "default", None, 0.01, 0, extra_biases=True)
    layers = _svd_layers(paper)
    values = sum(layer.rank for layer in layers.values())
    head = base.model.get_submodule(base.family.classifier_name(base.model))
    head_size = head.weight.numel() + head.out_features  # each member's head has a bias
    expected = (members - 1) * (values + head_size)  # singular values and heads only
    a = parameter_report(base.model, paper.model)
    b = parameter_report(base.model, extra.model)
    assert a.extra == b.extra == expected
    assert a.added_biases == 0
    assert b.added_biases == members * sum(layer.out_features for layer in layers.values())
    assert b.overhead_with_added_biases > b.overhead == a.overhead == expected / a.base
    assert a.trainable + b.added_biases == b.trainable


def test_an_sve_spec_without_biases_loads_as_before() -> None:
    from uqcompress.models.sve_model import SVESpec

    old = SVESpec(2, ["a", "b"], [4, 4], 0.01, 0)
    raw = old.to_dict()
    assert "biases" not in raw  # an SVE made before the option: every target had biases

    class Config:
        pass

    config: Any = Config()
    setattr(config, "uqc_sve", raw)  # noqa: B010
    spec = SVESpec.from_config(config)
    assert spec.biases is None and spec.has_bias(0) and spec.has_bias(1)
    config.uqc_sve = {**raw, "biases": [True, False]}
    assert SVESpec.from_config(config).biases == [True, False]
