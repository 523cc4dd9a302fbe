"""MC Dropout (`uqc mc-dropout`): rate 0 is the base model, samples differ at rate > 0, each
example's masks depend on it alone, and the ONNX export (masks thresholded from the fed
draws) matches torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import ok
from uqcompress.artifacts import open_artifact
from uqcompress.methods.mc_dropout import build_mc_dropout
from uqcompress.models.loading import LoadedModel
from uqcompress.models.mc_dropout_model import MCDropoutModel, keep_threshold
from uqcompress.models.tiny import tiny_bert, tiny_vit


def _batch(loaded: LoadedModel, texts: list[str] | None = None) -> dict[str, Any]:
    """Model inputs: the given texts (padded to their longest) or 6 random digits images."""
    from uqcompress.data.dataset import LabeledData
    from uqcompress.data.encoding import collate, encode
    from uqcompress.engine.modality import synthetic_examples

    if texts is None:
        data = synthetic_examples(loaded, count=6)
    else:
        data = LabeledData(spec="t", input_kind="text", texts=texts, labels=None, fingerprint="t")
    encoded = encode(data, loaded, np.zeros(len(data), dtype=np.int64))
    batch = collate(encoded, list(range(len(data))))
    return {k: v for k, v in batch.items() if k != "labels"}


@pytest.mark.parametrize("make", [tiny_bert, tiny_vit], ids=["bert", "vit"])
def test_rate_zero_is_the_base_model_and_a_rate_makes_samples_differ(make: Any) -> None:
    base = make()
    batch = _batch(base)
    with torch.inference_mode():
        reference = base.model(**batch).logits  # [B, C]
        same = build_mc_dropout(base, 3, 0.0, 0).model(**batch).member_logits  # [B, 3, C]
        sampled = build_mc_dropout(base, 4, 0.3, 0).model(**batch).member_logits
    assert same.shape == (len(reference), 3, reference.shape[1])
    torch.testing.assert_close(same, reference[:, None].expand_as(same), atol=1e-5, rtol=0)
    assert sampled.shape[1] == 4
    spread = (sampled - sampled[:, :1]).abs().amax(dim=(0, 2))  # per sample vs sample 0
    assert float(spread[1:].min()) > 1e-3  # every other sample differs from the first
    # the base model itself is untouched: no hook fires outside an MC Dropout forward
    with torch.inference_mode():
        torch.testing.assert_close(base.model(**batch).logits, reference, atol=0, rtol=0)


def test_threshold_keeps_one_minus_rate_of_standard_normal_draws() -> None:
    draws = torch.randn(400_000, generator=torch.Generator().manual_seed(0))
    for rate in (0.1, 0.3, 0.5):
        kept = float((draws > keep_threshold(rate)).float().mean())
        assert abs(kept - (1 - rate)) < 0.005, (rate, kept)
    assert keep_threshold(0.0) == float("-inf")


def test_sites_follow_the_family_anatomy() -> None:
    bert = build_mc_dropout(tiny_bert(), 2, 0.1, 0).model
    vit = build_mc_dropout(tiny_vit(), 2, 0.1, 0).model
    assert isinstance(bert, MCDropoutModel) and isinstance(vit, MCDropoutModel)
    # embeddings + (attention output, MLP output) x 2 layers, + BERT's classifier input
    assert bert.sites == 6 and vit.sites == 5
    assert bert.noise_shape(3, 7) == (3, 2, 6, 7, 32)
    assert vit.noise_shape(3, vit.image_tokens() or 0) == (3, 2, 5, 17, 32)


def test_each_example_gets_its_own_masks_whatever_its_batch() -> None:
    base = tiny_bert()
    model = build_mc_dropout(base, 5, 0.2, 7).model
    texts = ["good fun film", "the acting was really very bad and boring", "great", "dull"]
    with torch.inference_mode():
        together = model(**_batch(base, texts)).member_logits  # padded to the longest
        alone = torch.cat([model(**_batch(base, [t])).member_logits for t in texts])
        model.sample_chunk = 1  # one sample's worth of examples per pass
        chunked = model(**_batch(base, texts)).member_logits
    torch.testing.assert_close(alone, together, atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked, together, atol=1e-5, rtol=0)


@pytest.mark.parametrize("make", [tiny_bert, tiny_vit], ids=["bert", "vit"])
def test_own_masks_are_the_predictors_draws_thresholded(make: Any) -> None:
    """Without `noise`, torch draws per example exactly what the ONNX Predictor feeds."""
    from uqcompress.uq.noise import draw_noise

    base = make()
    model = build_mc_dropout(base, 3, 0.25, 11).model
    batch = _batch(base)
    arrays = {k: v.numpy() for k, v in batch.items()}
    tokens = model.image_tokens()
    length = tokens if tokens is not None else batch["input_ids"].shape[1]
    _, samples, sites, _, hidden = model.noise_shape(1, length)
    noise = draw_noise(arrays, 11, samples, sites, hidden, tokens)
    with torch.inference_mode():
        own = model(**batch).member_logits
        fed = model(noise=torch.from_numpy(noise), **batch).member_logits
    torch.testing.assert_close(own, fed, atol=1e-5, rtol=0)


RECIPE = Path(__file__).parents[2] / "recipes" / "mc-dropout-vit-digits.toml"


@pytest.fixture(scope="module")
def mc_vit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shipped recipe in its quick form: a tiny ViT (1 epoch; the tiny preset trains
    without dropout, so rate 0.2 is given), its MC Dropout model of 4 samples, the ONNX export
    of that and its eval."""
    import contextlib
    import io

    from uqcompress.cli.app import run

    root = tmp_path_factory.mktemp("mcdropout")
    overrides = [
        "vars.preset=tiny",
        "vars.epochs=1",
        "steps.mc_dropout.samples=4",
        "steps.mc_dropout.rate=0.2",
        "gate.acc=>= 0",
    ]
    args = ["run", str(RECIPE), "--json", "--artifacts", str(root / "artifacts")]
    args += [a for item in overrides for a in ("--set", item)]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert run(args) == 0
    report = json.loads(stdout.getvalue())
    assert report["gate"]["passed"] and report["gate"]["step"] == "eval"
    steps = report["steps"]
    return {
        name: Path(steps[step]["path"])
        for name, step in (
            ("base", "base"),
            ("model", "mc_dropout"),
            ("onnx", "onnx"),
            ("eval", "eval"),
        )
    }


