"""`build_or_reuse`: what every step shares. A built artifact's warnings reach stderr once,
when the step that caused them runs (issue 26 item 14), not only manifest.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import ok
from uqcompress.artifacts import open_artifact
from uqcompress.models.factory import create_model


def _warning_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning: ")]


def test_a_random_classifier_head_on_import_is_a_warning_on_stderr_once(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    loaded = create_model("bert", ["a", "b"])
    encoder = tmp_path / "encoder"
    loaded.model.bert.save_pretrained(encoder)  # headless: no classifier weights
    assert loaded.tokenizer is not None
    loaded.tokenizer.save_pretrained(encoder)
    result = cli("import", encoder, "--out", tmp_path / "imported")
    path = ok(result)
    lines = _warning_lines(result.err)
    assert len(lines) == 1, result.err
    assert "no classifier weights" in lines[0] and "initialised at random" in lines[0]
    assert lines[0] == f"warning: {open_artifact(Path(path)).manifest.warnings[0]}"
    again = cli("import", encoder, "--out", tmp_path / "imported")  # reused: said already
    assert ok(again) == path and _warning_lines(again.err) == []


def test_a_pruned_safetensors_export_says_on_stderr_transformers_cannot_load_it(
    cli: Callable[..., Any], tiny_vit_artifact: Path, tmp_path: Path
) -> None:
    scores = ok(cli("score", tiny_vit_artifact, "--method", "l2", "--out", tmp_path / "s"))
    uneven = ok(
        cli(
            "prune", scores, "--ratio", "0.5", "--scope", "global",
            "--min-heads-per-layer", "1", "--out", tmp_path / "pruned",
        )
    )  # fmt: skip
    heads = json.loads((Path(uneven) / "config.json").read_text())["uqc_kept_heads"]
    assert len({len(layer) for layer in heads}) > 1, heads  # uneven
    result = cli("export", uneven, "--format", "safetensors", "--out", tmp_path / "st")
    ok(result)
    lines = _warning_lines(result.err)
    assert len(lines) == 1, result.err
    assert "plain transformers cannot rebuild" in lines[0]
    assert _warning_lines(result.out) == [] and result.out.count("\n") == 1
