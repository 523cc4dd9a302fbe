"""Content hashes: files, canonical JSON, and the deterministic artifact id."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of a byte string."""
    return hashlib.sha256(data).hexdigest()


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the same value always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def artifact_id(
    kind: str,
    kind_version: int,
    config: dict[str, Any],
    input_ids: list[str],
    data_fingerprints: list[str],
) -> str:
    """The id of an artifact: a hash of everything that changes its result.

    Only the result-changing config keys belong in ``config`` (never output paths, devices or
    thread counts), and data enters through content fingerprints, never spec strings or
    timestamps, so re-running a step on the same inputs finds the same id.
    """
    payload = {
        "kind": kind,
        "kind_version": kind_version,
        "config": config,
        "inputs": input_ids,
        "data": data_fingerprints,
    }
    return sha256_bytes(canonical_json(payload).encode())[:32]


def directory_fingerprint(root: Path, exclude: tuple[str, ...] = ()) -> str:
    """A hash of every regular file's relative path and contents under ``root``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel in exclude:
            continue
        digest.update(rel.encode() + b"\0" + sha256_file(path).encode() + b"\n")
    return digest.hexdigest()[:32]
