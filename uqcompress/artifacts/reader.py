"""Open an artifact: parse its manifest, refuse what this version cannot read, verify hashes.

Paths a manifest names are checked by `uqcompress.runtime.paths.safe_join` (re-exported here).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uqcompress.artifacts.hashing import sha256_file
from uqcompress.artifacts.kinds import KIND_VERSIONS, MIGRATIONS
from uqcompress.artifacts.manifest import (
    MANIFEST_NAME,
    SCHEMA,
    SCHEMA_VERSION,
    Manifest,
    validate_envelope,
)
from uqcompress.errors import ArtifactError, IntegrityError, SchemaError
from uqcompress.runtime.paths import FORGED_HINT
from uqcompress.runtime.paths import safe_join as safe_join  # re-exported

_UPGRADE_HINT = "upgrade uqcompress (pip install -U uqcompress) to read it"
_FORGED_HINT = FORGED_HINT
# Real manifests are a few KiB (a large one lists a few thousand files); anything far bigger
# is not one of ours, and reading it whole would only cost memory.
MAX_MANIFEST_BYTES = 32 << 20


@dataclass(frozen=True)
class Artifact:
    """An opened, verified artifact directory."""

    path: Path
    manifest: Manifest

    @property
    def kind(self) -> str:
        return self.manifest.kind

    @property
    def id(self) -> str:
        return self.manifest.id

    def file(self, rel: str) -> Path:
        """Absolute path of one of the artifact's recorded files (checked to stay inside)."""
        if rel not in self.manifest.files:
            raise IntegrityError(
                f"artifact {self.path} has no file {rel!r} in its manifest",
                hint="the artifact is incomplete; re-create it with the step that wrote it",
            )
        return safe_join(self.path, rel)


def read_manifest(path: Path) -> Manifest:
    """Parse and upgrade ``path/manifest.json`` without verifying file hashes."""
    path = Path(path)
    if not path.exists():
        raise ArtifactError(
            f"{path} does not exist",
            hint="pass the directory a uqc step printed, e.g. artifacts/model-1a2b3c4d",
        )
    if not path.is_dir():
        raise ArtifactError(
            f"{path} is a file, not an artifact directory",
            hint="pass the directory a uqc step printed, not a file inside it",
        )
    manifest_path = path / MANIFEST_NAME
    if manifest_path.is_symlink() or (manifest_path.exists() and not manifest_path.is_file()):
        # never follow a link out of the artifact, nor block reading a FIFO
        raise IntegrityError(
            f"{manifest_path} is not a regular file (a symlink, FIFO or device)",
            hint=_FORGED_HINT,
        )
    if not manifest_path.is_file():
        if (path / "config.json").is_file():
            raise ArtifactError(
                f"{path} is a transformers model directory, not a uqc artifact",
                hint=f"turn it into one with: uqc import {path}",
            )
        raise ArtifactError(
            f"{path} is neither a uqc artifact (no {MANIFEST_NAME}) "
            "nor a transformers model directory (no config.json)",
            hint="pass a directory printed by a uqc step, or a save_pretrained directory",
        )
    raw = load_manifest_json(manifest_path)
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise SchemaError(
            f"{manifest_path} is not a uqcompress manifest",
            hint="pass a directory written by uqc",
        )
    validate_envelope(raw, manifest_path)
    return Manifest.from_dict(_upgrade(raw, path), path)


def load_manifest_json(manifest_path: Path) -> Any:
    """Parse a manifest file's JSON; every way it can fail is one SchemaError."""
    try:
        size = manifest_path.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise SchemaError(
                f"{manifest_path} has {size} bytes; a uqcompress manifest is far smaller",
                hint="the artifact is damaged; re-create it with the step that wrote it",
            )
        return json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SchemaError(
            f"{manifest_path} is not valid JSON ({exc})",
            hint="the artifact is damaged; re-create it with the step that wrote it",
        ) from exc
    except RecursionError:
        # json.loads recurses once per nesting level: a 100k-deep document exhausts the stack
        raise SchemaError(
            f"{manifest_path} nests too deeply to be a uqcompress manifest",
            hint="the artifact is damaged; re-create it with the step that wrote it",
        ) from None


