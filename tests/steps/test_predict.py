"""`uqc predict`: JSONL on stdout, one record per example, ONNX and torch agree."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

LABELS = ["neg", "pos"]


def _records(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def _check_records(records: list[dict[str, Any]], labels: list[str], n: int) -> None:
    assert len(records) == n
    assert [r["index"] for r in records] == list(range(n))
    for record in records:
        assert set(record) == {"index", "label", "probs", "entropy", "mutual_info"}
        probs = record["probs"]
        assert list(probs) == labels
        assert math.isclose(sum(probs.values()), 1.0, abs_tol=1e-5)
        assert all(0.0 <= p <= 1.0 for p in probs.values())
        assert record["label"] == max(labels, key=lambda name: probs[name])
        want_entropy = -sum(p * math.log(p) for p in probs.values() if p > 0)
        assert record["entropy"] == pytest.approx(want_entropy, abs=1e-5)
        assert record["mutual_info"] == pytest.approx(0.0, abs=1e-6)


def test_predict_onnx_and_torch_agree(
    cli: Callable[..., Any],
    bert_onnx: Path,
    trained_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
) -> None:
    data = sentiment_csv["test"]
    onnx_run = cli("predict", bert_onnx, "--data", data)
    torch_run = cli("predict", trained_bert_artifact, "--data", data, "--batch-size", "7")
    assert onnx_run.code == 0, onnx_run.err
    assert torch_run.code == 0, torch_run.err
    onnx_records, torch_records = _records(onnx_run.out), _records(torch_run.out)
    _check_records(onnx_records, LABELS, 40)
    _check_records(torch_records, LABELS, 40)
    for a, b in zip(onnx_records, torch_records, strict=True):
        assert a["label"] == b["label"]
        for label in LABELS:
            assert a["probs"][label] == pytest.approx(b["probs"][label], abs=1e-4)
        assert a["entropy"] == pytest.approx(b["entropy"], abs=1e-4)
    # The trained model predicts the toy task: the labels are not all the same, and mostly right.
    with data.open() as handle:
        truth = [row["label"] for row in csv.DictReader(handle)]
    predicted = [r["label"] for r in onnx_records]
    assert len(set(predicted)) == 2
    assert sum(p == t for p, t in zip(predicted, truth, strict=True)) >= 34
    # predict writes no artifact (a registered step with writes_artifact=False).
    root = Path(os.environ["UQC_ARTIFACTS"])
    assert not root.exists() or not any(root.iterdir())


def test_predict_csv_without_label_column(
    cli: Callable[..., Any],
    tmp_path: Path,
    bert_onnx: Path,
    trained_bert_artifact: Path,
) -> None:
    texts = ["the film was great fun", "awful", "boring and dull and the worst acting"]
    path = tmp_path / "unlabelled.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text"])
        writer.writerows([t] for t in texts)
    onnx_run = cli("predict", bert_onnx, "--data", path)
    torch_run = cli("predict", trained_bert_artifact, "--data", path)
    assert onnx_run.code == 0, onnx_run.err
    assert torch_run.code == 0, torch_run.err
    onnx_records, torch_records = _records(onnx_run.out), _records(torch_run.out)
    _check_records(onnx_records, LABELS, 3)
    for a, b in zip(onnx_records, torch_records, strict=True):
        assert a["probs"]["pos"] == pytest.approx(b["probs"]["pos"], abs=1e-4)
    assert onnx_records[0]["label"] == "pos"
    assert onnx_records[1]["label"] == onnx_records[2]["label"] == "neg"


def test_predict_photo_patches_with_vit_export(cli: Callable[..., Any], vit_onnx: Path) -> None:
    result = cli("predict", vit_onnx, "--data", "builtin:photo-patches")
    assert result.code == 0, result.err
    records = _records(result.out)
    _check_records(records, [str(d) for d in range(10)], 1000)
    entropies = [r["entropy"] for r in records]
    assert max(entropies) <= math.log(10) + 1e-6
    assert max(entropies) > min(entropies)  # per-example values, not one constant


def test_predict_out_never_overwrites_its_own_input(  # type: ignore[no-untyped-def]
    cli: Callable[..., Any], tiny_bert_artifact: Path, sentiment_csv: dict[str, Path], tmp_path
) -> None:
    """Issue 26 item 16: `--out t.csv --force` where t.csv is --data (also through a symlink
    or a hard link) is refused in one line and the data file is untouched."""
    import shutil

    from uqcompress.models.factory import create_model
    from uqcompress.models.loading import save_model

    data = tmp_path / "t.csv"
    shutil.copy(sentiment_csv["test"], data)
    before = data.read_bytes()
    (tmp_path / "link.csv").symlink_to(data)
    os.link(data, tmp_path / "hard.csv")
    for out in (data, tmp_path / "link.csv", tmp_path / "hard.csv"):
        result = cli("predict", tiny_bert_artifact, "--data", data, "--out", out, "--force")
        assert result.code == 1 and result.out == "", result.err
        lines = result.err.strip().splitlines()
        assert len(lines) == 1 and "overlaps the input" in lines[0], result.err
        assert data.read_bytes() == before
    plain = tmp_path / "plain"  # a transformers folder as the model: not inside an artifact
    save_model(create_model("bert", ["neg", "pos"]), plain)
    inside = cli("predict", plain, "--data", data, "--out", plain / "p.jsonl")
    assert inside.code == 1 and "overlaps the input" in inside.err
    assert not (plain / "p.jsonl").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard.csv", "link.csv", "plain", "t.csv"]


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        (28, "No space left on device"),  # ENOSPC
        (30, "Read-only file system"),  # EROFS
        (27, "File too large"),  # EFBIG
        (36, "File name too long"),  # ENAMETOOLONG
    ],
)
def test_predict_environment_faults_are_one_line(  # type: ignore[no-untyped-def]
    cli: Callable[..., Any],
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
    code: int,
    needle: str,
) -> None:
    """Issue 26 item 23: a full disk, a read-only mount, `ulimit -f`, a name too long while
    predict installs --out: one line naming the fault, no traceback, no temp file left."""
    import errno

    assert errno.errorcode[code] in ("ENOSPC", "EROFS", "EFBIG", "ENAMETOOLONG")
    out = tmp_path / "preds" / "p.jsonl"
    real_replace = os.replace

    def failing_replace(src: Any, dst: Any) -> None:
        if Path(dst) == out:
            raise OSError(code, os.strerror(code), str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    result = cli("predict", tiny_bert_artifact, "--data", sentiment_csv["test"], "--out", out)
    assert result.code == 1 and result.out == "", result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.err
    assert "(fix: " in lines[0] and "Traceback" not in result.err
    assert list(out.parent.iterdir()) == []


def test_predict_under_a_file_size_limit_is_one_line(  # type: ignore[no-untyped-def]
    tiny_bert_artifact: Path, sentiment_csv: dict[str, Path], tmp_path
) -> None:
    """`ulimit -f`: the kernel refuses the write with EFBIG (Python ignores SIGXFSZ)."""
    import resource
    import subprocess
    import sys

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))

    out = tmp_path / "p.jsonl"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "uqcompress", "predict", str(tiny_bert_artifact)]
    command += ["--data", str(sentiment_csv["test"]), "--out", str(out)]
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, preexec_fn=limit, timeout=300
    )
    assert done.returncode == 1 and done.stdout == "", done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "File too large" in lines[0] and "ulimit -f" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_a_250_character_out_name_is_accepted(  # type: ignore[no-untyped-def]
    cli: Callable[..., Any], tiny_bert_artifact: Path, sentiment_csv: dict[str, Path], tmp_path
) -> None:
    """The temp name beside a valid 250-byte --out stays within 255 bytes."""
    out = tmp_path / ("p" * 244 + ".jsonl")
    assert len(out.name) == 250
    result = cli("predict", tiny_bert_artifact, "--data", sentiment_csv["test"], "--out", out)
    assert result.code == 0, result.err
    assert [p.name for p in tmp_path.iterdir()] == [out.name]
    folder = tmp_path / ("e" * 250)
    evaluated = cli("eval", tiny_bert_artifact, "--data", sentiment_csv["test"], "--out", folder)
    assert evaluated.code == 0, evaluated.err
    assert (folder / "manifest.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, folder.name])


def test_predict_in_bfloat16_is_close_to_float32(
    cli: Callable[..., Any], trained_bert_artifact: Path, sentiment_csv: dict[str, Path]
) -> None:
    runs = {}
    for dtype in ("float32", "bfloat16"):
        result = cli(
            "predict", str(trained_bert_artifact), "--data", str(sentiment_csv["test"]),
            "--dtype", dtype,
        )  # fmt: skip
        assert result.code == 0, result.err
        runs[dtype] = [json.loads(line) for line in result.out.splitlines()]
    assert len(runs["float32"]) == len(runs["bfloat16"]) == 40
    for full, half in zip(runs["float32"], runs["bfloat16"], strict=True):
        for label, p in full["probs"].items():
            assert half["probs"][label] == pytest.approx(p, abs=0.03)
    pairs = zip(runs["float32"], runs["bfloat16"], strict=True)
    agree = sum(f["label"] == h["label"] for f, h in pairs)
    assert agree >= 38
