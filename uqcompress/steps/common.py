"""What every step shares: reuse-or-build around the atomic writer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from uqcompress.artifacts import (
    Artifact,
    ArtifactWriter,
    OutputPlan,
    clean_stale_temp_dirs,
    resolve_destination,
)
from uqcompress.console import stderr


@dataclass(frozen=True)
class StepResult:
    artifact: Artifact
    reused: bool


def build_or_reuse(
    plan: OutputPlan,
    out: Path | None,
    force: bool,
    build: Callable[[ArtifactWriter], None],
) -> StepResult:
    """Reuse an artifact with the same id at the destination, else build it atomically."""
    dest, existing = resolve_destination(plan, out, force)
    if existing is not None:
        stderr.print(f"[dim]{dest}: same inputs and config as before, reusing it[/dim]")
        return StepResult(artifact=existing, reused=True)
    # Temp dirs of killed processes (their pid is gone) would otherwise pile up here.
    clean_stale_temp_dirs(dest.parent)
    with ArtifactWriter(dest, plan, force=force) as writer:
        build(writer)
    return StepResult(artifact=writer.artifact, reused=False)
