"""DIRECTOR's frozen parts run without dropout while the transition trains, and
`--lambda-std` is refused unless `--loss mse` (issue 14, item 22)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from uqcompress.errors import ConfigError
from uqcompress.methods.director import build_student
from uqcompress.models.factory import create_model
from uqcompress.steps.director import DirectorConfig


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(5, 700, (3, 10), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@pytest.mark.parametrize("train_head", [True, False])
def test_frozen_parts_stay_in_eval_mode_after_train(train_head: bool) -> None:
    teacher = create_model("bert", ["a", "b"], preset="tiny")  # dropout 0.1 everywhere
    assert float(teacher.config.hidden_dropout_prob) > 0
    student = build_student(teacher, 1, 1, 2, seed=0, train_head=train_head)  # 1 kept layer
    assert len(student.prefix) == 1
    wrapper = torch.nn.ModuleDict({"student": student})  # train() reaches it through a parent
    wrapper.train()
    assert student.training and student.transition.training
    for part in (student.embeddings, student.prefix):
        assert not any(m.training for m in part.modules())
    head_training = student.pooler.training and student.head_dropout.training
    assert head_training == train_head  # a frozen head runs in eval mode too
    # What the training loss sees: x_0 is the teacher's, deterministic, not dropped out.
    first, _ = student.start_state(_batch())
    again, _ = student.start_state(_batch())
    assert torch.equal(first, again)
    teacher.model.eval()
    with torch.no_grad():
        embedded = teacher.model.bert.embeddings(input_ids=_batch()["input_ids"])
        reference = teacher.model.bert.encoder.layer[0](embedded, attention_mask=None)
    reference = reference[0] if isinstance(reference, tuple) else reference
    assert torch.allclose(first, reference, atol=1e-6)
    wrapper.eval()
    assert not student.training and not student.transition.training


def test_lambda_std_is_refused_unless_the_loss_is_mse() -> None:
    with pytest.raises(ConfigError, match="--lambda-std applies only to --loss mse") as refused:
        DirectorConfig(data="x", loss="kl", lambda_std=0.5).validate()
    assert "drop --lambda-std, or pass --loss mse" in str(refused.value.hint)
    with pytest.raises(ConfigError, match="this run uses --loss nll"):
        DirectorConfig(data="x", loss="nll", lambda_std=0.1).validate()
    DirectorConfig(data="x", loss="mse", lambda_std=0.5).validate()
    DirectorConfig(data="x", loss="mse").validate()  # the default weight, resolved by run()
    DirectorConfig(data="x").validate()  # kl without --lambda-std: nothing to refuse


def test_cli_refuses_lambda_std_with_another_loss_in_one_line(
    cli: Callable[..., Any],
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
    tmp_path: Path,
) -> None:
    out = tmp_path / "student"
    result = cli(
        "distill-director",
        str(tiny_bert_artifact),
        "--data",
        str(sentiment_csv["train"]),
        "--lambda-std",
        "0.5",
        "--out",
        str(out),
    )
    assert result.code == 1 and result.out == ""
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "(fix: " in lines[0]
    assert "--lambda-std applies only to --loss mse" in lines[0]
    assert not out.exists()


def test_mse_records_its_resolved_std_weight(
    tiny_bert_artifact: Path, sentiment_csv: dict[str, Path], tmp_path: Path
) -> None:
    from uqcompress.steps import director

    cfg = DirectorConfig(data=str(sentiment_csv["train"]), loss="mse", samples=2, epochs=1)
    done = director.run(tiny_bert_artifact, cfg, tmp_path / "mse")
    assert done.artifact.manifest.config["lambda_std"] == 0.1
    kl = director.run(
        tiny_bert_artifact,
        DirectorConfig(data=str(sentiment_csv["train"]), samples=2, epochs=1),
        tmp_path / "kl",
    )
    assert kl.artifact.manifest.config["lambda_std"] is None  # unused: not a setting of the run
