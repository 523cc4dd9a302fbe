"""--optimizer and --ema in the shared training loop (issue 20, item 5): which update each
optimizer makes of weight decay, and that the weight average follows its definition, is what
validation and --select-best see, is what is saved, and survives a resume."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.engine.test_training_options import _Stop
from uqcompress.engine.train import Checkpointing, TrainConfig, make_optimizer, train
from uqcompress.errors import ConfigError
from uqcompress.steps import finetune


class _Recorder(nn.Module):
    """A linear regression whose loss records the weights each step starts from."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(3, 2)
        self.seen: list[torch.Tensor] = []

    def snapshot(self) -> torch.Tensor:
        return torch.cat([p.detach().flatten().clone() for p in self.layer.parameters()])


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(16, 3, generator=generator)
    y = torch.randn(16, 2, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True, generator=generator)


def _loss(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    recorder: Any = model
    recorder.seen.append(recorder.snapshot())
    return ((recorder.layer(x) - y) ** 2).mean()


def test_the_average_follows_its_start_and_interval_and_is_what_validation_sees() -> None:
    """4 steps, --ema-start 1, --ema-every 2: the average copies w1, folds in w3, skips
    steps 2 and 4. Validation and the saved model see avg = d w1 + (1 - d) w3."""
    model = _Recorder()
    seen_by_validation: list[torch.Tensor] = []

    def validate(m: nn.Module) -> dict[str, float]:
        seen_by_validation.append(model.snapshot())
        return {"nll": 0.0}

    decay = 0.75
    cfg = TrainConfig(
        epochs=1, lr=0.1, batch_size=4, ema=decay, ema_every=2, ema_start=1, warmup_ratio=0.0
    )
    result = train(model, _loader(), cfg, loss_fn=_loss, validate=validate)
    assert result.steps == 4 and len(model.seen) == 4  # w0, w1, w2, w3 (w4 is never averaged)
    w1, w3 = model.seen[1], model.seen[3]
    expected = decay * w1 + (1 - decay) * w3
    torch.testing.assert_close(seen_by_validation[0], expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(model.snapshot(), expected, rtol=0, atol=1e-7)


def test_select_best_keeps_the_average_of_the_best_epoch() -> None:
    model = _Recorder()
    averages: list[torch.Tensor] = []
    scores = iter([0.5, 0.1, 0.9])  # epoch 2 is best

    def validate(m: nn.Module) -> dict[str, float]:
        averages.append(model.snapshot())
        return {"nll": next(scores)}

    cfg = TrainConfig(epochs=3, lr=0.1, batch_size=4, ema=0.5, select_best="nll", has_val=True)
    result = train(model, _loader(), cfg, loss_fn=_loss, validate=validate)
    assert result.best_epoch == 2
    assert torch.equal(model.snapshot(), averages[1])
    assert not torch.equal(averages[1], model.seen[-1])  # not the raw weights of any step


def test_ema_start_beyond_the_run_is_the_plain_run() -> None:
    plain, averaged = _Recorder(), _Recorder()
    cfg = TrainConfig(epochs=2, lr=0.1, batch_size=4)
    train(plain, _loader(), cfg, loss_fn=_loss)
    train(averaged, _loader(), replace(cfg, ema=0.9, ema_start=100), loss_fn=_loss)
    assert torch.equal(plain.snapshot(), averaged.snapshot())


def test_adam_decays_through_the_gradient_adamw_beside_it() -> None:
    """With a zero loss gradient, AdamW shrinks a weight by lr * wd * w (decoupled); Adam
    sees wd * w as the gradient and, normalised, moves it by about lr whatever wd is; SGD
    moves it by lr * wd * w (L2 gradient, no normalisation). Biases are never decayed."""
    lr, wd = 0.01, 0.1
    moved = {}
    for name in ("adamw", "adam", "sgd"):
        layer = nn.Linear(2, 2)
        with torch.no_grad():
            layer.weight.fill_(2.0)
            layer.bias.fill_(2.0)
        optimizer = make_optimizer(layer, TrainConfig(lr=lr, weight_decay=wd, optimizer=name))
        layer.weight.grad = torch.zeros_like(layer.weight)
        layer.bias.grad = torch.zeros_like(layer.bias)
        optimizer.step()
        moved[name] = 2.0 - float(layer.weight.detach()[0, 0])
        assert torch.equal(layer.bias, torch.full((2,), 2.0)), name
    assert type(make_optimizer(nn.Linear(1, 1), TrainConfig(optimizer="adam"))) is torch.optim.Adam
    assert moved["adamw"] == pytest.approx(lr * wd * 2.0, rel=1e-4)
    assert moved["adam"] == pytest.approx(lr, rel=1e-4)
    assert moved["sgd"] == pytest.approx(lr * wd * 2.0, rel=1e-4)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"optimizer": "lion"}, "unknown --optimizer 'lion'"),
        ({"ema": 1.0}, "--ema 1.0 must be a decay in (0, 1)"),
        ({"ema": 0.9, "ema_every": 0}, "--ema-every 0 must be at least 1"),
        ({"ema": 0.9, "ema_start": -1}, "--ema-start -1 must be 0 or more"),
        ({"ema_every": 5}, "this run has no --ema"),
    ],
)
def test_bad_optimizer_and_ema_values(change: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        replace(TrainConfig(), **change).validate()
    assert words in str(caught.value)


def test_a_resumed_ema_run_equals_the_uninterrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The average is part of the checkpoint: an --ema run (Adam, L2 decay, best epoch on
    validation) interrupted after its step-6 checkpoint resumes to the uninterrupted weights."""
    from uqcompress.runtime import interrupts

    cfg = TrainConfig(
        epochs=3,
        lr=0.05,
        batch_size=4,
        optimizer="adam",
        weight_decay=5e-5,
        ema=0.8,
        ema_every=2,
        ema_start=3,
        select_best="nll",
        has_val=True,
        checkpoint_every=3,
    )

    def run(resume: bool, stop_at: int | None = None) -> tuple[_Recorder, Any]:
        model = _Recorder()

        def validate(m: nn.Module) -> dict[str, float]:
            x, y = next(iter(DataLoader(_loader().dataset, batch_size=16)))
            with torch.no_grad():
                return {"nll": float(((model.layer(x) - y) ** 2).mean())}

        checkpoint = Checkpointing(tmp_path / "ck", "run")
        with monkeypatch.context() as patch:
            if stop_at is not None:
                patch.setattr(interrupts, "check", _Stop(stop_at))
            result = train(
                model,
                _loader(),
                replace(cfg, resume=resume),
                loss_fn=_loss,
                validate=validate,
                checkpoint=checkpoint,
            )
        return model, result

    reference, ref_result = run(resume=False)
    with pytest.raises(KeyboardInterrupt):
        run(resume=False, stop_at=8)  # 4 steps per epoch: in epoch 2, after step 6's save
    assert (tmp_path / "ck" / "checkpoint.pt").is_file()
    resumed, result = run(resume=True)
    assert result.resumed_from_step == 6 and result.best_epoch == ref_result.best_epoch
    torch.testing.assert_close(resumed.snapshot(), reference.snapshot(), rtol=0, atol=1e-6)
    assert result.loss_curve == pytest.approx(ref_result.loss_curve, abs=1e-6)


def test_the_training_options_are_in_the_artifact_id() -> None:
    from uqcompress.steps import config as fields

    plain = finetune.FinetuneConfig(data="builtin:digits")
    assert not {"optimizer", "ema", "ema_every", "ema_start"} & set(fields.id_config(plain))
    research = replace(plain, optimizer="adam", ema=0.995, ema_every=5, ema_start=50)
    assert fields.id_config(research) == {
        **fields.id_config(plain),
        "optimizer": "adam",
        "ema": 0.995,
        "ema_every": 5,
        "ema_start": 50,
    }
