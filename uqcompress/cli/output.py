"""stdout carries only the result: an artifact path, or JSON with --json; predict's JSONL, or
the path of its --out file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from uqcompress.runtime import interrupts
from uqcompress.steps.common import StepResult


def emit(result: StepResult, as_json: bool) -> None:
    from uqcompress.runtime.distributed import is_main_process

    if not is_main_process():  # one result line per launch, not one per rank
        return
    interrupts.check()  # an interrupted run reports no result, even a reused artifact
    artifact = result.artifact
    if as_json:
        payload: dict[str, Any] = {
            "path": str(artifact.path),
            "kind": artifact.kind,
            "id": artifact.id,
            "reused": result.reused,
            "summary": artifact.manifest.summary,
            "warnings": artifact.manifest.warnings,
        }
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    else:
        sys.stdout.write(f"{artifact.path}\n")
    sys.stdout.flush()


def emit_file(out: Path | None) -> None:
    """The result of a step that writes a file, not an artifact (predict --out FILE): its path,
    once per launch. Without --out the step wrote its result on stdout itself."""
    from uqcompress.runtime.distributed import is_main_process

    if out is not None and is_main_process():
        sys.stdout.write(f"{out}\n")
        sys.stdout.flush()
