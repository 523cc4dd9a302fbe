"""benchmarks/real_text_sweep.py on a tiny random headless BERT and a synthetic corpus: every
setting is built and scored on val, the one of lowest val NLL alone is scored on test."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.benchmarks.test_real_text import _corpus, _headless_bert

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import real_text_sweep  # noqa: E402


def test_a_sweep_chooses_on_val_and_scores_only_the_choice_on_test(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _corpus(tmp_path / "data")
    model = _headless_bert(tmp_path / "encoder")
    results = tmp_path / "results"
    argv = ["--method", "sve-finetune", "--grid", "lr=1e-3,3e-2", "--grid", "members=2"]
    argv += ["--quick", "--model-dir", str(model), "--data-dir", str(data)]
    argv += ["--work-dir", str(tmp_path / "work"), "--out-dir", str(results)]
    # every run in the same second: the results file still names its own run (the process)
    monkeypatch.setattr(real_text_sweep.time, "strftime", lambda *_: "20260101-000000")
    assert real_text_sweep.main(argv) == 0
    files = list(results.glob("real_text_sweep-sve-finetune-quick-*.jsonl"))
    assert len(files) == 1
    header, *rows = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert header["grid"] == {"lr": ["1e-3", "3e-2"], "members": ["2"]}
    assert [r["setting"] for r in rows] == [
        {"lr": "1e-3", "members": "2"},
        {"lr": "3e-2", "members": "2"},
    ]
    # each setting really ran with its options (the artifact's recorded config says so)
    for row, lr in zip(rows, (1e-3, 3e-2), strict=True):
        name = real_text_sweep.setting_name("sve-finetune", row["setting"])
        manifest = json.loads((tmp_path / "work" / name / "manifest.json").read_text())
        assert manifest["config"]["lr"] == lr and manifest["config"]["members"] == 2
        assert {"acc", "nll", "ece"} <= set(row["val"]) and row["build_seconds"] > 0
    chosen = min(rows, key=lambda r: (r["val"]["nll"], -r["val"]["acc"]))
    assert header["chosen"] == chosen["setting"]
    assert [("test" in r) for r in rows] == [r is chosen for r in rows]  # test: the choice only
    assert "ood.near.entropy.auroc" in chosen["test"]
    printed = capsys.readouterr().out
    assert "(chosen)" in printed and "on test: acc" in printed
    # a second run in the same second (its models reused) keeps the first one's results
    monkeypatch.setattr(real_text_sweep.os, "getpid", lambda: 1)
    assert real_text_sweep.main(argv) == 0
    assert len(list(results.glob("real_text_sweep-sve-finetune-quick-*.jsonl"))) == 2


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--method", "director"], "give at least one --grid"),
        (["--method", "director", "--grid", "lr"], "expected KEY=V1,V2"),
        (["--method", "director", "--grid", "lr=" + ",".join(["1"] * 25)], "at most 24"),
    ],
)
def test_bad_grids_are_refused_before_anything_runs(
    argv: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        real_text_sweep.main([*argv, "--work-dir", str(tmp_path / "w")])
    assert stopped.value.code != 0
    assert words in capsys.readouterr().err + str(stopped.value.code)
    assert not (tmp_path / "w").exists()