def test_export_takes_the_draws_and_matches_torch(mc_vit: dict[str, Path]) -> None:
    from uqcompress.export import contract
    from uqcompress.export.runtime import Predictor
    from uqcompress.models.loading import load_model, resolve_model_source

    parity = json.loads((mc_vit["onnx"] / "parity.json").read_text())
    assert parity["passed"] and parity["max_abs_diff"]["member_logits"] < 1e-4
    predictor = Predictor(mc_vit["onnx"])
    assert predictor.members == 4 and contract.NOISE_INPUT in predictor.input_names
    loaded = load_model(resolve_model_source(mc_vit["model"]))
    rng = np.random.default_rng(0)
    pixels = rng.uniform(0, 255, size=(3, 1, 8, 8)).astype(np.float32)
    inputs = predictor.encode_pixels(pixels)
    # masks from any draws (here: not the per-example ones) agree between the two
    noise = rng.standard_normal(loaded.model.noise_shape(3, 17)).astype(np.float32)
    got = predictor.run({**inputs, contract.NOISE_INPUT: noise})
    with torch.inference_mode():
        want = loaded.model(
            pixel_values=torch.from_numpy(inputs["pixel_values"]), noise=torch.from_numpy(noise)
        ).member_logits.numpy()
    np.testing.assert_allclose(got.member_logits, want, atol=1e-4)
    assert np.abs(want - want[:, :1]).max() > 1e-3  # the fed masks do make samples differ


def test_cli_writes_an_ensemble_that_eval_and_export_take(cli, mc_vit: dict[str, Path]) -> None:  # type: ignore[no-untyped-def]
    manifest = open_artifact(mc_vit["model"], expect_kind="model").manifest
    assert manifest.config["rate"] == 0.2 and manifest.config["samples"] == 4
    summary = manifest.summary
    assert summary["method"] == "mc-dropout" and summary["members"] == 4
    assert summary["dropout_sites"] == 5 and summary["rate_from"] == "--rate"
    torch_eval = json.loads(
        ok(cli("eval", str(mc_vit["model"]), "--data", "builtin:digits@test", "--json"))
    )["summary"]
    onnx_eval = open_artifact(mc_vit["eval"], expect_kind="eval").manifest.summary
    assert torch_eval["members"] == 4 and torch_eval["disagreement"] > 0
    assert torch_eval["mi"] > 0  # the samples disagree: mutual information is not 0
    # the Predictor draws each example's masks as torch does: the same metrics
    assert abs(torch_eval["nll"] - onnx_eval["nll"]) < 1e-5
    assert torch_eval["acc"] == onnx_eval["acc"]
    fewer = cli(
        "eval", str(mc_vit["model"]), "--data", "builtin:digits@test", "--samples", "2", "--json"
    )
    assert json.loads(ok(fewer))["summary"]["members"] == 2  # eval --samples, as DIRECTOR


def test_cli_default_rate_is_the_models_own(cli, tiny_bert_artifact: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first = Path(ok(cli("mc-dropout", str(tiny_bert_artifact), "--samples", "3")))
    summary = open_artifact(first, expect_kind="model").manifest.summary
    assert summary["rate"] == 0.1 and summary["rate_from"] == "hidden_dropout_prob"
    # --rate 0.1 is what the default resolved to: the same artifact, reused
    again = cli("mc-dropout", str(tiny_bert_artifact), "--samples", "3", "--rate", "0.1")
    assert Path(ok(again)) == first and "reusing" in again.err
    # an MC Dropout model is an ensemble: steps on one classifier refuse it in one line
    refused = cli("mc-dropout", str(first))
    assert refused.code == 1 and "is an MC Dropout model" in refused.err


def test_quantized_export_keeps_the_draws_float(mc_vit: dict[str, Path], tmp_path: Path) -> None:
    import onnx

    from uqcompress.export import contract
    from uqcompress.steps import quantize

    result = quantize.run(
        mc_vit["onnx"],
        quantize.QuantizeConfig(mode="dynamic", data="builtin:digits@test"),
        tmp_path / "int8",
    )
    graph = onnx.load(str(result.artifact.path / contract.ONNX_FILE)).graph
    noise = next(i for i in graph.input if i.name == contract.NOISE_INPUT)
    assert noise.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert result.artifact.manifest.summary["members"] == 4


def test_training_mode_draws_fresh_masks_with_the_base_dropout_off() -> None:
    """Fine-tuning an MC Dropout model (uqc finetune takes it like any ensemble) trains
    with fresh masks at its own sites only: the base model's dropout modules stay off."""
    base = tiny_vit()
    model = build_mc_dropout(base, 2, 0.3, 0).model
    batch = _batch(base)
    model.train()
    assert not any(m.training for m in model.inner.modules())
    with torch.no_grad():
        first = model(**batch).member_logits
        second = model(**batch).member_logits
    assert float((first - second).abs().max()) > 1e-3
    model.eval()
    with torch.inference_mode():
        again = model(**batch).member_logits
        torch.testing.assert_close(model(**batch).member_logits, again, atol=0, rtol=0)
