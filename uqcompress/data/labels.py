"""Map a data set's raw labels onto a model's classes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from uqcompress.data.dataset import LabeledData
from uqcompress.errors import DataError


@dataclass(frozen=True)
class LabelMapping:
    """Class ids per example and, when the model had placeholder labels, the names adopted."""

    ids: npt.NDArray[np.int64]
    adopted_labels: list[str] | None = None


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def map_labels(data: LabeledData, model_labels: list[str], placeholder: bool) -> LabelMapping:
    """Turn raw labels into class ids.

    - int labels are class indices and must lie in [0, C);
    - string labels must be among the model's label names;
    - a model with placeholder labels (LABEL_0..) adopts names from the data instead: the
      source's class names when it has them, else the sorted distinct strings, which must
      number exactly C.
    """
    n_classes = len(model_labels)
    raw = data.labels
    if raw is None:
        raise DataError(
            f"{data.spec} has no labels", hint="pass a labelled data set (a label column)"
        )
    if not raw:
        raise DataError(f"{data.spec} has no examples", hint="pass a non-empty data set")
    all_int = all(_is_int(v) for v in raw)
    all_str = all(isinstance(v, str) for v in raw)
    if not (all_int or all_str):
        raise DataError(
            f"{data.spec} mixes integer and string labels",
            hint="use one kind of label throughout the label column",
        )
    if all_int:
        ids = np.asarray(raw, dtype=np.int64)
        bad = sorted({int(v) for v in ids if not 0 <= v < n_classes})
        if bad:
            raise DataError(
                f"{data.spec} has label ids {_preview(bad)} outside the model's "
                f"{n_classes} classes (0..{n_classes - 1})",
                hint="use a model with matching labels (uqc init --labels/--num-labels)",
            )
        adopted = None
        if placeholder and data.label_names is not None:
            adopted = list(data.label_names)
            if len(adopted) != n_classes:
                raise DataError(
                    f"{data.spec} has {len(adopted)} classes; the model has {n_classes}",
                    hint=f"create the model with --num-labels {len(adopted)}",
                )
        return LabelMapping(ids=ids, adopted_labels=adopted)
    distinct = sorted(set(raw))
    if placeholder:
        if len(distinct) != n_classes:
            raise DataError(
                f"{data.spec} has {len(distinct)} distinct labels ({_preview(distinct)}); the "
                f"model has {n_classes} unnamed classes",
                hint=f"create the model with --labels {','.join(distinct)}",
            )
        names = distinct
        index = {name: i for i, name in enumerate(names)}
        return LabelMapping(
            ids=np.asarray([index[v] for v in raw], dtype=np.int64), adopted_labels=names
        )
    index = {name: i for i, name in enumerate(model_labels)}
    unknown = [v for v in distinct if v not in index]
    if unknown:
        raise DataError(
            f"{data.spec} has labels {_preview(unknown)} that the model does not know "
            f"(model labels: {_preview(model_labels)})",
            hint="fix the label column, or use a model created with matching --labels",
        )
    return LabelMapping(ids=np.asarray([index[v] for v in raw], dtype=np.int64))


def _preview(values: list, limit: int = 5) -> str:
    shown = ", ".join(repr(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")
