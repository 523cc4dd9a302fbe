"""The shared training loop: determinism, learning, label adoption."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file

from uqcompress.artifacts import open_artifact
from uqcompress.steps import finetune


def _weights(path: Path) -> dict:  # type: ignore[type-arg]
    return load_file(str(path / "model.safetensors"))


def test_same_seed_on_cpu_gives_bitwise_identical_weights(
    tmp_path: Path, tiny_bert_artifact: Path, sentiment_csv: dict[str, Path]
) -> None:
    cfg = finetune.FinetuneConfig(data=str(sentiment_csv["train"]), epochs=2, batch_size=16)
    a = finetune.run(tiny_bert_artifact, cfg, tmp_path / "a").artifact
    b = finetune.run(tiny_bert_artifact, cfg, tmp_path / "b").artifact
    assert a.id == b.id
    wa, wb = _weights(a.path), _weights(b.path)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert wa[name].equal(wb[name]), name
    other = finetune.run(
        tiny_bert_artifact,
        finetune.FinetuneConfig(data=str(sentiment_csv["train"]), epochs=2, batch_size=16, seed=1),
        tmp_path / "c",
    ).artifact
    assert other.id != a.id
    assert any(not wa[k].equal(w) for k, w in _weights(other.path).items())


def test_training_learns_and_records_its_curve(trained_bert_artifact: Path) -> None:
    summary = open_artifact(trained_bert_artifact).manifest.summary
    curve = summary["loss_curve"]
    assert len(curve) == 8 and summary["epochs"] == 8
    assert curve[-1] < 0.5 * curve[0]  # a separable toy task is learnt
    assert summary["trained"] is True and summary["steps"] == 8 * 6


def test_validation_accuracy_per_epoch(tmp_path: Path, tiny_vit_artifact: Path) -> None:
    cfg = finetune.FinetuneConfig(
        data="builtin:digits@val", val="builtin:digits@test", epochs=2, batch_size=64, lr=2e-3
    )
    summary = finetune.run(tiny_vit_artifact, cfg, tmp_path / "v").artifact.manifest.summary
    assert len(summary["val_acc_curve"]) == 2
    assert 0.0 <= summary["val_acc"] <= 1.0 and summary["val_acc"] == summary["val_acc_curve"][-1]


def test_placeholder_labels_are_taken_from_the_data(
    cli,
    sentiment_csv: dict[str, Path],  # type: ignore[no-untyped-def]
) -> None:
    model = cli("init", "--family", "bert", "--num-labels", "2").out.strip()
    tuned = cli("finetune", model, "--data", str(sentiment_csv["train"]), "--epochs", "1")
    assert tuned.code == 0, tuned.err
    manifest = open_artifact(Path(tuned.out.strip())).manifest
    assert manifest.summary["labels"] == ["neg", "pos"]
    assert manifest.summary["labels_from_data"] is True
    assert any("adopted" in w for w in manifest.warnings)
    evaluated = cli("eval", tuned.out.strip(), "--data", str(sentiment_csv["test"]))
    assert evaluated.code == 0, evaluated.err


def test_rerun_with_same_inputs_reuses_the_artifact(
    cli,
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],  # type: ignore[no-untyped-def]
) -> None:
    args = (
        "finetune",
        str(tiny_bert_artifact),
        "--data",
        str(sentiment_csv["train"]),
        "--epochs",
        "1",
    )
    first = cli(*args)
    manifest = Path(first.out.strip()) / "manifest.json"
    stamp = manifest.stat().st_mtime_ns
    second = cli(*args, "--threads", "2")  # threads do not change the id
    assert second.code == 0 and second.out == first.out
    assert "reusing" in second.err
    assert manifest.stat().st_mtime_ns == stamp


def test_out_may_not_overlap_an_input(
    cli,
    tiny_bert_artifact: Path,  # type: ignore[no-untyped-def]
    sentiment_csv: dict[str, Path],
    tmp_path: Path,
) -> None:
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_bert_artifact, model)
    for out in (model, model / "inner"):
        result = cli(
            "finetune",
            str(model),
            "--data",
            str(sentiment_csv["train"]),
            "--epochs",
            "1",
            "--out",
            str(out),
            "--force",
        )
        assert result.code == 1
        assert "overlaps the input" in result.err
    assert open_artifact(model).id == open_artifact(tiny_bert_artifact).id
