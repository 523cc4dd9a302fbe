"""Map a data set's raw labels onto a model's classes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _normalise(spec: str, raw: list[Any]) -> list[Any]:
    """Integral floats (a CSV column of 1.0/0.0) become ints; other non-int/str types fail."""
    out: list[Any] = []
    for value in raw:
        if isinstance(value, bool | np.bool_):
            raise DataError(
                f"{spec} has boolean labels ({value!r})",
                hint="use class names (e.g. neg,pos) or class indices (0,1) in the label column",
            )
        if isinstance(value, float | np.floating):
            if not float(value).is_integer():
                raise DataError(
                    f"{spec} has fractional labels ({value!r}); labels must be classes",
                    hint="use class names or integer class indices in the label column",
                )
            value = int(value)
        if _is_int(value) and not INT64_MIN <= int(value) <= INT64_MAX:
            # 1e300 is integral, and no class index: int64 would overflow (OverflowError)
            raise DataError(
                f"{spec} has a label out of range ({raw_repr(value)}); class indices are "
                "small integers",
                hint="use class names or integer class indices (0, 1, ...) in the label column",
            )
        if not (_is_int(value) or isinstance(value, str)):
            raise DataError(
                f"{spec} has labels of type {type(value).__name__}",
                hint="use class names or integer class indices in the label column",
            )
        out.append(value)
    return out


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def raw_repr(value: object) -> str:
    """A label as shown in a message: a huge integer in float notation (1e+300), not 300
    digits."""
    if isinstance(value, int) and len(str(abs(value))) > 20:
        return f"{float(value):.6g}"
    return repr(value)


def _int_like(name: str) -> bool:
    return name.lstrip("-").isdigit()


def map_labels(data: LabeledData, model_labels: list[str], placeholder: bool) -> LabelMapping:
    """Turn raw labels into class ids.

    - string labels must be among the model's label names;
    - int labels name classes when every model label is an integer name ("-1", "1"), and
      are class indices in [0, C) otherwise;
    - a model with placeholder labels (LABEL_0..) adopts names from the data: the source's
      class names when it has them (built-in sets, a ClassLabel column), in their order;
      for ints within 0..C-1 the names "0".."C-1"; otherwise
      the sorted distinct labels, which must number exactly C.
    """
    n_classes = len(model_labels)
    if data.labels is None:
        raise DataError(
            f"{data.spec} has no labels", hint="pass a labelled data set (a label column)"
        )
    if not data.labels:
        raise DataError(f"{data.spec} has no examples", hint="pass a non-empty data set")
    raw = _normalise(data.spec, data.labels)
    all_int = all(_is_int(v) for v in raw)
    if not (all_int or all(isinstance(v, str) for v in raw)):
        raise DataError(
            f"{data.spec} mixes integer and string labels",
            hint="use one kind of label throughout the label column",
        )
    if placeholder and data.label_names is not None:
        if len(data.label_names) != n_classes:
            raise DataError(
                f"{data.spec} has {len(data.label_names)} classes; the model has {n_classes}",
                hint=f"create the model with --num-labels {len(data.label_names)}",
            )
        if all_int:
            return _by_index(data.spec, raw, n_classes, adopted=list(data.label_names))
        # a ClassLabel column: its names, in its class order (not sorted)
        order = {name: i for i, name in enumerate(data.label_names)}
        if all(isinstance(v, str) and v in order for v in raw):
            ids = np.asarray([order[v] for v in raw], dtype=np.int64)
            return LabelMapping(ids=ids, adopted_labels=list(data.label_names))
        if all(0 <= int(v) < n_classes for v in raw):
            return _by_index(data.spec, raw, n_classes, adopted=[str(i) for i in range(n_classes)])
    if all_int and not placeholder and not all(_int_like(n) for n in model_labels):
        return _by_index(data.spec, raw, n_classes, adopted=None)
    keys = [str(v) for v in raw]  # ints under integer names match by name ("1" -> class "1")
    distinct = sorted(set(keys), key=lambda k: (not _int_like(k), int(k) if _int_like(k) else 0, k))
    if placeholder:
        if len(distinct) != n_classes:
            raise DataError(
                f"{data.spec} has {len(distinct)} distinct labels ({_preview(distinct)}); the "
                f"model has {n_classes} unnamed classes",
                hint=f"create the model with --labels {','.join(distinct)}",
            )
        index = {name: i for i, name in enumerate(distinct)}
        return LabelMapping(
            ids=np.asarray([index[k] for k in keys], dtype=np.int64), adopted_labels=distinct
        )
    index = {name: i for i, name in enumerate(model_labels)}
    unknown = [k for k in distinct if k not in index]
    if unknown:
        raise DataError(
            f"{data.spec} has labels {_preview(unknown)} that the model does not know "
            f"(model labels: {_preview(model_labels)})",
            hint="fix the label column, or use a model created with matching --labels",
        )
    return LabelMapping(ids=np.asarray([index[k] for k in keys], dtype=np.int64))


def _by_index(spec: str, raw: list[Any], n_classes: int, adopted: list[str] | None) -> LabelMapping:
    ids = np.asarray(raw, dtype=np.int64)
    bad = sorted({int(v) for v in ids if not 0 <= v < n_classes})
    if bad:
        raise DataError(
            f"{spec} has label ids {_preview(bad)} outside the model's "
            f"{n_classes} classes (0..{n_classes - 1})",
            hint="use a model with matching labels (uqc init --labels/--num-labels)",
        )
    return LabelMapping(ids=ids, adopted_labels=adopted)


def _preview(values: list, limit: int = 5) -> str:
    shown = ", ".join(repr(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")
