"""Data specs -> labelled examples -> model-ready batches."""

from __future__ import annotations

from pathlib import Path

from uqcompress.data.dataset import LabeledData
from uqcompress.data.specs import DataSpec, parse_spec


def load_data(spec: str, text_column: str = "text", label_column: str = "label") -> LabeledData:
    """Read the examples a spec names (validated first, so a typo fails before any work)."""
    parsed = parse_spec(spec)
    if parsed.kind == "builtin":
        from uqcompress.data.builtin import load_digits_split

        assert parsed.split is not None
        return load_digits_split(parsed.split)
    from uqcompress.data.files import load_text_file

    return load_text_file(Path(parsed.name), text_column, label_column)


__all__ = ["DataSpec", "LabeledData", "load_data", "parse_spec"]
