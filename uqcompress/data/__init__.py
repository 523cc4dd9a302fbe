"""Data specs -> labelled examples -> model-ready batches."""

from __future__ import annotations

from pathlib import Path

from uqcompress.data.dataset import LabeledData
from uqcompress.data.specs import DataSpec, parse_spec


def load_data(
    spec: str,
    text_column: str = "text",
    label_column: str = "label",
    require_labels: bool = True,
    text_pair_column: str | None = None,
) -> LabeledData:
    """`_read`, timed for -v."""
    from uqcompress.runtime.console import phase, user

    with phase(f"read {user(spec)}"):
        return _read(spec, text_column, label_column, require_labels, text_pair_column)


def _read(
    spec: str,
    text_column: str,
    label_column: str,
    require_labels: bool,
    text_pair_column: str | None,
) -> LabeledData:
    """Read the examples a spec names (validated first, so a typo fails before any work).

    With ``require_labels=False`` (OOD sets, `uqc predict`) a file without the label column is
    read as unlabelled examples. ``text_pair_column`` reads a second text per example (a
    sentence pair, as GLUE's sentence1/sentence2); images and built-in sets have none.
    """
    parsed = parse_spec(spec)
    if text_pair_column is not None and parsed.kind in ("builtin", "folder"):
        from uqcompress.errors import DataError

        raise DataError(
            f"--text-pair-column {text_pair_column} reads text pairs; {spec} holds images",
            hint="drop --text-pair-column, or pass a text table with that column",
        )
    if parsed.kind == "builtin":
        from uqcompress.data import builtin

        assert parsed.split is not None
        if parsed.name == "photo-patches":
            return builtin.load_photo_patches()
        return builtin.load_digits_split(parsed.split)
    if parsed.kind == "folder":
        from uqcompress.data.images import load_image_folder

        return load_image_folder(Path(parsed.name), require_labels)
    from uqcompress.data import files

    if parsed.kind == "disk":
        return files.load_saved_dataset(
            Path(parsed.name), text_column, label_column, require_labels, text_pair_column
        )
    if parsed.kind == "hf":
        assert parsed.split is not None
        return files.load_hub_dataset(
            parsed.raw,
            parsed.name,
            parsed.config,
            parsed.split,
            text_column,
            label_column,
            require_labels,
            text_pair_column,
        )
    return files.load_text_file(
        Path(parsed.name), text_column, label_column, require_labels, text_pair_column
    )


__all__ = ["DataSpec", "LabeledData", "load_data", "parse_spec"]
