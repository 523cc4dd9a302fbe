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
        validate_manifest(raw, where / MANIFEST_NAME)
        return cls(
            schema=raw["schema"],
            schema_version=raw["schema_version"],
            kind=raw["kind"],
            kind_version=raw["kind_version"],
            id=raw["id"],
            uqc_version=raw["uqc_version"],
            created_utc=raw["created_utc"],
            step=raw.get("step", raw["kind"]),
            config=dict(raw["config"]),
            inputs=[InputRef(**item) for item in raw["inputs"]],
            files={k: FileEntry(**v) for k, v in raw["files"].items()},
            data=list(raw.get("data", [])),
            env=dict(raw.get("env", {})),
            summary=dict(raw.get("summary", {})),
            warnings=list(raw.get("warnings", [])),
        )


# -- schema ---------------------------------------------------------------------------------
# A manifest is read from disk, so it may be damaged or forged: every field is type-checked
# before anything uses it, so a wrong type is one line naming the field, never a TypeError
# deep inside a step. The free-form parts (config, summary, env, data) may nest, but not
# without bound: deep nesting breaks copying and printing with RecursionError.

MAX_DEPTH = 64

_DAMAGED_HINT = (
    "the manifest was damaged or edited; re-create the artifact with the step that wrote it"
)

# What a field must be: a Python type (or tuple of them) and the words for the message.
_Expect = tuple[type | tuple[type, ...], str]
_STR: _Expect = (str, "a string")
_INT: _Expect = (int, "an integer")
_NUMBER: _Expect = ((int, float), "a number")
_OPT_STR: _Expect = ((str, type(None)), "a string or null")
_OBJECT: _Expect = (dict, "an object")
_LIST: _Expect = (list, "a list")

_ENVELOPE: dict[str, _Expect] = {
    "schema": _STR,
    "schema_version": _INT,
    "kind": _STR,
    "kind_version": _INT,
}
_FIELDS: dict[str, _Expect] = {
    **_ENVELOPE,
    "id": _STR,
    "uqc_version": _STR,
    "created_utc": _STR,
    "step": _STR,
    "config": _OBJECT,
    "inputs": _LIST,
    "files": _OBJECT,
    "data": _LIST,
    "env": _OBJECT,
    "summary": _OBJECT,
    "warnings": _LIST,
}
_INPUT_FIELDS: dict[str, _Expect] = {
    "role": _STR,
    "path": _STR,
    "id": _STR,
    "manifest_sha256": _OPT_STR,
    "kind": _OPT_STR,
}
_INPUT_REQUIRED = ("role", "path", "id")
_FILE_FIELDS: dict[str, _Expect] = {"sha256": _STR, "bytes": _INT}
# Summary keys that steps read back from their inputs, with the type they rely on.
_SUMMARY_FIELDS: dict[str, _Expect] = {
    "members": _INT,
    "parameters": _INT,
    "family": _STR,
    "method": _STR,
    "ratio": _NUMBER,
    "acc": _NUMBER,
    "kept_heads": _LIST,
    "calibration": ((dict, type(None)), "an object or null"),
}


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, bool | int | float):
        return names.get(type(value), "a number")
    return names.get(type(value), type(value).__name__)


def _expect(value: Any, expect: _Expect, field: str, where: Path) -> None:
    types, words = expect
    # bool is an int in Python but never a valid count, version or size in a manifest
    if isinstance(value, bool) or not isinstance(value, types):
        raise SchemaError(
            f"{where}: {field} must be {words}, not {_json_type(value)}", hint=_DAMAGED_HINT
        )


def _check_depth(raw: Any, where: Path) -> None:
    """Refuse nesting deeper than MAX_DEPTH (iteratively: the check itself cannot recurse)."""
    stack: list[tuple[Any, int]] = [(raw, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SchemaError(f"{where} nests deeper than {MAX_DEPTH} levels", hint=_DAMAGED_HINT)
        if isinstance(value, dict):
            stack.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            stack.extend((child, depth + 1) for child in value)


def validate_envelope(raw: dict[str, Any], where: Path) -> None:
    """Type-check the fields that say what a manifest is (read before any migration)."""
    _check_depth(raw, where)
    for key, expect in _ENVELOPE.items():
        if key in raw:
            _expect(raw[key], expect, key, where)


def validate_manifest(raw: dict[str, Any], where: Path) -> None:
    """Check that every known field of a manifest has its type; raise SchemaError naming the
    first one that does not."""
    missing = [key for key in _REQUIRED if key not in raw]
    if missing:
        raise SchemaError(f"{where} is missing {', '.join(missing)}", hint=_DAMAGED_HINT)
    validate_envelope(raw, where)
    for key, expect in _FIELDS.items():
        if key in raw:
            _expect(raw[key], expect, key, where)
    for i, item in enumerate(raw["inputs"]):
        _expect(item, _OBJECT, f"inputs[{i}]", where)
        _check_record(item, _INPUT_FIELDS, _INPUT_REQUIRED, f"inputs[{i}]", where)
    for rel, entry in raw["files"].items():
        _expect(entry, _OBJECT, f"files[{rel!r}]", where)
        _check_record(entry, _FILE_FIELDS, tuple(_FILE_FIELDS), f"files[{rel!r}]", where)
        if entry["bytes"] < 0:
            raise SchemaError(f"{where}: files[{rel!r}].bytes is negative", hint=_DAMAGED_HINT)
    for i, item in enumerate(raw.get("data", [])):
        _expect(item, _OBJECT, f"data[{i}]", where)
    for i, item in enumerate(raw.get("warnings", [])):
        _expect(item, _STR, f"warnings[{i}]", where)
    summary = raw.get("summary", {})
    for key, expect in _SUMMARY_FIELDS.items():
        if key in summary:
            _expect(summary[key], expect, f"summary.{key}", where)


def _check_record(
    record: dict[str, Any],
    fields: dict[str, _Expect],
    required: tuple[str, ...],
    name: str,
    where: Path,
) -> None:
    unknown = sorted(set(record) - set(fields))
    missing = [key for key in required if key not in record]
    if unknown or missing:
        problem = f"has unknown keys {unknown}" if unknown else f"is missing {', '.join(missing)}"
        raise SchemaError(f"{where}: {name} {problem}", hint=_DAMAGED_HINT)
    for key, expect in fields.items():
        if key in record:
            _expect(record[key], expect, f"{name}.{key}", where)
