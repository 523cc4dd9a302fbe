"""Containment of paths read from files: one check for every path a file names.

A manifest's file list, an ONNX model's external-data locations and tokenizer metadata, and
the Arrow shards a `datasets` save_to_disk folder's state.json lists all go through
`safe_join`: a path that is absolute, empty, or resolves (symlinks followed) outside its
folder is refused before anything reads it.
"""

from __future__ import annotations

from pathlib import Path

from uqcompress.errors import IntegrityError, UqcError

FORGED_HINT = "the artifact was edited or forged; do not trust it"


def safe_join(
    root: Path,
    rel: str,
    named_by: str | None = None,
    *,
    place: str = "the artifact directory",
    error: type[UqcError] = IntegrityError,
    hint: str = FORGED_HINT,
) -> Path:
    """Join ``rel`` to ``root`` and refuse anything that would leave ``root``.

    Symlinks are resolved first, so a link that points out of ``root`` is refused too.
    ``named_by`` says who named the path in the message (default: the manifest of ``root``);
    ``place`` names ``root`` in it; ``error`` and ``hint`` are what is raised (an artifact's
    IntegrityError by default, a DataError for a data folder).
    """
    who = named_by or f"manifest of {root}"
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise error(f"{who} names an invalid path {rel!r}", hint=hint)
    candidate = Path(rel)
    if candidate.is_absolute() or rel.startswith(("/", "\\")):
        raise error(f"{who} names an absolute path {rel!r}", hint=hint)
    resolved_root = root.resolve()
    resolved = (resolved_root / candidate).resolve()
    if resolved_root not in resolved.parents:
        raise error(f"{who} names {rel!r}, which is outside {place}", hint=hint)
    return resolved
