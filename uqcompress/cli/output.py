"""stdout carries only the result: an artifact path, or JSON with --json."""

from __future__ import annotations

import json
import sys
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
