"""The walk-through's blocks (docs/guide/walkthrough.md, "Every step by example"), run as written
in one shell.

The shell finds a `uqc` that forks from a zygote that imported torch and transformers once
(tests/forkserver.py): each of the walk-through's ~30 calls is still its own process with the
script's descriptors and exit code, without paying 3-4 s of imports. The installed console
script itself is run by tests/cli/test_cli_contract.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.forkserver import Zygote

ROOT = Path(__file__).parents[2]
WALKTHROUGH = ROOT / "docs" / "guide" / "walkthrough.md"
START, END = "<!-- steps-by-example:start -->", "<!-- steps-by-example:end -->"


def _blocks() -> list[str]:
    page = WALKTHROUGH.read_text(encoding="utf-8")
    section = page[page.index(START) : page.index(END)]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.S)


def test_every_step_has_an_example() -> None:
    from uqcompress.recipe.commands import STEP_COMMANDS

    script = "\n".join(_blocks())
    for name in (*STEP_COMMANDS, "predict", "inspect", "verify", "run", "demo"):
        assert re.search(rf"uqc {name} ", script), f"no example of uqc {name}"


def test_walkthrough_examples_run_as_written(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "UQC_ARTIFACTS": str(tmp_path / "artifacts"),
    }
    script = "set -euo pipefail\n" + "\n".join(_blocks())
    with Zygote(tmp_path / "zygote", env) as uqc_bin:
        env["PATH"] = f"{uqc_bin}{os.pathsep}{env['PATH']}"
        result = subprocess.run(
            ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
        )
    assert result.returncode == 0, result.stderr[-4000:]
    first = json.loads((tmp_path / "predictions.jsonl").read_text().splitlines()[0])
    assert {"label", "probs", "entropy", "mutual_info", "abstain"} <= set(first)
    assert "comparison.png" in result.stdout  # ls of the compare artifact
    assert "would be built" in result.stderr  # the dry run's plan
    assert (tmp_path / "demo-quick" / "compare" / "manifest.json").is_file()
