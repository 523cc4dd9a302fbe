"""DIRECTOR predictions do not depend on the batch (issue 14, item 18): an example's noise is
seeded by the model's seed and its own content, drawn at its true length, so it gets the same
probabilities alone or in any batch, padded or not, in torch, in the ONNX Predictor and in
`uqc predict`; and the frozen parts of the student run without dropout (item 22)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import ok, write_csv
from uqcompress.methods.director import build_student
from uqcompress.models.factory import create_model
from uqcompress.uq.noise import ExampleNoise, draw_noise

TOL = 1e-6
LONG = " ".join(["good bad movie film plot actors"] * 12)  # pads every short text it meets


def _texts() -> list[str]:
    words = ["good", "bad", "movie", "plot", "great", "awful", "film", "boring"]
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, size=n)) for n in (3, 9, 1, 6, 12, 2, 7, 4)]
    return [*texts[:3], LONG, *texts[3:]]  # a much longer text in the first batches


def _ids_batch(lengths: list[int], width: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(5, 700, (n,), generator=generator)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def _rows(batch: dict[str, torch.Tensor], index: list[int], width: int) -> dict[str, Any]:
    return {k: v[index, :width] for k, v in batch.items()}


def _probs(model: Any, batch: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return torch.softmax(model(**batch).member_logits, dim=-1)  # [B, S, C]


@pytest.fixture(scope="module")
def spread_student() -> Any:
    """A tiny BERT student whose std is large: different noise moves the logits a lot."""
    teacher = create_model("bert", ["a", "b", "c"], preset="tiny")
    teacher.model.eval()
    student = build_student(teacher, None, 1, 4, seed=0)
    with torch.no_grad():
        student.transition.std_head[1].bias.fill_(1.0)
    return student


def test_torch_probs_do_not_depend_on_batch_size_position_or_padding(spread_student: Any) -> None:
    lengths = [12, 3, 7, 40, 1, 5, 12, 2]  # one long example pads the others to 40
    batch = _ids_batch(lengths, 40)
    whole = _probs(spread_student, batch)
    pairs = torch.cat([_probs(spread_student, _rows(batch, [i, i + 1], 40)) for i in (0, 2, 4, 6)])
    assert float((pairs - whole).abs().max()) <= TOL
    for i, n in enumerate(lengths):  # alone, at its true length: no padding at all
        alone = _probs(spread_student, _rows(batch, [i], n))
        assert float((alone - whole[i : i + 1]).abs().max()) <= TOL, i
    reversed_order = _probs(spread_student, _rows(batch, list(range(8))[::-1], 40))
    assert float((reversed_order.flip(0) - whole).abs().max()) <= TOL
    # The draws matter (the test would pass trivially otherwise): samples differ.
    assert float((whole[:, 0] - whole[:, 1]).abs().max()) > 1e-3


def test_image_probs_do_not_depend_on_the_batch() -> None:
    teacher = create_model("vit", [str(d) for d in range(10)], preset="tiny")
    teacher.model.eval()
    student = build_student(teacher, None, 1, 3, seed=0)
    with torch.no_grad():
        student.transition.std_head[1].bias.fill_(1.0)
    pixels = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    whole = _probs(student, {"pixel_values": pixels})
    parts = torch.cat([_probs(student, {"pixel_values": pixels[i : i + 2]}) for i in (0, 2, 4)])
    single = _probs(student, {"pixel_values": pixels[4:5]})
    assert float((parts - whole).abs().max()) <= TOL
    assert float((single - whole[4:5]).abs().max()) <= TOL
    assert float((whole[:, 0] - whole[:, 1]).abs().max()) > 1e-3


def test_noise_is_keyed_on_content_and_seed_and_zero_on_padding() -> None:
    short = {"input_ids": np.array([[7, 8, 9]]), "attention_mask": np.array([[1, 1, 1]])}
    padded = {
        "input_ids": np.array([[7, 8, 9, 0, 0], [1, 2, 3, 4, 5]]),
        "attention_mask": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]),
    }
    alone = draw_noise(short, seed=0, samples=2, steps=3, hidden=4)  # [1, S, K, 3, d]
    batched = draw_noise(padded, seed=0, samples=2, steps=3, hidden=4)  # [2, S, K, 5, d]
    assert np.array_equal(alone[0], batched[0, :, :, :3])
    assert not batched[0, :, :, 3:].any()  # padding: zeros
    assert not np.array_equal(draw_noise(short, 1, 2, 3, 4), alone)  # the seed matters
    other = {**short, "input_ids": np.array([[7, 8, 10]])}
    assert not np.array_equal(draw_noise(other, 0, 2, 3, 4), alone)  # so does the content
    # Step by step (torch's way) gives the same numbers as all steps at once (the Predictor's).
    stream = ExampleNoise(padded, seed=0, samples=2, hidden=4)
    steps = np.stack([stream.step() for _ in range(3)], axis=2)  # [B, S, K, T, d]
    assert np.array_equal(steps, batched)


@pytest.fixture(scope="module")
def text_student(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from uqcompress.steps import director, init

    root = tmp_path_factory.mktemp("director-text")
    from tests.conftest import sentiment_rows

    train = write_csv(root / "train.csv", list(sentiment_rows(32, seed=1)))
    base = init.run(init.InitConfig(family="bert", labels=["neg", "pos"]), root / "init")
    return director.run(
        base.artifact.path,
        director.DirectorConfig(data=str(train), samples=3, epochs=1, lr=3e-3, batch_size=16),
        root / "student",
    ).artifact.path


def _predict(cli: Callable[..., Any], model: Path, data: Path, batch: int) -> np.ndarray:
    out = ok(cli("predict", str(model), "--data", str(data), "--batch-size", str(batch)))
    records = [json.loads(line) for line in out.splitlines()]
    return np.array([[r["probs"]["neg"], r["probs"]["pos"], r["mutual_info"]] for r in records])


def test_predict_and_the_onnx_predictor_are_batch_independent(
    cli: Callable[..., Any], text_student: Path, tmp_path: Path
) -> None:
    from uqcompress.export.runtime import Predictor

    texts = _texts()
    data = write_csv(tmp_path / "texts.csv", [(t, "pos") for t in texts])
    exported = Path(ok(cli("export", str(text_student), "--out", str(tmp_path / "onnx"))))
    for model in (text_student, exported):  # torch, then ONNX Runtime
        runs = {b: _predict(cli, model, data, b) for b in (8, 2, 1)}
        assert np.abs(runs[8] - runs[2]).max() <= TOL, model
        assert np.abs(runs[8] - runs[1]).max() <= TOL, model
        assert runs[8][:, 2].max() > 1e-5  # the samples disagree: the noise is in play
    predictor = Predictor(exported)
    whole = predictor.predict_texts(texts, batch_size=8)
    pairs = predictor.predict_texts(texts, batch_size=2)
    single = [predictor.predict_texts([t], batch_size=1) for t in texts]
    assert np.abs(whole.probs - pairs.probs).max() <= TOL
    assert np.abs(whole.probs - np.concatenate([s.probs for s in single])).max() <= TOL
    # torch and ONNX Runtime draw the same noise: they agree to float32 round-off, far below
    # what a different draw would move (the samples' spread).
    torch_probs = _predict(cli, text_student, data, 8)[:, :2]
    assert np.abs(torch_probs - whole.probs).max() <= 1e-4


def test_the_noise_scheme_and_uncertainty_definition_are_in_the_eval_and_calibrate_ids(
    tiny_vit_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They change an eval's numbers without changing its config: a new scheme, a new id."""
    from uqcompress.steps import calibrate
    from uqcompress.steps import eval as eval_step

    def ids(tag: str) -> tuple[str, str]:
        evaluated = eval_step.run(
            [tiny_vit_artifact], eval_step.EvalConfig(data="builtin:digits@val"), tmp_path / tag
        )
        calibrated = calibrate.run(
            tiny_vit_artifact,
            calibrate.CalibrateConfig(data="builtin:digits@val"),
            tmp_path / f"c{tag}",
        )
        return evaluated.artifact.manifest.id, calibrated.artifact.manifest.id

    before = ids("a")
    monkeypatch.setattr("uqcompress.uq.noise.NOISE_SCHEME", "example-pcg64-v2")
    after_noise = ids("b")
    monkeypatch.setattr("uqcompress.uq.UNCERTAINTY_DEFINITION", "another-v2")
    after_both = ids("c")
    assert before[0] != after_noise[0] != after_both[0]
    assert before[1] != after_noise[1] != after_both[1]
