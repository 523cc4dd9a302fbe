"""Walk an artifact's inputs back to its roots (imported or initialised models)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uqcompress.artifacts.hashing import sha256_file
from uqcompress.artifacts.manifest import MANIFEST_NAME
from uqcompress.artifacts.reader import read_manifest
from uqcompress.errors import IntegrityError, UqcError


@dataclass(frozen=True)
class LineageNode:
    depth: int
    role: str
    path: str
    id: str
    kind: str
    step: str
    # "ok", "missing" (moved/deleted), "changed" (id differs), "resealed" (same id, but its
    # manifest is not the one recorded: rebuilt or edited since), "external", "cycle"
    status: str


STALE = ("changed", "resealed")


def check_inputs_current(path: Path) -> None:
    """Raise unless every input up the chain is the one ``path`` was made from."""
    for node in walk_lineage(path)[1:]:
        if node.status in STALE:
            raise IntegrityError(
                f"{path} was made from a {node.kind} input that has changed since: "
                f"{node.role} {node.path} ({node.status}: its manifest is not the one recorded)",
                hint="rebuild this artifact from its inputs as they are now (rerun its step "
                "with --force, or uqc run the recipe)",
            )


def walk_lineage(path: Path, max_depth: int = 64) -> list[LineageNode]:
    """Depth-first list of an artifact and its ancestors; the artifact itself is depth 0."""
    manifest = read_manifest(path)
    nodes = [LineageNode(0, "self", str(path), manifest.id, manifest.kind, manifest.step, "ok")]
    _walk(path.resolve(), manifest.inputs, 1, nodes, max_depth, {manifest.id})
    return nodes


def _walk(
    base: Path,
    inputs: list,
    depth: int,
    nodes: list[LineageNode],
    max_depth: int,
    seen: set[str],
) -> None:
    if depth > max_depth:
        return
    for ref in inputs:
        target = (base / ref.path).resolve()
        if ref.kind == "transformers-dir":
            nodes.append(
                LineageNode(depth, ref.role, str(target), ref.id, ref.kind, "external", "external")
            )
            continue
        try:
            manifest = read_manifest(target)
        except UqcError:
            nodes.append(
                LineageNode(depth, ref.role, str(target), ref.id, ref.kind or "?", "?", "missing")
            )
            continue
        status = "ok" if manifest.id == ref.id else "changed"
        recorded = ref.manifest_sha256
        if status == "ok" and recorded and sha256_file(target / MANIFEST_NAME) != recorded:
            status = "resealed"
        if manifest.id in seen:
            status = "cycle"  # a damaged or hand-edited lineage; never walk it twice
        nodes.append(
            LineageNode(
                depth, ref.role, str(target), manifest.id, manifest.kind, manifest.step, status
            )
        )
        if status != "cycle":
            _walk(target, manifest.inputs, depth + 1, nodes, max_depth, seen | {manifest.id})
