"""Data spec strings: `builtin:NAME[@split]`, `hf:NAME[/CONFIG]@SPLIT`, a file path (`.csv`,
`.jsonl`, `.json`, `.parquet`), a `datasets` `save_to_disk` directory or an image folder."""

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
# What `Dataset.save_to_disk` writes beside its Arrow shards; `DatasetDict.save_to_disk`
# writes DICT_MARKER and one such directory per split.
DISK_MARKERS = ("state.json", "dataset_info.json")
DICT_MARKER = "dataset_dict.json"
HF_HINT = "pass hf:ORG/NAME[/CONFIG]@SPLIT or hf:NAME@SPLIT, e.g. hf:nyu-mll/glue/mrpc@validation"


@dataclass(frozen=True)
class DataSpec:
    raw: str
    kind: Literal["builtin", "file", "folder", "disk", "hf"]
    name: str  # builtin name, the file or directory path, or the Hub id (ORG/NAME)
    split: str | None = None
    config: str | None = None  # hf: the data set's configuration (GLUE's task), if any


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
    if text.startswith("hf:"):
        return _parse_hub(text)
    path = Path(text)
    if path.is_dir():
        if (path / DICT_MARKER).is_file():
            splits = sorted(p.name for p in path.iterdir() if (p / DISK_MARKERS[0]).is_file())
            raise DataError(
                f"{path} is a DatasetDict saved with save_to_disk (splits: "
                f"{', '.join(splits) or 'none'}); uqc reads one split",
                hint=f"pass the split's folder, e.g. {path / (splits[0] if splits else 'train')}",
            )
        if any((path / marker).is_file() for marker in DISK_MARKERS):
            return DataSpec(raw=text, kind="disk", name=str(path))
        return DataSpec(raw=text, kind="folder", name=str(path))
    if path.suffix.lower() not in FILE_SUFFIXES:
        raise DataError(
            f"unknown data spec {raw!r}: not builtin:NAME, an image folder, or a "
            f"{'/'.join(FILE_SUFFIXES)} file",
            hint="pass builtin:digits[@train|@val|@test], builtin:photo-patches, FILE.csv|"
            ".jsonl|.json|.parquet, hf:NAME@SPLIT, a save_to_disk directory, or an image "
            "folder DIR/<class>/*.png",
        )
    if not path.is_file():
        raise DataError(f"data file {path} does not exist", hint="check the --data path")
    return DataSpec(raw=text, kind="file", name=str(path))


def _parse_hub(text: str) -> DataSpec:
    """`hf:NAME@SPLIT`, `hf:ORG/NAME@SPLIT` or `hf:ORG/NAME/CONFIG@SPLIT`: two parts are a
    Hub id (ORG/NAME, as the Hub names data sets now), a third is the configuration."""
    body, at, split = text.removeprefix("hf:").partition("@")
    parts = body.split("/")
    if not body or any(not p or p != p.strip() for p in parts) or len(parts) > 3:
        raise DataError(f"cannot parse the Hub data spec {text!r}", hint=HF_HINT)
    if not at or not split:
        raise DataError(
            f"{text} names no split; a Hub data set has several",
            hint=f"pass e.g. {text.rstrip('@')}@train (or @validation, @test)",
        )
    name = "/".join(parts[:2])
    config = parts[2] if len(parts) == 3 else None
    return DataSpec(raw=text, kind="hf", name=name, split=split, config=config)
