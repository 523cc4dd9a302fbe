"""A labelled dataset as read from its source, before any model-specific encoding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from uqcompress.data.image_source import ImageSource


@dataclass
class LabeledData:
    """Examples plus raw labels, and a fingerprint of their contents.

    Images are sources (`data.image_source.ImageSource`: files or 8-bit arrays), opened per batch
    and preprocessed by the model's image processor, never held as one pixel array; texts
    are strings. Raw labels are ints or strings as the source had them; `label_names` is set
    when the source knows the class names (built-in sets: ints then index into it; a
    `datasets` ClassLabel column: the labels are already its names, in its class order).
    `text_pairs` holds the second text of each example when the set is read with a pair
    column (`--text-pair-column`), and `columns` the text (and pair) column names it was
    read from.
    """

    spec: str
    input_kind: Literal["text", "image"]
    labels: list[Any] | None  # None: an unlabelled set (OOD data, inputs to predict)
    fingerprint: str
    texts: list[str] | None = None
    images: ImageSource | None = None
    label_names: list[str] | None = None
    text_pairs: list[str] | None = None
    columns: list[str] | None = None

    def __len__(self) -> int:
        if self.labels is not None:
            return len(self.labels)
        if self.texts is not None:
            return len(self.texts)
        assert self.images is not None
        return len(self.images)

    @property
    def name(self) -> str:
        """A short name for tables and metric keys: builtin name, or the file's stem."""
        if self.spec.startswith("builtin:"):
            return self.spec.removeprefix("builtin:").split("@")[0]
        if self.spec.startswith("hf:"):  # hf:ORG/NAME[/CONFIG]@SPLIT -> NAME or CONFIG
            return self.spec.removeprefix("hf:").split("@")[0].rstrip("/").split("/")[-1]
        from pathlib import Path

        return Path(self.spec).stem

    def manifest_entry(self, role: str) -> dict[str, Any]:
        return {
            "role": role,
            "spec": self.spec,
            "fingerprint": self.fingerprint,
            "examples": len(self),
        }
