"""The manifest: the one file that makes a directory an artifact (written last)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from uqcompress.errors import SchemaError

MANIFEST_NAME = "manifest.json"
SCHEMA = "uqcompress.artifact"
SCHEMA_VERSION = 1

_REQUIRED = (
    "schema",
    "schema_version",
    "kind",
    "kind_version",
    "id",
    "uqc_version",
    "created_utc",
    "config",
    "inputs",
    "files",
)


@dataclass(frozen=True)
class InputRef:
    """One input of an artifact: its role, where it was (relative to the artifact) and its id."""

    role: str
    path: str
    id: str
    manifest_sha256: str | None = None
    kind: str | None = None


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    bytes: int


@dataclass
class Manifest:
    kind: str
    kind_version: int
    id: str
    uqc_version: str
    created_utc: str
    step: str
    config: dict[str, Any]
    inputs: list[InputRef]
    files: dict[str, FileEntry]
    data: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        raw = asdict(self)
        # Put the envelope first so a human reading the file sees what it is.
        ordered = {"schema": self.schema, "schema_version": self.schema_version}
        ordered.update({k: v for k, v in raw.items() if k not in ordered})
        return ordered

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: Path) -> Manifest:
        missing = [key for key in _REQUIRED if key not in raw]
        if missing:
            raise SchemaError(
                f"{where / MANIFEST_NAME} is missing {', '.join(missing)}",
                hint="the artifact is damaged; re-create it with the step that wrote it",
            )
        try:
            return cls(
                schema=raw["schema"],
                schema_version=int(raw["schema_version"]),
                kind=str(raw["kind"]),
                kind_version=int(raw["kind_version"]),
                id=str(raw["id"]),
                uqc_version=str(raw["uqc_version"]),
                created_utc=str(raw["created_utc"]),
                step=str(raw.get("step", raw["kind"])),
                config=dict(raw["config"]),
                inputs=[InputRef(**item) for item in raw["inputs"]],
                files={k: FileEntry(**v) for k, v in raw["files"].items()},
                data=list(raw.get("data", [])),
                env=dict(raw.get("env", {})),
                summary=dict(raw.get("summary", {})),
                warnings=list(raw.get("warnings", [])),
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise SchemaError(
                f"{where / MANIFEST_NAME} is malformed ({exc})",
                hint="the artifact is damaged; re-create it with the step that wrote it",
            ) from exc
