"""The CLI contract of DESIGN.md: stdout is the result, errors are one line, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from uqcompress.artifacts import open_artifact


def test_help_does_not_import_torch_or_transformers() -> None:
    code = (
        "import sys\n"
        "from uqcompress.cli.app import run\n"
        "rc = run(['--help'])\n"
        "heavy = [m for m in ('torch', 'transformers', 'onnx', 'datasets') if m in sys.modules]\n"
        "print('HEAVY', heavy, 'RC', rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY [] RC 0" in proc.stdout
    assert "finetune" in proc.stdout  # the help really was printed


def test_stdout_is_exactly_the_artifact_path(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("init", "--family", "vit", "--num-labels", "10")
    assert result.code == 0
    assert result.out.endswith("\n") and result.out.count("\n") == 1
    path = Path(result.out.strip())
    assert open_artifact(path, expect_kind="model").manifest.step == "init"
    assert path.name.startswith("model-")


def test_json_output(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("init", "--family", "bert", "--labels", "neg,pos", "--json")
    assert result.code == 0
    payload = json.loads(result.out)
    assert payload["kind"] == "model"
    assert payload["summary"]["labels"] == ["neg", "pos"]
    assert payload["summary"]["heads"] == 4 and payload["summary"]["layers"] == 2
    assert Path(payload["path"]).is_dir()


def test_dash_reads_the_input_path_from_stdin(cli, tiny_bert_artifact: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("inspect", "-", stdin=f"{tiny_bert_artifact}\n")
    assert result.code == 0
    assert result.out.strip() == str(tiny_bert_artifact)
    empty = cli("verify", "-", stdin="")
    assert empty.code == 1
    assert "stdin was empty" in empty.err


def test_shell_pipeline_composes(tmp_path: Path, sentiment_csv: dict[str, Path]) -> None:
    uqc = Path(sys.executable).parent / "uqc"
    env = {**os.environ, "UQC_ARTIFACTS": str(tmp_path / "art")}
    script = (
        f'm=$("{uqc}" init --family bert --preset tiny --labels neg,pos | '
        f'"{uqc}" finetune - --data "{sentiment_csv["train"]}" --epochs 1) && '
        f'"{uqc}" eval "$m" --data "{sentiment_csv["test"]}"'
    )
    proc = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    eval_path = Path(proc.stdout.strip())
    artifact = open_artifact(eval_path, expect_kind="eval")
    assert artifact.manifest.summary["examples"] == 40
    assert "NLL" in proc.stderr  # the table went to stderr


def test_version(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("--version")
    assert result.code == 0 and result.out.startswith("uqc ")
