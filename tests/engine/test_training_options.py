"""What real runs need from the training loop (issue 21): the best epoch on --val, early
stopping, the per-epoch history, gradient accumulation, schedules, --max-steps, and resume."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from uqcompress.artifacts import open_artifact
from uqcompress.engine.train import schedule_factor
from uqcompress.steps import finetune
from uqcompress.steps.common import checkpoint_folder


def _weights(path: Path) -> dict[str, Any]:
    return load_file(str(path / "model.safetensors"))


def _assert_same_weights(a: Path, b: Path, atol: float = 0.0) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        if atol == 0.0:
            assert wa[name].equal(wb[name]), name
        else:
            assert (wa[name] - wb[name]).abs().max().item() <= atol, name


@pytest.fixture(scope="module")
def no_dropout_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT without dropout: micro-batches and one large batch see the same function."""
    from uqcompress.steps import init

    root = tmp_path_factory.mktemp("nodrop")
    return init.run(
        init.InitConfig(
            family="bert",
            labels=["neg", "pos"],
            overrides={"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
        ),
        root / "bert",
    ).artifact.path


def _overfitting(sentiment_csv: dict[str, Path], **kw: Any) -> finetune.FinetuneConfig:
    """A run whose validation NLL peaks early: a high constant learning rate on 96 examples."""
    base: dict[str, Any] = {
        "data": str(sentiment_csv["train"]),
        "val": str(sentiment_csv["test"]),
        "epochs": 6,
        "lr": 0.05,
        "batch_size": 16,
        "schedule": "constant",
        "warmup": 0.0,
    }
    return finetune.FinetuneConfig(**{**base, **kw})


def test_the_best_epoch_is_kept_and_named(
    tmp_path: Path, tiny_bert_artifact: Path, sentiment_csv: dict[str, Path]
) -> None:
    best = finetune.run(tiny_bert_artifact, _overfitting(sentiment_csv), tmp_path / "best")
    manifest = best.artifact.manifest
    summary = manifest.summary
    assert manifest.config["select_best"] == "nll"  # the default with --val, recorded
    history = [
        json.loads(line) for line in (best.artifact.path / "history.jsonl").read_text().splitlines()
    ]
    assert [row["epoch"] for row in history] == [1, 2, 3, 4, 5, 6]
    assert {"train_loss", "lr", "val_acc", "val_nll", "val_ece", "val_loss"} <= set(history[0])
    nlls = [row["val_nll"] for row in history]
    epoch = summary["best_epoch"]
    assert epoch == 1 + nlls.index(min(nlls))
    assert epoch < 6, nlls  # built to peak early: the last epoch is not the best
    assert summary["select_best"] == "nll" and "lowest val nll" in summary["best_why"]
    assert summary["val_nll"] == round(nlls[epoch - 1], 6)  # the kept weights' numbers
    assert (best.artifact.path / "history.png").stat().st_size > 1000
    assert "history.jsonl" in manifest.files and "history.png" in manifest.files
    # the kept weights are those of the epoch: a run that stops there ends with them
    until = finetune.run(
        tiny_bert_artifact,
        _overfitting(sentiment_csv, epochs=epoch, select_best="none"),
        tmp_path / "until",
    )
    _assert_same_weights(best.artifact.path, until.artifact.path)
    last = finetune.run(
        tiny_bert_artifact, _overfitting(sentiment_csv, select_best="none"), tmp_path / "last"
    )
    assert "best_epoch" not in last.artifact.manifest.summary
    assert any(
        not w.equal(_weights(best.artifact.path)[k])
        for k, w in _weights(last.artifact.path).items()
    )


def test_patience_stops_a_run_that_stopped_improving(
    tmp_path: Path, tiny_bert_artifact: Path, sentiment_csv: dict[str, Path]
) -> None:
    full = finetune.run(tiny_bert_artifact, _overfitting(sentiment_csv), tmp_path / "full")
    best_epoch = full.artifact.manifest.summary["best_epoch"]
    stopped = finetune.run(
        tiny_bert_artifact, _overfitting(sentiment_csv, patience=1), tmp_path / "stopped"
    ).artifact
    summary = stopped.manifest.summary
    # the first epoch after the best that is not better ends the run, best weights kept
    assert summary["epochs_run"] <= best_epoch + 1 and summary["stopped_early"] is True
    assert summary["best_epoch"] == best_epoch
    _assert_same_weights(full.artifact.path, stopped.path)


def test_gradient_accumulation_equals_the_large_batch(
    tmp_path: Path, no_dropout_bert: Path, sentiment_csv: dict[str, Path]
) -> None:
    """96 examples: 3 optimizer steps of 32, or of 4 micro-batches of 8, in the same order."""
    common = {"data": str(sentiment_csv["train"]), "epochs": 2, "lr": 1e-2}
    large = finetune.run(
        no_dropout_bert, finetune.FinetuneConfig(**common, batch_size=32), tmp_path / "large"
    ).artifact
    accumulated = finetune.run(
        no_dropout_bert,
        finetune.FinetuneConfig(**common, batch_size=8, grad_accum=4),
        tmp_path / "accumulated",
    ).artifact
    assert large.manifest.summary["steps"] == accumulated.manifest.summary["steps"] == 6
    _assert_same_weights(large.path, accumulated.path, atol=1e-5)
    plain = finetune.run(
        no_dropout_bert, finetune.FinetuneConfig(**common, batch_size=8), tmp_path / "plain"
    ).artifact
    assert plain.manifest.summary["steps"] == 24
    # accumulation matters: plain batches of 8 end somewhere else
    assert any(
        (w - _weights(large.path)[k]).abs().max().item() > 1e-3
        for k, w in _weights(plain.path).items()
    )


def test_max_steps_overrides_epochs(
    tmp_path: Path, tiny_bert_artifact: Path, sentiment_csv: dict[str, Path]
) -> None:
    cfg = finetune.FinetuneConfig(
        data=str(sentiment_csv["train"]), epochs=1, batch_size=16, max_steps=9
    )
    summary = finetune.run(tiny_bert_artifact, cfg, tmp_path / "m").artifact.manifest.summary
    assert summary["steps"] == 9 and summary["epochs_run"] == 2  # 6 steps, then 3 more
    assert len(summary["loss_curve"]) == 2


def test_schedules() -> None:
    total, warmup = 100, 10
    linear = schedule_factor("linear", total, warmup)
    cosine = schedule_factor("cosine", total, warmup)
    constant = schedule_factor("constant", total, warmup)
    for factor in (linear, cosine, constant):
        assert factor(0) == pytest.approx(0.1) and factor(9) == pytest.approx(1.0)
    assert linear(10) == 1.0 and linear(55) == pytest.approx(0.5) and linear(100) == 0.0
    assert cosine(10) == 1.0 and cosine(55) == pytest.approx(0.5) and cosine(99) < 1e-3
    assert cosine(40) > linear(40)  # cosine stays high longer
    assert all(constant(s) == 1.0 for s in range(10, 100))


# --- resume -------------------------------------------------------------------------------


class _Stop:
    """Stands in for interrupts.check: raises KeyboardInterrupt at the `at`-th step, as a
    Ctrl-C arriving there does."""

    def __init__(self, at: int) -> None:
        self.calls, self.at = 0, at

    def __call__(self) -> None:
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt


def _interrupt_and_resume(
    monkeypatch: pytest.MonkeyPatch, run: Any, cfg: Any, out: Path, at: int
) -> Any:
    from uqcompress.runtime import interrupts

    with monkeypatch.context() as patch:
        patch.setattr(interrupts, "check", _Stop(at))
        with pytest.raises(KeyboardInterrupt):
            run(cfg, out)
    assert not out.exists()  # no partial artifact
    cache = checkpoint_folder(out)
    assert (cache / "checkpoint.pt").is_file() or any(cache.rglob("checkpoint.pt"))
    resumed = run(replace(cfg, resume=True), out).artifact
    assert not cache.exists()  # removed once the run completed
    assert not any(p.name == "checkpoint.pt" for p in resumed.path.rglob("*"))
    return resumed


def test_finetune_resumes_to_the_uninterrupted_weights(
    tmp_path: Path,
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = finetune.FinetuneConfig(
        data=str(sentiment_csv["train"]),
        val=str(sentiment_csv["test"]),
        epochs=3,
        batch_size=16,
        lr=3e-3,
        checkpoint_every=4,
    )

    def run(c: Any, out: Path) -> Any:
        return finetune.run(tiny_bert_artifact, c, out)

    reference = run(cfg, tmp_path / "ref").artifact
    # 6 steps per epoch: stop in the middle of epoch 2, after the checkpoint of step 8
    resumed = _interrupt_and_resume(monkeypatch, run, cfg, tmp_path / "res", at=10)
    assert resumed.id == reference.id
    _assert_same_weights(reference.path, resumed.path, atol=1e-6)
    ref, res = reference.manifest.summary, resumed.manifest.summary
    assert res["resumed_from_step"] == 8
    assert res["loss_curve"] == pytest.approx(ref["loss_curve"], abs=1e-6)
    assert res["best_epoch"] == ref["best_epoch"]
    assert (resumed.path / "history.jsonl").read_text().count("\n") == 3


def test_svd_ensemble_resumes_to_the_uninterrupted_weights(
    tmp_path: Path,
    trained_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from uqcompress.steps import sve

    cfg = sve.SVEConfig(
        data=str(sentiment_csv["train"]),
        members=2,
        epochs=2,
        batch_size=16,
        checkpoint_every=3,
        grad_accum=2,
    )

    def run(c: Any, out: Path) -> Any:
        return sve.run(trained_bert_artifact, c, out)

    reference = run(cfg, tmp_path / "ref").artifact
    resumed = _interrupt_and_resume(monkeypatch, run, cfg, tmp_path / "res", at=9)
    _assert_same_weights(reference.path, resumed.path, atol=1e-6)


def test_distill_director_resumes_to_the_uninterrupted_weights(
    tmp_path: Path,
    trained_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from uqcompress.steps import director

    cfg = director.DirectorConfig(
        data=str(sentiment_csv["train"]),
        val=str(sentiment_csv["test"]),
        epochs=2,
        batch_size=16,
        samples=2,
        checkpoint_every=2,
    )

    def run(c: Any, out: Path) -> Any:
        return director.run(trained_bert_artifact, c, out)

    reference = run(cfg, tmp_path / "ref").artifact
    resumed = _interrupt_and_resume(monkeypatch, run, cfg, tmp_path / "res", at=8)
    _assert_same_weights(reference.path, resumed.path, atol=1e-6)
    ref, res = reference.manifest.summary, resumed.manifest.summary
    assert res["distill_loss_curve"] == pytest.approx(ref["distill_loss_curve"], abs=1e-6)
    assert res["best_epoch"] == ref["best_epoch"]
    assert math.isfinite(res["val_loss"])


def test_resume_refuses_a_checkpoint_of_another_run(
    tmp_path: Path,
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from uqcompress.errors import ConfigError
    from uqcompress.runtime import interrupts

    cfg = finetune.FinetuneConfig(
        data=str(sentiment_csv["train"]), epochs=2, batch_size=16, checkpoint_every=2
    )
    out = tmp_path / "x"
    with monkeypatch.context() as patch:
        patch.setattr(interrupts, "check", _Stop(4))
        with pytest.raises(KeyboardInterrupt):
            finetune.run(tiny_bert_artifact, cfg, out)
    with pytest.raises(ConfigError, match="belongs to another run"):
        finetune.run(tiny_bert_artifact, replace(cfg, lr=1e-3, resume=True), out)
    assert not out.exists()


def test_sigint_then_resume_from_the_command_line(
    tmp_path: Path, tiny_vit_artifact: Path, cli: Any
) -> None:
    """A real Ctrl-C (SIGINT to `python -m uqcompress finetune`), then the same command with
    --resume: the weights of an uninterrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "ft"
    args = [
        "finetune",
        str(tiny_vit_artifact),
        "--data",
        "builtin:digits@val",
        "--epochs",
        "30",
        "--batch-size",
        "16",
        "--device",
        "cpu",
        "--checkpoint-every",
        "2",
        "--out",
        str(out),
    ]
    env = {**os.environ, "UQC_ARTIFACTS": str(tmp_path / "art")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uqcompress", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    checkpoint = checkpoint_folder(out) / "checkpoint.pt"
    deadline = time.time() + 120
    while time.time() < deadline and not checkpoint.is_file() and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode in (130, -signal.SIGINT), stderr
    assert stdout == "" and not out.exists()
    assert checkpoint.is_file() and "--resume" in stderr
    resumed = cli(*args, "--resume")
    assert resumed.code == 0, resumed.err
    assert Path(resumed.out.strip()) == out and not checkpoint_folder(out).exists()
    summary = open_artifact(out).manifest.summary
    assert 0 < summary["resumed_from_step"] < summary["steps"]
    reference = cli(*args[:-4], "--out", str(tmp_path / "ref"))  # no checkpoints at all
    assert reference.code == 0, reference.err
    _assert_same_weights(tmp_path / "ref", out, atol=1e-6)
