"""Head scoring: Taylor vs finite differences, HIES/AE analytics and padding, circuit search."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from uqcompress.data.dataset import LabeledData
from uqcompress.data.encoding import encode, make_loader, model_inputs
from uqcompress.errors import ConfigError, DataError
from uqcompress.methods.scoring import (
    attention_entropy,
    circuit_evaluations,
    circuit_scores,
    gate_gradient,
    hies_scores,
    l2_scores,
    minmax,
    random_scores,
    taylor_scores,
)
from uqcompress.models.head_gates import HeadGates, attention_probabilities, eager_attention
from uqcompress.models.loading import LoadedModel
from uqcompress.models.tiny import tiny_bert, tiny_vit
from uqcompress.uq.functional import auroc

TEXTS = [
    "good movie",
    "the film was really very boring and the acting was poor",
    "great fun",
    "it was an awful story",
    "wonderful acting",
    "the worst film",
]
LABELS = [1, 0, 1, 0, 1, 0]


def text_batches(
    loaded: LoadedModel, texts: list[str], labels: list[int], batch_size: int
) -> list[dict[str, Any]]:
    """Batches exactly as the CLI builds them (tokenised, padded per batch)."""
    data = LabeledData(
        spec="inline", input_kind="text", labels=labels, fingerprint="inline", texts=texts
    )
    encoded = encode(data, loaded, np.asarray(labels, dtype=np.int64))
    return list(make_loader(encoded, batch_size))


def image_batches(count: int, batch_size: int, seed: int, shift: float = 0.0) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randn(count, 1, 8, 8, generator=gen) + shift
    labels = torch.randint(0, 10, (count,), generator=gen)
    return [
        {"pixel_values": pixels[i : i + batch_size], "labels": labels[i : i + batch_size]}
        for i in range(0, count, batch_size)
    ]


@pytest.fixture(scope="module")
def bert() -> LoadedModel:
    return tiny_bert(seed=1)


@pytest.fixture(scope="module")
def peaked_bert() -> LoadedModel:
    """A tiny BERT whose heads attend with clearly different sharpness.

    A random tiny BERT attends almost uniformly (every AE ~0.99), so min-max normalised AE
    would be float32 rounding noise. Scaling head h's query and key rows by c multiplies its
    attention logits by c^2: heads get AE from ~1 down to ~0.85.
    """
    loaded = tiny_bert(seed=1)
    with torch.no_grad():
        for layer, parts in enumerate(loaded.family.attention_layers(loaded.model)):
            for head in range(4):
                rows = slice(head * 8, (head + 1) * 8)  # head_dim 8
                factor = 1 + 3 * ((head + layer) % 4)
                parts.query.weight[rows] *= factor
                parts.key.weight[rows] *= factor
    return loaded


# --------------------------------------------------------------------------- Taylor


def test_gate_gradient_matches_central_finite_differences() -> None:
    loaded = tiny_bert(seed=2)
    loaded.model.double()  # float64 so the finite difference is accurate to ~1e-10
    (batch,) = text_batches(loaded, TEXTS[:3], LABELS[:3], batch_size=3)
    assert batch["attention_mask"].min() == 0  # the batch really is padded
    grad = gate_gradient(loaded, batch).double()
    inputs, labels = model_inputs(batch), batch["labels"]

    def loss_at(layer: int, head: int, value: float) -> float:
        with torch.no_grad(), HeadGates(loaded) as gates:
            gates.gates[layer][head] = value
            return float(F.cross_entropy(loaded.model(**inputs).logits, labels))

    eps = 2.0**-12  # 1 +- eps is exact in the float32 gates
    fd = torch.tensor(
        [
            [(loss_at(i, h, 1 + eps) - loss_at(i, h, 1 - eps)) / (2 * eps) for h in range(4)]
            for i in range(2)
        ],
        dtype=torch.float64,
    )
    assert grad.shape == (2, 4)
    assert grad.abs().min() > 0
    torch.testing.assert_close(grad, fd, rtol=1e-4, atol=1e-7 * float(grad.abs().max()))

    # One batch: the Taylor score is |dL/dg| over the non-pad tokens seen.
    tokens = int(batch["attention_mask"].sum())
    score = taylor_scores(loaded, [batch])
    assert score.dtype == torch.float32 and score.device.type == "cpu"
    torch.testing.assert_close(score.double(), grad.abs() / tokens, rtol=1e-6, atol=0)


def test_taylor_accumulates_per_batch_abs_and_normalises(bert: LoadedModel) -> None:
    batches = text_batches(bert, TEXTS, LABELS, batch_size=2)
    grads = [gate_gradient(bert, b).double() for b in batches]
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    expected = sum(g.abs() for g in grads) / tokens
    raw = taylor_scores(bert, batches)
    torch.testing.assert_close(raw.double(), expected, rtol=1e-5, atol=0)

    l2 = taylor_scores(bert, batches, layer_l2=True)
    torch.testing.assert_close(l2, raw / raw.norm(dim=1, keepdim=True), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(l2.norm(dim=1), torch.ones(2), rtol=1e-5, atol=0)

    both = taylor_scores(bert, batches, layer_l2=True, global_minmax=True)
    assert float(both.min()) == 0.0 and float(both.max()) == pytest.approx(1.0)
    torch.testing.assert_close(both, (l2 - l2.min()) / (l2.max() - l2.min()), rtol=1e-5, atol=1e-6)


def test_taylor_counts_every_image_token_and_runs_in_eval_mode() -> None:
    loaded = tiny_vit(seed=0)
    batches = image_batches(6, 3, seed=0)
    grads = [gate_gradient(loaded, b).double() for b in batches]
    expected = sum(g.abs() for g in grads) / (6 * 17)  # 16 patches + CLS per image
    torch.testing.assert_close(taylor_scores(loaded, batches).double(), expected, rtol=1e-5, atol=0)

    # Dropout is off while scoring (two runs agree), and the caller's train mode comes back.
    loaded.model.config.hidden_dropout_prob = 0.5
    for module in loaded.model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.5
    loaded.model.train()
    first = taylor_scores(loaded, batches)
    assert loaded.model.training
    torch.testing.assert_close(first, taylor_scores(loaded, batches), rtol=0, atol=0)
    torch.testing.assert_close(first.double(), expected, rtol=1e-5, atol=0)


# --------------------------------------------------------------------------- AE


def test_attention_entropy_analytic_values() -> None:
    t = 5
    mask = torch.ones(2, t)
    uniform = torch.full((2, 3, t, t), 1.0 / t)
    torch.testing.assert_close(attention_entropy(uniform, mask), torch.ones(2, 3))
    one_hot = torch.eye(t).expand(2, 3, t, t)
    torch.testing.assert_close(attention_entropy(one_hot, mask), torch.zeros(2, 3))

    # One uniform row and one one-hot row of a 2-token example: (ln 2 + 0) / (2 ln 2) = 0.5.
    mixed = torch.tensor([[[[0.5, 0.5], [1.0, 0.0]]]])
    torch.testing.assert_close(attention_entropy(mixed, torch.ones(1, 2)), torch.tensor([[0.5]]))

    # Padding: uniform over the 3 valid keys is AE 1, whatever the padded rows/keys hold.
    padded = torch.zeros(1, 2, t, t)
    padded[..., :3] = 1.0 / 3
    padded[..., 3:, :] = torch.rand(1, 2, 2, t)  # padded query rows: ignored
    pad_mask = torch.tensor([[1, 1, 1, 0, 0]])
    torch.testing.assert_close(attention_entropy(padded, pad_mask), torch.ones(1, 2))
    # A single valid token: n log n = 0, AE defined as 0.
    single = torch.tensor([[1, 0, 0, 0, 0]])
    torch.testing.assert_close(attention_entropy(padded, single), torch.zeros(1, 2))


def _uniform_causal(batch: int, heads: int, t: int) -> torch.Tensor:
    """Each query t spread evenly over keys 0..t, zero on later keys (a causal head)."""
    rows = torch.ones(t, t, dtype=torch.float64).tril()
    return (rows / rows.sum(dim=-1, keepdim=True)).expand(batch, heads, t, t)


def test_uniform_causal_head_scores_the_maximum() -> None:
    t = 128
    uniform = _uniform_causal(1, 2, t)
    mask = torch.ones(1, t)
    torch.testing.assert_close(
        attention_entropy(uniform, mask, causal=True), torch.ones(1, 2, dtype=torch.float64)
    )
    # What ln of the whole row gave: sum_t ln t / (n ln n) = 0.80 at n = 128.
    full_row = math.lgamma(t + 1) / (t * math.log(t))
    assert full_row == pytest.approx(0.80, abs=0.005)
    assert attention_entropy(uniform, mask)[0, 0].item() == pytest.approx(full_row, rel=1e-9)
    # One-hot on the first key (an attention sink) scores 0 in a causal head too.
    sink = torch.zeros(1, 1, t, t, dtype=torch.float64)
    sink[..., 0] = 1.0
    assert attention_entropy(sink, mask, causal=True).item() == pytest.approx(0.0, abs=1e-12)


def test_causal_attention_entropy_with_left_padding() -> None:
    # 2 pad tokens then 4 real: query t (real) attends the real keys up to t; a uniform row
    # over them is 1 whatever the padded rows and keys hold. Query 2 (one key) is left out.
    t, pad = 6, 2
    probs = torch.zeros(1, 1, t, t, dtype=torch.float64)
    for q in range(pad, t):
        probs[0, 0, q, pad : q + 1] = 1.0 / (q + 1 - pad)
    probs[0, 0, :pad] = torch.rand(pad, t, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    assert attention_entropy(probs, mask, causal=True).item() == pytest.approx(1.0, rel=1e-12)
    # Hand-computed: rows of 3 keys at (1/2, 1/4, 1/4) -> H = 1.5 ln 2, over ln 3; the rows of
    # 2 and 4 keys uniform (1 each): mean over the 3 scored queries.
    probs[0, 0, 4, pad:5] = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    expected = (1.0 + 1.5 * math.log(2) / math.log(3) + 1.0) / 3
    assert attention_entropy(probs, mask, causal=True).item() == pytest.approx(expected, 1e-12)


def test_hies_normalises_decoder_attention_per_query() -> None:
    from uqcompress.models.factory import create_model

    llama = create_model("llama", ["neg", "pos"], preset="tiny", seed=0)
    assert llama.family.layout.causal and not tiny_bert().family.layout.causal
    batches = text_batches(llama, TEXTS[:2], LABELS[:2], batch_size=2)
    with torch.no_grad(), eager_attention(llama):
        probs = attention_probabilities(
            llama, llama.model(**model_inputs(batches[0]), output_attentions=True)
        )
    mask = batches[0]["attention_mask"]
    expected = torch.stack(
        [attention_entropy(p, mask, causal=True).double().mean(dim=0) for p in probs]
    )
    ae = hies_scores(llama, batches)["ae"]
    torch.testing.assert_close(ae.double(), expected, rtol=1e-4, atol=1e-6)
    # A freshly initialised decoder attends almost uniformly: near the maximum of 1, where
    # ln of the whole row put it far lower.
    assert bool((ae > 0.9).all())
    full_row = torch.stack([attention_entropy(p, mask).double().mean(dim=0) for p in probs])
    assert bool((full_row < 0.85).all())


def test_padding_does_not_change_attention_entropy(bert: LoadedModel) -> None:
    short, long = TEXTS[0], TEXTS[1]
    (alone,) = text_batches(bert, [short], [1], batch_size=1)
    (pair,) = text_batches(bert, [short, long], [1, 0], batch_size=2)
    assert int(pair["attention_mask"][0].sum()) < pair["attention_mask"].shape[1]
    with torch.no_grad(), eager_attention(bert):
        probs_alone = attention_probabilities(
            bert, bert.model(**model_inputs(alone), output_attentions=True)
        )
        probs_pair = attention_probabilities(
            bert, bert.model(**model_inputs(pair), output_attentions=True)
        )
    for layer in range(2):
        ae_alone = attention_entropy(probs_alone[layer], alone["attention_mask"])[0]
        ae_padded = attention_entropy(probs_pair[layer], pair["attention_mask"])[0]
        torch.testing.assert_close(ae_padded, ae_alone, rtol=1e-5, atol=1e-6)
        assert bool(((ae_alone > 0) & (ae_alone <= 1)).all())

    # End to end: one padded batch of two = the mean of the two unpadded examples, for AE and
    # for per-sample HIS (which does not depend on how examples are batched).
    together = hies_scores(bert, [pair])
    (long_alone,) = text_batches(bert, [long], [0], batch_size=1)
    apart = [hies_scores(bert, [b]) for b in (alone, long_alone)]
    for key in ("ae", "his"):
        mean = (apart[0][key] + apart[1][key]) / 2
        torch.testing.assert_close(together[key], mean, rtol=1e-4, atol=1e-7)


# --------------------------------------------------------------------------- HIES


def test_his_of_one_example_is_its_taylor_score(bert: LoadedModel) -> None:
    (batch,) = text_batches(bert, TEXTS[3:4], LABELS[3:4], batch_size=1)
    his = hies_scores(bert, [batch])["his"]
    # B = 1: s_h = (1/n) sum_t <g, a> = (1/n) dL/dg_h, so |s_h| = Taylor's |dL/dg| / tokens.
    torch.testing.assert_close(his, taylor_scores(bert, [batch]), rtol=1e-4, atol=1e-9)


def test_his_abs_batch_vs_sample(bert: LoadedModel) -> None:
    singles = text_batches(bert, TEXTS, LABELS, batch_size=1)
    sample = hies_scores(bert, singles, his_abs="sample")["his"]
    torch.testing.assert_close(hies_scores(bert, singles, his_abs="batch")["his"], sample)
    pairs = text_batches(bert, TEXTS, LABELS, batch_size=3)
    torch.testing.assert_close(hies_scores(bert, pairs)["his"], sample, rtol=1e-4, atol=1e-8)
    batched = hies_scores(bert, pairs, his_abs="batch")["his"]
    assert bool((batched <= sample * (1 + 1e-5)).all())
    assert float((sample - batched).max()) > 0  # signs really do cancel across examples


def test_hies_alpha_endpoints_and_range(peaked_bert: LoadedModel) -> None:
    bert = peaked_bert
    batches = text_batches(bert, TEXTS, LABELS, batch_size=3)
    importance = hies_scores(bert, batches, alpha=1.0)
    his_tilde = minmax(importance["his"])
    torch.testing.assert_close(importance["score"], his_tilde)
    assert torch.equal(importance["score"].flatten().argsort(), his_tilde.flatten().argsort())

    entropy = hies_scores(bert, batches, alpha=0.0)
    ad = 1 - minmax(entropy["ae"])
    torch.testing.assert_close(entropy["score"], ad)
    assert torch.equal(entropy["score"].flatten().argsort(), ad.flatten().argsort())
    torch.testing.assert_close(entropy["ae"], importance["ae"])
    assert bool(((entropy["ae"] > 0.5) & (entropy["ae"] <= 1 + 1e-6)).all())
    assert float(entropy["ae"].max() - entropy["ae"].min()) > 0.05

    half = hies_scores(bert, batches)
    torch.testing.assert_close(half["score"], 0.5 * his_tilde + 0.5 * ad)
    assert float(half["score"].min()) >= 0.0 and float(half["score"].max()) <= 1.0
    assert all(v.shape == (2, 4) and v.dtype == torch.float32 for v in half.values())

    per_layer = hies_scores(bert, batches, alpha=1.0, norm_scope="layer")["score"]
    torch.testing.assert_close(per_layer.amin(dim=1), torch.zeros(2))
    torch.testing.assert_close(per_layer.amax(dim=1), torch.ones(2))


def test_minmax_constant_is_zero() -> None:
    torch.testing.assert_close(minmax(torch.full((2, 3), 0.7)), torch.zeros(2, 3))
    x = torch.tensor([[1.0, 1.0, 1.0], [0.0, 2.0, 4.0]])
    torch.testing.assert_close(minmax(x, "layer"), torch.tensor([[0, 0, 0], [0, 0.5, 1.0]]))
    torch.testing.assert_close(minmax(x), torch.tensor([[0.25, 0.25, 0.25], [0, 0.5, 1.0]]))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"alpha": -0.1},
        {"alpha": 1.01},
        {"alpha": math.nan},
        {"his_abs": "mean"},
        {"norm_scope": "all"},
    ],
)
def test_hies_rejects_bad_options(bert: LoadedModel, kwargs: dict[str, Any]) -> None:
    batches = text_batches(bert, TEXTS[:2], LABELS[:2], batch_size=2)
    with pytest.raises(ConfigError) as info:
        hies_scores(bert, batches, **kwargs)
    assert info.value.hint


# --------------------------------------------------------------------------- circuit


def decisive_vit(decisive: dict[int, int]) -> tuple[LoadedModel, list[dict]]:
    """A tiny ViT in which, per layer, exactly one head can change the output.

    Every other head's columns of the output projection are zeroed, so gating those heads is
    a no-op: keeping the decisive head alone reproduces the full model exactly, while keeping
    any other single head removes the layer's whole attention contribution. The decisive
    head's columns are scaled x20 so that its input-dependent output dominates the residual
    stream (a random tiny ViT otherwise predicts nearly the same class for every image), and
    the labels are the full model's own predictions, made confident by scaling the classifier
    x20: the decisive head's candidate has the full model's NLL, every other candidate
    mislabels many examples with confidence.
    """
    loaded = tiny_vit(seed=3)
    parts = loaded.family.attention_layers(loaded.model)
    with torch.no_grad():
        for layer, head in decisive.items():
            weight = parts[layer].output.weight  # [hidden, H*d], d = 8
            keep = weight[:, head * 8 : (head + 1) * 8].clone()
            weight.zero_()
            weight[:, head * 8 : (head + 1) * 8] = keep * 20
        model: Any = loaded.model  # transformers modules are untyped attribute trees
        model.classifier.weight.mul_(20)
        batches = image_batches(48, 16, seed=4)
        for batch in batches:
            batch["labels"] = model(pixel_values=batch["pixel_values"]).logits.argmax(-1)
    return loaded, batches


def test_circuit_picks_the_decisive_head_first() -> None:
    loaded, batches = decisive_vit({0: 2, 1: 1})
    calls: list[tuple[int, int]] = []
    score, kept = circuit_scores(
        loaded, batches, [1, 2], progress=lambda done, total: calls.append((done, total))
    )
    assert kept[0] == [2] and 1 in kept[1] and len(kept[1]) == 2
    assert int(score[0].argmax()) == 2 and int(score[1].argmax()) == 1
    assert score[0, 2] == 4 and score[1, 1] == 4
    for row in score:  # each layer's scores are a permutation of 1..H
        assert sorted(row.tolist()) == [1.0, 2.0, 3.0, 4.0]
    total = 4 + (4 + 3)
    assert circuit_evaluations([1, 2], 4) == total
    assert calls == [(i, total) for i in range(1, total + 1)]

    # A head nobody picks ranks below every picked head, by its objective at the last pick.
    score3, kept3 = circuit_scores(loaded, batches, [3, 1])
    assert [len(k) for k in kept3] == [3, 1]
    assert 2 in kept3[0] and kept3[1] == [1]
    unpicked = next(h for h in range(4) if h not in kept3[0])
    assert score3[0, unpicked] == 1 and score3[0, 2] == 4


def test_circuit_keep_all_and_evaluation_count() -> None:
    loaded, batches = decisive_vit({0: 2})
    calls: list[tuple[int, int]] = []
    score, kept = circuit_scores(
        loaded, batches, [4, 4], progress=lambda d, t: calls.append((d, t))
    )
    assert kept == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert len(calls) == circuit_evaluations([4, 4], 4) == 2 * (4 + 3 + 2)
    assert score[0, 2] == 4


def test_circuit_with_ood_objective_runs() -> None:
    loaded, batches = decisive_vit({0: 2, 1: 1})
    ood = [{"pixel_values": b["pixel_values"] * 4 + 3} for b in image_batches(32, 16, seed=9)]
    calls: list[tuple[int, int]] = []
    score, kept = circuit_scores(
        loaded, batches, [2, 3], ood_batches=ood, progress=lambda d, t: calls.append((d, t))
    )
    assert [len(k) for k in kept] == [2, 3]
    assert all(k == sorted(k) for k in kept)
    assert bool(torch.isfinite(score).all()) and score.shape == (2, 4)
    assert len(calls) == (4 + 3) + (4 + 3 + 2)


def test_auroc_matches_sklearn_with_ties() -> None:
    from sklearn.metrics import roc_auc_score

    gen = torch.Generator().manual_seed(0)
    s_in = torch.randint(0, 6, (40,), generator=gen).double()
    s_out = torch.randint(2, 9, (25,), generator=gen).double()
    expected = roc_auc_score(np.r_[np.zeros(40), np.ones(25)], np.r_[s_in.numpy(), s_out.numpy()])
    assert auroc(s_in, s_out) == pytest.approx(expected, abs=1e-12)
    assert auroc(torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0])) == 1.0
    assert auroc(torch.tensor([1.0]), torch.tensor([1.0])) == 0.5


@pytest.mark.parametrize("keep", [[1], [0, 2], [2, 5], [1, 2, 3]])
def test_circuit_rejects_bad_keep(keep: list[int]) -> None:
    loaded = tiny_vit(seed=0)
    with pytest.raises(ConfigError):
        circuit_scores(loaded, image_batches(4, 4, seed=0), keep)


# --------------------------------------------------------------------------- baselines, guards


def test_random_scores_are_seeded() -> None:
    a, b, c = random_scores(3, 5, 7), random_scores(3, 5, 7), random_scores(3, 5, 8)
    assert a.shape == (3, 5) and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert float(a.min()) >= 0.0 and float(a.max()) < 1.0
    with pytest.raises(ConfigError):
        random_scores(0, 4, 1)


def test_l2_scores_by_hand(bert: LoadedModel) -> None:
    scores = l2_scores(bert)
    weight = bert.family.attention_layers(bert.model)[1].output.weight.detach()
    by_hand = math.sqrt(sum(float(w) ** 2 for w in weight[:, 16:24].flatten()))  # head 2, d 8
    assert scores.shape == (2, 4) and scores.dtype == torch.float32
    assert float(scores[1, 2]) == pytest.approx(by_hand, rel=1e-5)
    assert len(set(scores.flatten().tolist())) == 8


def test_unlabelled_or_empty_batches_are_data_errors(bert: LoadedModel) -> None:
    (batch,) = text_batches(bert, TEXTS[:2], LABELS[:2], batch_size=2)
    with pytest.raises(DataError, match="labels"):
        taylor_scores(bert, [model_inputs(batch)])
    with pytest.raises(DataError, match="empty"):
        hies_scores(bert, [])
    with pytest.raises(DataError, match="empty"):
        circuit_scores(bert, [], [1, 1])
