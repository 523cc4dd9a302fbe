"""The CI example (docs/guide/ci.md), run as written: the job's script with the job's --set
values, on a tiny BERT checkpoint and CSVs placed where the job expects them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import sentiment_rows, write_csv

ROOT = Path(__file__).parents[2]
JOB = ROOT / "examples" / "ci" / "github-actions.yml"
SCRIPT = ROOT / "examples" / "ci" / "publish-model.sh"
# The tiny model needs more epochs and a higher learning rate than BERT-base's defaults.
TINY = ["--set", "vars.epochs=8", "--set", "vars.lr=3e-3", "--set", "vars.member_epochs=8"]
TINY += ["--set", "vars.member_lr=3e-3"]


def _job_arguments() -> list[str]:
    """The `--set` arguments the job passes to the script."""
    pairs = re.findall(r"--set (\S+)", JOB.read_text(encoding="utf-8"))
    assert pairs, "the job passes its inputs as --set values"
    return [arg for pair in pairs for arg in ("--set", pair)]


def _workspace(tmp_path: Path) -> Path:
    """A checkout as the job sees it: the recipe, the checkpoint and the CSVs."""
    from uqcompress.models.factory import create_model
    from uqcompress.models.loading import save_model

    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    save_model(create_model("bert", ["neg", "pos"]), tmp_path / "models" / "bert-base-finetuned")
    data = tmp_path / "data"
    data.mkdir()
    write_csv(data / "train.csv", list(sentiment_rows(96, seed=1)))
    write_csv(data / "val.csv", list(sentiment_rows(40, seed=3)))
    write_csv(data / "test.csv", list(sentiment_rows(40, seed=2)))
    return tmp_path


def _run(workspace: Path, *extra: str, dist: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "UQC_ARTIFACTS": str(workspace / "artifacts"),
        "DIST": dist,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *_job_arguments(), *TINY, *extra],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_ci_page_shows_the_job_file() -> None:
    page = (ROOT / "docs" / "guide" / "ci.md").read_text(encoding="utf-8")
    assert JOB.read_text(encoding="utf-8").strip() in page
    assert "examples/ci/publish-model.sh" in page


def test_ci_example_publishes_only_when_the_gates_pass(tmp_path: Path) -> None:
    workspace = _workspace(tmp_path)
    passed = _run(workspace, dist="dist/model")
    assert passed.returncode == 0, passed.stderr[-3000:]
    assert passed.stdout.strip() == "dist/model"
    published = workspace / "dist" / "model"
    assert (published / "model.onnx").is_file() and (published / "manifest.json").is_file()

    failed = _run(workspace, "--set", "gate.acc=>= 1.01", dist="dist/strict")
    assert failed.returncode == 3, failed.stderr[-3000:]
    assert "quality gate failed on step 'eval'" in failed.stderr
    assert "14 steps: 0 built, 14 reused" in failed.stderr  # the gate ran on finished artifacts
    assert not (workspace / "dist" / "strict").exists()
