"""Data spec strings: `builtin:NAME[@split]` or a file path (`.csv`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from uqcompress.errors import DataError

BUILTIN_SPLITS: dict[str, tuple[str, ...]] = {
    "digits": ("train", "val", "test"),
    "photo-patches": ("all",),
}
DEFAULT_SPLIT = {"digits": "train", "photo-patches": "all"}
FILE_SUFFIXES = (".csv", ".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class DataSpec:
    raw: str
    kind: Literal["builtin", "file", "folder"]
    name: str  # builtin name, or the file path
    split: str | None = None


def parse_spec(raw: str) -> DataSpec:
    """Parse and validate a spec string; raises DataError naming what is accepted."""
    text = raw.strip()
    if not text:
        raise DataError("empty data spec", hint="pass --data builtin:digits or --data FILE.csv")
    if text.startswith("builtin:"):
        body = text.removeprefix("builtin:")
        name, _, split = body.partition("@")
        if name not in BUILTIN_SPLITS:
            raise DataError(
                f"unknown built-in dataset {name!r} in {raw!r}",
                hint=f"built-in datasets: {', '.join('builtin:' + n for n in BUILTIN_SPLITS)}",
            )
        split = split or DEFAULT_SPLIT[name]
        if split not in BUILTIN_SPLITS[name]:
            choices = ", ".join(f"builtin:{name}@{s}" for s in BUILTIN_SPLITS[name])
            raise DataError(
                f"unknown split {split!r} of builtin:{name}", hint=f"use one of: {choices}"
            )
        return DataSpec(raw=text, kind="builtin", name=name, split=split)
    path = Path(text)
    if path.is_dir():
        return DataSpec(raw=text, kind="folder", name=str(path))
    if path.suffix.lower() not in FILE_SUFFIXES:
        raise DataError(
            f"unknown data spec {raw!r}: not builtin:NAME, an image folder, or a "
            f"{'/'.join(FILE_SUFFIXES)} file",
            hint="pass builtin:digits[@train|@val|@test], builtin:photo-patches, FILE.csv|"
            ".jsonl|.json|.parquet, or an image folder DIR/<class>/*.png",
        )
    if not path.is_file():
        raise DataError(f"data file {path} does not exist", hint="check the --data path")
    return DataSpec(raw=text, kind="file", name=str(path))
