"""FSDP training (engine/sharding.py): `--fsdp` under `torchrun --nproc_per_node 2` on CPU
(gloo) trains the same weights as one process, for finetune, svd-ensemble (its float32
singular values in a bfloat16 base included) and distill-director; only rank 0 writes; a
run interrupted after a checkpoint resumes to the weights of one never interrupted."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from tests.runtime.test_distributed_steps import _free_port, _launch
from uqcompress.artifacts import open_artifact


def _commands(model: Path, data: Path, root: Path, val: Path) -> list[list[str]]:
    common = ["--data", str(data), "--epochs", "2", "--batch-size", "8", "--device", "cpu"]
    return [
        ["finetune", str(model), *common, "--lr", "2e-3", "--out", str(root / "finetune")],
        ["svd-ensemble", str(model), *common, "--members", "2", "--out", str(root / "sve")],
        [
            "svd-ensemble",
            str(model),
            *common,
            "--members",
            "2",
            "--dtype",
            "bfloat16",
            "--out",
            str(root / "sve-bf16"),
        ],
        [
            "finetune",
            str(model),
            *common,
            "--lr",
            "2e-3",
            "--dtype",
            "bfloat16",
            "--out",
            str(root / "finetune-bf16"),
        ],
        [
            "finetune",
            str(model),
            *common,
            "--lr",
            "2e-3",
            "--ema",
            "0.9",
            "--val",  # validation on every process, the best epoch kept
            str(val),
            "--out",
            str(root / "finetune-ema"),
        ],
    ]


def _resumed(model: Path, data: Path, val: Path, out: Path) -> list[dict[str, Any]]:
    """finetune-ema's run under FSDP with checkpoints every 3 steps, interrupted on both
    processes at batch 17 (in epoch 2, after step 15's checkpoint, which holds the average
    and epoch 1's best weights), then resumed."""
    args = [
        "finetune", str(model), "--data", str(data), "--epochs", "2", "--batch-size", "8",
        "--device", "cpu", "--lr", "2e-3", "--ema", "0.9", "--val", str(val),
        "--checkpoint-every", "3", "--fsdp", "--out", str(out),
    ]  # fmt: skip
    return [{"args": args, "stop_at_batch": 17}, {"args": [*args, "--resume"]}]


def _director(model: Path, data: Path, out: Path) -> list[str]:
    return [
        "distill-director", str(model), "--data", str(data), "--epochs", "1",
        "--batch-size", "8", "--samples", "2", "--device", "cpu", "--out", str(out),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def sharded_runs(
    tmp_path_factory: pytest.TempPathFactory,
    sentiment_csv: dict[str, Path],
    tiny_llama_artifact: Path,
) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """A tiny Llama, and one `torchrun --nproc_per_node 2` launch of every command with
    --fsdp (one start-up for all)."""
    root = tmp_path_factory.mktemp("fsdp")
    model = tiny_llama_artifact
    data = sentiment_csv["train"]
    val = sentiment_csv["test"]
    commands = [[*args, "--fsdp"] for args in _commands(model, data, root / "two", val)]
    # DIRECTOR sharded, and data-parallel (its roll-out noise is drawn per global batch)
    commands += [
        [*_director(model, data, root / "two" / "director"), "--fsdp"],
        _director(model, data, root / "ddp" / "director"),
        *_resumed(model, data, val, root / "two" / "resumed"),
    ]
    return root, model, _launch(root, commands)


def test_fsdp_on_two_processes_trains_what_one_process_trains(
    cli: Callable[..., Any],
    tmp_path: Path,
    sentiment_csv: dict[str, Path],
    sharded_runs: tuple[Path, Path, subprocess.CompletedProcess[str]],
) -> None:
    root, model, run = sharded_runs
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in (0, 1):  # five trainings, two DIRECTORs, an interrupted run (130), its resume
        codes = "[0, 0, 0, 0, 0, 0, 0, 130, 0]"
        assert f"exit codes of rank {rank}: {codes}" in run.stderr, run.stderr[-3000:]
    two, one = root / "two", tmp_path / "one"
    names = ("finetune", "sve", "sve-bf16", "finetune-bf16", "finetune-ema", "director")
    assert run.stdout.strip().splitlines() == [
        *(str(two / n) for n in names),
        str(root / "ddp" / "director"),
        str(two / "resumed"),
    ]
    start = load_file(str(model / "model.safetensors"))
    for args, name, tolerance in zip(
        _commands(model, sentiment_csv["train"], one, sentiment_csv["test"])[:5],
        ("finetune", "sve", "sve-bf16", "finetune-bf16", "finetune-ema"),
        # bfloat16 rounds the two runs' sums differently (finetune-bf16: mixed precision,
        # float32 master weights saved in bfloat16, whose spacing near 1 is 8e-3; at most
        # one unit of it apart, checked below)
        (1e-5, 1e-5, 5e-3, 1e-2, 1e-5),
        strict=True,
    ):
        assert cli(*args).code == 0
        a = load_file(str(one / name / "model.safetensors"))
        b = load_file(str(two / name / "model.safetensors"))
        assert set(a) == set(b)
        assert all(a[k].dtype == b[k].dtype for k in a)
        gap = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
        assert gap < tolerance, (name, gap)
        summary = open_artifact(two / name).manifest.summary
        assert summary["fsdp_blocks"] == 2  # the tiny Llama's two decoder layers
        assert open_artifact(one / name).id == open_artifact(two / name).id
    tuned = load_file(str(one / "finetune" / "model.safetensors"))
    moved = max(float((tuned[k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-3  # the weights compared above really trained
    halves = load_file(str(two / "finetune-bf16" / "model.safetensors"))
    assert {str(v.dtype) for v in halves.values()} == {"torch.bfloat16"}
    # Mixed precision: the gradients' bfloat16 sums differ between one process and two, and
    # AdamW's normalised steps carry that into weights with small gradients (measured: max
    # 7.8e-3 apart, one bfloat16 unit near 1). On average the two runs are much closer to
    # each other than to where training started (measured: 4.8e-5 vs 3.3e-3).
    single = load_file(str(one / "finetune-bf16" / "model.safetensors"))
    count = sum(v.numel() for v in halves.values())
    gap = sum(float((halves[k].float() - single[k].float()).abs().sum()) for k in halves)
    moved = sum(float((single[k].float() - start[k].float()).abs().sum()) for k in start)
    assert gap / count < 0.05 * moved / count, (gap / count, moved / count)
    sigma = {k: v for k, v in load_file(str(two / "sve-bf16" / "model.safetensors")).items()}
    assert {str(v.dtype) for k, v in sigma.items() if k.endswith("singular_values")} == {
        "torch.float32"
    }
    # DIRECTOR: each process draws the whole global batch's roll-out noise and keeps its
    # rows, so two processes (sharded or data-parallel) train what one process trains
    assert cli(*_director(model, sentiment_csv["train"], one / "director")).code == 0
    single = load_file(str(one / "director" / "model.safetensors"))
    for other in (two / "director", root / "ddp" / "director"):
        trained = load_file(str(other / "model.safetensors"))
        assert set(trained) == set(single)
        assert max(float((trained[k] - single[k]).abs().max()) for k in single) < 1e-5, other
    # the student (a DiT block and heads) is one unit; the frozen teacher is not sharded
    assert open_artifact(two / "director").manifest.summary["fsdp_blocks"] == 0
    # the average is what was saved: not the last weights (the plain finetune's)
    averaged = load_file(str(two / "finetune-ema" / "model.safetensors"))
    assert max(float((averaged[k] - tuned[k]).abs().max()) for k in tuned) > 1e-4
    # interrupted after step 15's checkpoint (the shards gathered into one file), resumed
    # from it (laid out in shards again): the weights and the average of the run that was
    # never interrupted
    assert "resuming from step 15 (epoch 2" in run.stderr
    resumed = load_file(str(two / "resumed" / "model.safetensors"))
    assert set(resumed) == set(averaged)
    assert max(float((resumed[k] - averaged[k]).abs().max()) for k in averaged) < 1e-6
    kept = open_artifact(two / "finetune-ema").manifest.summary["best_epoch"]
    assert kept is not None  # --val: the best epoch's weights (of the average) were kept
    assert open_artifact(two / "resumed").manifest.summary["best_epoch"] == kept
    assert open_artifact(two / "resumed").manifest.summary["resumed_from_step"] == 15
    from uqcompress.steps.common import checkpoint_folder

    assert not checkpoint_folder(two / "resumed").exists()  # removed when the run completed


def test_fsdp_is_requested_by_the_flag_or_an_accelerate_fsdp_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from uqcompress.engine import sharding

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv(sharding.ACCELERATE_FSDP, raising=False)
    assert sharding.requested(True) and not sharding.requested(False)
    monkeypatch.setenv(sharding.ACCELERATE_FSDP, "true")
    assert sharding.requested(False)
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: nothing to shard across
    assert not sharding.requested(True)


def test_block_classes_are_what_transformers_keeps_whole() -> None:
    from uqcompress.engine.sharding import block_classes
    from uqcompress.models.factory import create_model

    llama = create_model("llama", ["a", "b"], "tiny")
    assert block_classes(llama.model) == {"LlamaDecoderLayer"}
    assert "BertLayer" in block_classes(create_model("bert", ["a", "b"]).model)


def test_accelerate_launch_with_an_fsdp_config_shards(
    cli: Callable[..., Any],
    tmp_path: Path,
    sentiment_csv: dict[str, Path],
    sharded_runs: tuple[Path, Path, subprocess.CompletedProcess[str]],
) -> None:
    """The shipped accelerate config (examples/accelerate/fsdp.yaml: 2 CPU processes) turns
    the sharding on without --fsdp, and trains what one process trains."""
    import os
    import sys

    root, model, _ = sharded_runs
    args = _commands(model, sentiment_csv["train"], tmp_path, sentiment_csv["test"])[0]
    config = Path(__file__).parents[2] / "examples" / "accelerate" / "fsdp.yaml"
    launched = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
         "--main_process_port", str(_free_port()), "-m", "uqcompress", *args],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "UQC_ARTIFACTS": str(tmp_path / "default")},
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert launched.stdout.strip() == str(tmp_path / "finetune")
    assert open_artifact(tmp_path / "finetune").manifest.summary["fsdp_blocks"] == 2
    reference = root / "two" / "finetune"  # the torchrun --fsdp run of the same command
    a = load_file(str(reference / "model.safetensors"))
    b = load_file(str(tmp_path / "finetune" / "model.safetensors"))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5


def test_whole_tensors_go_back_into_a_sharded_module() -> None:
    """What a checkpoint holds (`full_tensors` of a sharded module's state) loads back into
    the sharded module (`shard_like`, as `--resume` and the best epoch's weights do), on a
    one-process group; the same state passes unchanged into a plain module."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from uqcompress.engine.sharding import full_tensors, shard_like
    from uqcompress.engine.train import _laid_out

    dist.init_process_group(
        "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{_free_port()}"
    )
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        fully_shard(model)
        assert isinstance(model[0].weight, DTensor)
        saved = full_tensors(model.state_dict())
        assert not any(isinstance(v, DTensor) for v in saved.values())
        with torch.no_grad():
            for param in model.parameters():
                param.zero_()
        model.load_state_dict(_laid_out(saved, model))
        again = full_tensors(model.state_dict())
        assert all(torch.equal(again[k], saved[k]) for k in saved)
        assert float(saved["0.weight"].abs().sum()) > 0  # the zeros were really replaced
        plain = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        assert _laid_out(saved, plain)["0.weight"] is saved["0.weight"]
        assert shard_like(saved["0.weight"], plain[0].weight) is saved["0.weight"]
    finally:
        dist.destroy_process_group()