def _upgrade(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    schema_version = raw.get("schema_version")
    if not isinstance(schema_version, int) or schema_version > SCHEMA_VERSION:
        raise SchemaError(
            f"{path} uses manifest schema version {schema_version}; "
            f"this uqcompress reads up to {SCHEMA_VERSION}",
            hint=_UPGRADE_HINT,
        )
    kind = raw.get("kind")
    if not isinstance(kind, str) or kind not in KIND_VERSIONS:
        raise SchemaError(
            f"{path} has kind {kind!r}, which this uqcompress does not know",
            hint=_UPGRADE_HINT,
        )
    version = raw.get("kind_version")
    current = KIND_VERSIONS[kind]
    if not isinstance(version, int) or version < 1:
        raise SchemaError(f"{path} has an invalid kind_version {version!r}", hint=_UPGRADE_HINT)
    if version > current:
        raise SchemaError(
            f"{path} is a {kind} artifact of kind_version {version}; "
            f"this uqcompress reads {kind} up to version {current}",
            hint=_UPGRADE_HINT,
        )
    while version < current:
        migrate = MIGRATIONS.get((kind, version))
        if migrate is None:
            raise SchemaError(
                f"{path} is a {kind} artifact of kind_version {version} with no migration "
                f"to {current}",
                hint="re-create it with this version of uqc",
            )
        raw = migrate(raw)
        version += 1
        raw["kind_version"] = version
    return raw


def walk_entries(root: Path) -> list[tuple[str, os.stat_result]]:
    """Every entry under ``root`` as (relative posix path, lstat), never following symlinks.

    Sorted, so errors name the same entry on every run.
    """
    entries: list[tuple[str, os.stat_result]] = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            full = Path(folder) / name
            entries.append((full.relative_to(root).as_posix(), full.lstat()))
    return sorted(entries, key=lambda item: item[0])


def verify_files(path: Path, manifest: Manifest) -> None:
    """Check every recorded file exists with its recorded size and sha256, and that the
    directory holds no file the manifest does not list (nothing unchecked gets loaded) and
    nothing but regular files and folders (a symlink could point anywhere; reading a FIFO
    blocks forever)."""
    for rel, info in walk_entries(path):
        if stat.S_ISDIR(info.st_mode):
            continue
        if not stat.S_ISREG(info.st_mode):
            what = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a regular file"
            raise IntegrityError(
                f"{rel} in {path} is {what}; an artifact holds only regular files",
                hint="replace it with the real file, or re-create the artifact with the step "
                "that wrote it",
            )
        if rel != MANIFEST_NAME and rel not in manifest.files:
            raise IntegrityError(
                f"{rel} in {path} is not listed in its manifest (added or unlisted)",
                hint="remove the file, or re-create the artifact with the step that wrote it",
            )
    for rel, entry in manifest.files.items():
        target = safe_join(path, rel)
        if not target.is_file():
            raise IntegrityError(
                f"artifact {path} is missing {rel}",
                hint="the artifact is incomplete; re-create it with the step that wrote it",
            )
        size = os.path.getsize(target)
        if size != entry.bytes:
            raise IntegrityError(
                f"{rel} in {path} has {size} bytes, the manifest says {entry.bytes} "
                "(truncated or replaced)",
                hint="re-create the artifact with the step that wrote it",
            )
        if sha256_file(target) != entry.sha256:
            raise IntegrityError(
                f"{rel} in {path} does not match its recorded sha256 (tampered or corrupted)",
                hint="re-create the artifact with the step that wrote it",
            )


def open_artifact(
    path: Path | str, expect_kind: str | tuple[str, ...] | None = None, verify: bool = True
) -> Artifact:
    """Open an artifact directory, check its kind, and (by default) verify every file hash."""
    path = Path(path)
    manifest = read_manifest(path)
    if expect_kind is not None:
        kinds = (expect_kind,) if isinstance(expect_kind, str) else expect_kind
        if manifest.kind not in kinds:
            raise ArtifactError(
                f"{path} is {_article(manifest.kind)} {manifest.kind} artifact; this step "
                f"needs {' or '.join(kinds)}",
                hint=f"pass a {' or '.join(kinds)} artifact",
            )
    if verify:
        verify_files(path, manifest)
    return Artifact(path=path, manifest=manifest)


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"
