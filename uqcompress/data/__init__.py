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
) -> LabeledData:
    """Read the examples a spec names (validated first, so a typo fails before any work).

    With ``require_labels=False`` (OOD sets, `uqc predict`) a file without the label column is
    read as unlabelled examples.
    """
    parsed = parse_spec(spec)
    if parsed.kind == "builtin":
        from uqcompress.data import builtin

        assert parsed.split is not None
        if parsed.name == "photo-patches":
            return builtin.load_photo_patches()
        return builtin.load_digits_split(parsed.split)
    if parsed.kind == "folder":
        from uqcompress.data.images import load_image_folder

        return load_image_folder(Path(parsed.name), require_labels)
    from uqcompress.data.files import load_text_file

    return load_text_file(Path(parsed.name), text_column, label_column, require_labels)


__all__ = ["DataSpec", "LabeledData", "load_data", "parse_spec"]
