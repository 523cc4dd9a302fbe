"""Tabular text data from files, read through `datasets`: CSV, JSON Lines / JSON, Parquet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from uqcompress.artifacts.hashing import sha256_bytes, sha256_file
from uqcompress.data.dataset import LabeledData
from uqcompress.errors import DataError

# The csv module refuses fields over 131,072 characters by default; a long review is data, not
# an error (the tokenizer truncates it like any long JSON Lines text). 2**31 - 1 fits a C long
# on every platform, where sys.maxsize overflows one on Windows.
CSV_FIELD_LIMIT = 2**31 - 1

# suffix -> (datasets builder, what it is, how to fix a file that does not parse)
FORMATS: dict[str, tuple[str, str, str]] = {
    ".csv": ("csv", "CSV", "check that the file is a comma-separated table with a header row"),
    ".jsonl": ("json", "JSON Lines", "write one JSON object per line with the same keys"),
    ".json": ("json", "JSON", "write a list of objects, or one JSON object per line"),
    ".parquet": ("parquet", "Parquet", "check the file with pyarrow.parquet.read_table"),
}


def _reason(exc: BaseException) -> str:
    """The innermost useful message of a datasets/pyarrow failure, on one line."""
    cause: BaseException | None = exc
    messages = []
    while cause is not None:
        text = " ".join(str(cause).split())
        if text:
            messages.append(text)
        cause = cause.__cause__ or cause.__context__
    generic = "An error occurred while generating the dataset"
    useful = [m for m in messages if generic not in m] or messages or [type(exc).__name__]
    return useful[-1][:200]


def load_text_file(
    path: Path, text_column: str, label_column: str, require_labels: bool = True
) -> LabeledData:
    """Read a table with a text column and a label column.

    The fingerprint hashes the file's bytes and the two column names, so renaming the file
    keeps the id and editing one cell changes it.
    """

    import datasets

    builder, what, hint = FORMATS[path.suffix.lower()]
    if builder == "csv":
        _check_csv_shape(path)
    elif builder == "parquet":
        _check_parquet_columns(path)
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        table = datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as exc:  # datasets raises many types for unreadable files
        raise DataError(f"cannot read {path} as {what} ({_reason(exc)})", hint=hint) from exc
    columns = list(table.column_names)
    labelled = require_labels or label_column in columns
    needed = [("--text-column", text_column)]
    if labelled:
        needed.append(("--label-column", label_column))
    for flag, column in needed:
        if column not in columns:
            raise DataError(
                f"{path} has no column {column!r}; its columns are {', '.join(columns)}",
                hint=f"pass {flag} with one of those names",
            )
    if len(table) == 0:  # a JSON/Parquet file with no records
        raise DataError(f"{path} has no rows", hint="pass a file with at least one example")
    texts_raw: list[Any] = table[text_column]
    labels: list[Any] = table[label_column] if labelled else [0] * len(texts_raw)
    for row, (text, label) in enumerate(zip(texts_raw, labels, strict=True), start=2):
        if text is None or label is None:
            which = text_column if text is None else label_column
            raise DataError(
                f"{path} line {row}: empty {which!r}",
                hint="fill in or drop rows with missing values",
            )
    label_key = label_column if labelled else ""
    fingerprint = sha256_bytes(f"{sha256_file(path)}\0{text_column}\0{label_key}".encode())[:32]
    return LabeledData(
        spec=str(path),
        input_kind="text",
        texts=[str(t) for t in texts_raw],
        labels=list(labels) if labelled else None,
        fingerprint=fingerprint,
    )


def _check_csv_shape(path: Path) -> None:
    """Catch what `datasets` would report obscurely or not at all: encoding, empty files,
    rows whose field count differs from the header's (silently shifted columns)."""
    import csv
    import io

    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path} is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})",
            hint="re-save the file as UTF-8",
        ) from exc
    if csv.field_size_limit() < CSV_FIELD_LIMIT:
        csv.field_size_limit(CSV_FIELD_LIMIT)
    rows = [row for row in csv.reader(io.StringIO(text, newline="")) if row]
    if not rows:
        raise DataError(f"{path} is empty", hint="pass a CSV with a header row and examples")
    if len(rows) == 1:
        raise DataError(
            f"{path} has a header but no rows", hint="pass a file with at least one example"
        )
    refuse_duplicate_columns(path, rows[0])
    width = len(rows[0])
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != width:
            raise DataError(
                f"{path} row {number} has {len(row)} fields; the header has {width}",
                hint="quote fields that contain commas, and give every row the header's columns",
            )


def _check_parquet_columns(path: Path) -> None:
    """Duplicate Parquet column names, named before pyarrow reports an obscure FieldRef error."""
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except Exception:  # an unreadable file: load_dataset reports it with the usual message
        return
    refuse_duplicate_columns(path, names)


def refuse_duplicate_columns(path: Path, names: list[str]) -> None:
    """Two columns with one name: the reader would keep one or rename the other (`text.1`)
    silently, so which one becomes the text or the labels would be a guess."""
    seen: dict[str, int] = {}
    for number, name in enumerate(names, start=1):
        if name in seen:
            raise DataError(
                f"{path} has two columns named {name!r} (columns {seen[name]} and {number})",
                hint="rename one of them so every column name is distinct",
            )
        seen[name] = number
