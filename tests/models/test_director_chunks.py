"""DIRECTOR samples run in chunks (issue 21): memory grows with the samples of one pass, not
with all S; the result is that of one pass, in torch and in the ONNX Predictor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from uqcompress.methods.director import build_student
from uqcompress.models.factory import create_model
from uqcompress.uq.noise import AUTO_CHUNK_ROWS, AUTO_CHUNK_TOKENS, examples_per_pass

TOL = 1e-6


@pytest.fixture(scope="module")
def student() -> Any:
    """A tiny BERT student with 5 samples and a large std: the draws move the logits."""
    teacher = create_model("bert", ["a", "b", "c"], preset="tiny")
    teacher.model.eval()
    built = build_student(teacher, None, 1, 5, seed=0)
    with torch.no_grad():
        built.transition.std_head[1].bias.fill_(1.0)
    built.eval()
    return built


def _batch(rows: int, width: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 700, (rows, width), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, width // 2 :] = 0  # one padded example
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def _logits(model: Any, chunk: int | None, **inputs: Any) -> torch.Tensor:
    model.sample_chunk = chunk
    try:
        with torch.no_grad():
            logits: torch.Tensor = model(**inputs).member_logits  # [B, S, C]
    finally:
        model.sample_chunk = None
    return logits


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_chunked_sampling_equals_one_pass(student: Any, chunk: int) -> None:
    batch = _batch(4, 12)
    whole = _logits(student, 5, **batch)  # all 5 samples in one pass
    chunked = _logits(student, chunk, **batch)
    assert chunked.shape == whole.shape == (4, 5, 3)
    assert float((chunked - whole).abs().max()) <= TOL
    probs = torch.softmax(whole, -1).mean(1)
    assert float((torch.softmax(chunked, -1).mean(1) - probs).abs().max()) <= TOL
    assert float((whole[:, 0] - whole[:, 1]).abs().max()) > 1e-3  # the noise is in play
    # the same explicit noise, chunked and not
    noise = torch.randn(student.noise_shape(4, 12), generator=torch.Generator().manual_seed(5))
    explicit = _logits(student, 5, noise=noise, **batch)
    assert float((_logits(student, chunk, noise=noise, **batch) - explicit).abs().max()) <= TOL


def test_the_automatic_chunk_is_sized_to_the_tokens(student: Any) -> None:
    assert student.chunk_samples(batch=1, tokens=12) == 5  # small: all samples at once
    assert student.chunk_samples(batch=64, tokens=128) == AUTO_CHUNK_TOKENS // (64 * 128)
    assert student.chunk_samples(batch=512, tokens=512) == 1  # at least one
    # short sequences (an image student's 17 tokens): capped by sequences, not tokens
    assert student.chunk_samples(batch=64, tokens=17) == AUTO_CHUNK_ROWS // 64 == 4
    student.sample_chunk = 2
    assert student.chunk_samples(batch=512, tokens=512) == 2
    student.sample_chunk = None
    assert examples_per_pass(64, 10, 128) == AUTO_CHUNK_TOKENS // 128 // 10
    assert examples_per_pass(64, 10, 128, sample_chunk=2) == 12  # about 2 x 64 sequences
    assert examples_per_pass(1, 10, 4096) == 1
    assert examples_per_pass(64, 10, 17) == AUTO_CHUNK_ROWS // 10 == 25


def test_the_predictor_feeds_chunks_with_the_same_result(
    tmp_path: Path, trained_bert_artifact: Path, sentiment_csv: dict[str, Path]
) -> None:
    from uqcompress.export.runtime import Predictor
    from uqcompress.steps import director, export

    student_dir = director.run(
        trained_bert_artifact,
        director.DirectorConfig(data=str(sentiment_csv["train"]), samples=4, epochs=1),
        tmp_path / "student",
    ).artifact.path
    exported = export.run(student_dir, export.ExportConfig(), tmp_path / "onnx").artifact.path
    texts = [f"good movie {'plot ' * i}" for i in range(9)]
    whole = Predictor(exported, sample_chunk=4 * 9).predict_texts(texts, batch_size=9)
    for chunk in (1, 2):  # 2 and 4 examples per pass
        chunked = Predictor(exported, sample_chunk=chunk).predict_texts(texts, batch_size=9)
        assert np.abs(chunked.probs - whole.probs).max() <= TOL
        assert np.abs(chunked.member_logits - whole.member_logits).max() <= TOL
        assert np.abs(chunked.mutual_info - whole.mutual_info).max() <= TOL
