"""A real resumable checkpoint of a tiny finetune run, and corrupted copies of it (issue 26
item 20): each corruption is refused by `--resume` in one line."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The options of the interrupted run; `--resume` must repeat them (they are in its id).
RUN_OPTIONS = ["--epochs", "3", "--batch-size", "16", "--lr", "3e-3", "--checkpoint-every", "4"]
_BUILT: dict[tuple[str, str], Path] = {}


def interrupted_run(base: Path, train: Path, root: Path) -> Path:
    """The checkpoint folder of `uqc finetune BASE --data TRAIN RUN_OPTIONS` stopped in epoch 2
    (6 steps per epoch; the checkpoint is of step 8), built once per session and inputs."""
    key = (str(base), str(train))
    if key in _BUILT and _BUILT[key].is_dir():
        return _BUILT[key]
    from uqcompress.runtime import interrupts
    from uqcompress.steps import finetune
    from uqcompress.steps.common import checkpoint_folder

    cfg = finetune.FinetuneConfig(
        data=str(train), epochs=3, batch_size=16, lr=3e-3, checkpoint_every=4
    )
    calls = {"n": 0}
    real = interrupts.check

    def stop() -> None:  # Ctrl-C at the 10th batch, after step 8's checkpoint
        calls["n"] += 1
        if calls["n"] == 10:
            raise KeyboardInterrupt

    out = root / "interrupted"
    interrupts.check = stop  # type: ignore[assignment]
    try:
        finetune.run(base, cfg, out)
    except KeyboardInterrupt:
        pass
    finally:
        interrupts.check = real  # type: ignore[assignment]
    folder = checkpoint_folder(out)
    assert (folder / "checkpoint.pt").is_file()
    _BUILT[key] = folder
    return folder


def corrupted(
    base: Path, train: Path, work: Path, edit: Callable[[dict[str, Any]], Any]
) -> list[str]:
    """`uqc finetune ... --resume --out WORK/res` with a copy of the run's checkpoint that
    `edit` changed in place (or replaced: a `Replace` it returns is saved instead, bytes as
    they are)."""
    import torch

    from uqcompress.steps.common import checkpoint_folder

    source = interrupted_run(base, train, work.parent / f"{work.name}-source")
    out = work / "res"
    folder = checkpoint_folder(out)
    shutil.copytree(source, folder)
    state = torch.load(folder / "checkpoint.pt", weights_only=True)
    replaced = edit(state)
    target = folder / "checkpoint.pt"
    if isinstance(replaced, Replace) and isinstance(replaced.value, bytes):
        target.write_bytes(replaced.value)  # not a torch file at all
    else:
        torch.save(replaced.value if isinstance(replaced, Replace) else state, target)
    return [
        "finetune",
        str(base),
        "--data",
        str(train),
        *RUN_OPTIONS,
        "--resume",
        "--out",
        str(out),
    ]


class Replace:
    """What an edit returns to save another object in the checkpoint's place."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _first_weight(state: dict[str, Any]) -> str:
    return next(iter(state["model"]))


def _reshape_first(state: dict[str, Any]) -> None:
    import torch

    name = _first_weight(state)
    state["model"][name] = torch.zeros(3, 5)


def _nan_weight(state: dict[str, Any]) -> None:
    name = _first_weight(state)
    state["model"][name].view(-1)[0] = float("nan")


def _reshape_exp_avg(state: dict[str, Any]) -> None:
    import torch

    entry = state["optimizer"]["state"][0]
    entry["exp_avg"] = torch.zeros(7)


class _Foreign:
    """Not in torch's weights-only allow list."""


# name -> (edit, the phrase its one line holds)
CORRUPTIONS: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "model weight of another shape": (_reshape_first, "of shape [3, 5], this run"),
    "model weight missing": (
        lambda s: s["model"].pop(_first_weight(s)),
        "lacks model weights",
    ),
    "unknown model weight": (
        lambda s: s["model"].update({"extra.weight": s["model"][_first_weight(s)]}),
        "has unknown model weights 'extra.weight'",
    ),
    "non-finite model weight": (_nan_weight, "has non-finite model weights in"),
    "no optimizer state at all": (lambda s: s.pop("optimizer"), "has no optimizer"),
    "optimizer state emptied": (
        lambda s: s["optimizer"].update(state={}),
        "has no optimizer state for its 8 steps",
    ),
    "optimizer moment of another shape": (_reshape_exp_avg, "has optimizer exp_avg of shape [7]"),
    "optimizer moment missing": (
        lambda s: s["optimizer"]["state"][0].pop("exp_avg_sq"),
        "this optimizer keeps ['exp_avg', 'exp_avg_sq', 'step']",
    ),
    "optimizer weight decay changed": (
        lambda s: s["optimizer"]["param_groups"][0].update(weight_decay=0.5),
        "has optimizer weight_decay 0.5 in group 0",
    ),
    "optimizer learning rate changed": (
        lambda s: [g.update(lr=1.0) for g in s["optimizer"]["param_groups"]],
        "has optimizer learning rates [1.0, 1.0]",
    ),
    "epoch far beyond the run": (
        lambda s: s["loop"].update(epoch=10**6),
        "has loop.epoch 1000000, outside [0, 2] for this run",
    ),
    "position beyond the epoch": (
        lambda s: s["loop"].update(position=99),
        "has loop.position 99, outside [0, 6]",
    ),
    "step count that the position does not give": (
        lambda s: s["result"].update(steps=9),
        "has result.steps 9, but epoch 2 after 2 batches is step 8",
    ),
    "scheduler last_epoch -5": (
        lambda s: s["scheduler"].update(last_epoch=-5),
        "has scheduler last_epoch -5, but it is at step 8",
    ),
    "scheduler learning rates changed": (
        lambda s: s["scheduler"].update(_last_lr=[0.5, 0.5]),
        "has learning rates [0.5, 0.5], this run's schedule gives",
    ),
    "torch RNG state of another type": (
        lambda s: s.update(rng_torch=s["rng_torch"].float()),
        "has an rng_torch that is not torch's CPU generator state",
    ),
    "Python RNG state cut short": (
        lambda s: s.update(rng_python=(3, tuple(s["rng_python"][1][:10]), None)),
        "has an rng_python that is not Python's random state",
    ),
    "numpy RNG state of another generator": (
        lambda s: s["rng_numpy"].__setitem__(0, "PCG64"),
        "has an rng_numpy that is not numpy's MT19937 state",
    ),
    "loss curve of another length": (
        lambda s: s["result"]["loss_curve"].append(0.5),
        "has a result.loss_curve that is not one entry per finished epoch (1)",
    ),
    "no RNG states": (lambda s: s.pop("rng_numpy"), "has no rng_numpy"),
    "another run's tag": (
        lambda s: s.update(tag="0" * 32),
        "belongs to another run",
    ),
    "not a checkpoint dict": (lambda s: Replace([1, 2, 3]), "belongs to another run"),
    "a pickle torch will not load": (
        lambda s: Replace({"tag": s["tag"], "x": _Foreign()}),
        "cannot be read (torch refused to unpickle it: Unsupported global: GLOBAL "
        "tests.resume_checkpoints._Foreign was not an allowed global by default)",
    ),
    "bytes that are not a torch file": (
        lambda s: Replace(b"\x80\x02garbage"),
        "cannot be read (torch refused to unpickle it: Unsupported operand 103)",
    ),
}
