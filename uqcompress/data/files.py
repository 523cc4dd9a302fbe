"""Tabular text data from files, read through `datasets`: CSV, JSON Lines / JSON, Parquet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    path: Path,
    text_column: str,
    label_column: str,
    require_labels: bool = True,
    pair_column: str | None = None,
) -> LabeledData:
    """Read a table with a text column (and a pair column) and a label column.

    The fingerprint hashes the contents (`content_fingerprint`), so renaming the file or
    re-saving it in another format keeps the id and editing one cell changes it.
    """

    import datasets

    builder, what, hint = FORMATS[path.suffix.lower()]
    lines: list[int] | None = None
    if builder == "csv":
        _check_csv_shape(path)
    elif builder == "parquet":
        _check_parquet_columns(path)
    else:
        lines = check_json_records(path)
    _quiet(datasets)
    try:
        table = datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as exc:  # datasets raises many types for unreadable files
        raise DataError(f"cannot read {path} as {what} ({_reason(exc)})", hint=hint) from exc
    if lines is not None and len(lines) != len(table):
        lines = None  # not expected; rows are then named by index
    return from_dataset(
        table,
        str(path),
        text_column,
        label_column,
        require_labels,
        pair_column,
        row_base=2 if builder == "csv" else 1,  # a CSV line after its header; a 1-based row
        lines=lines,
    )


def _json_problem(value: Any) -> str | None:
    """What is wrong with one JSON record (None: an object, as a record must be)."""
    if isinstance(value, dict):
        return None
    kind = (
        "null"
        if value is None
        else "a list"
        if isinstance(value, list)
        else "a string"
        if isinstance(value, str)
        else "a boolean"
        if isinstance(value, bool)
        else "a number"
    )
    return f"holds {kind}, not a JSON object"


def check_json_records(path: Path) -> list[int]:
    """Validate a JSON Lines file (or a .json file: one JSON list of objects, one object, or
    JSON Lines) before `datasets` reads it: its JSON builder crashes the process on a `null`
    line (exit 139) and reports other bad lines through pandas ("Trailing data"). Raises one
    line naming the file, the 1-based line and what is wrong; returns the line of each
    record, in order (blank lines hold none)."""
    import json

    text = _read_utf8(path)
    hint = FORMATS[path.suffix.lower()][2]
    if not text.strip():
        raise DataError(f"{path} is empty", hint=hint)
    stripped = text.lstrip()
    if path.suffix.lower() == ".json" and stripped.startswith("["):
        return _check_json_list(path, text, hint)
    lines: list[int] = []
    # "\n" only: splitlines() would also split at U+2028 and other separators that a JSON
    # string may hold unescaped
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (ValueError, RecursionError) as exc:
            if path.suffix.lower() == ".json" and not lines:
                try:  # one JSON object over several lines
                    whole = json.loads(text)
                except (ValueError, RecursionError):
                    whole = None
                if isinstance(whole, dict):
                    return [number]
            reason = (
                f"{exc.msg} at column {exc.colno}"
                if isinstance(exc, json.JSONDecodeError)
                else "nested too deeply"
            )
            raise DataError(f"{path} line {number}: not valid JSON ({reason})", hint=hint) from exc
        problem = _json_problem(value)
        if problem is not None:
            raise DataError(f"{path} line {number}: {problem}", hint=hint)
        lines.append(number)
    return lines


def _check_json_list(path: Path, text: str, hint: str) -> list[int]:
    """A .json file holding one list: every item an object; returns each item's line."""
    import json

    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path} line {exc.lineno}: not valid JSON ({exc.msg})", hint=hint) from exc
    except RecursionError as exc:
        raise DataError(f"{path} is nested too deeply to read", hint=hint) from exc
    decoder = json.JSONDecoder()
    lines: list[int] = []
    position = text.index("[") + 1
    for number, item in enumerate(items, start=1):
        while text[position] in " \t\r\n,":
            position += 1
        line = text.count("\n", 0, position) + 1
        problem = _json_problem(item)
        if problem is not None:
            raise DataError(f"{path} line {line}: item {number} {problem}", hint=hint)
        _, position = decoder.raw_decode(text, position)
        lines.append(line)
    return lines


def load_saved_dataset(
    path: Path,
    text_column: str,
    label_column: str,
    require_labels: bool = True,
    pair_column: str | None = None,
) -> LabeledData:
    """Read a directory written by `datasets.Dataset.save_to_disk` (one split)."""
    import datasets

    _check_saved_files(path)
    _quiet(datasets)
    try:
        table = datasets.load_from_disk(str(path))
    except Exception as exc:  # missing shards, a damaged state.json or Arrow file, ...
        raise DataError(
            f"cannot read {path} as a datasets save_to_disk directory ({_reason(exc)})",
            hint="re-save it with Dataset.save_to_disk(DIR), or pass the folder that holds "
            "its state.json and .arrow files",
        ) from exc
    if not isinstance(table, datasets.Dataset):  # a DatasetDict without dataset_dict.json
        raise DataError(
            f"{path} holds several splits ({', '.join(table)}); uqc reads one split",
            hint="pass the split's folder",
        )
    return from_dataset(table, str(path), text_column, label_column, require_labels, pair_column)


SAVED_HINT = (
    "re-save it with Dataset.save_to_disk(DIR); a data folder may name only files inside itself"
)


def _check_saved_files(path: Path) -> None:
    """Every Arrow shard a save_to_disk folder's state.json names stays inside the folder
    (the same containment check as an artifact's files and an ONNX model's external data):
    `datasets` would follow `../outside/x.arrow` or an absolute path and read that file."""
    import json

    from uqcompress.runtime.paths import safe_join

    state_path = path / "state.json"
    for marker in ("state.json", "dataset_info.json"):  # read by datasets too: no link out
        if (path / marker).is_symlink():
            safe_join(
                path,
                marker,
                named_by=f"the data folder {path}",
                place=f"the data folder {path}",
                error=DataError,
                hint=SAVED_HINT,
            )
    if not state_path.is_file():
        return  # load_from_disk reports the missing state.json in the usual message
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise DataError(
            f"cannot read {path} as a datasets save_to_disk directory (its state.json: "
            f"{_reason(exc)})",
            hint=SAVED_HINT,
        ) from exc
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list) or not all(
        isinstance(entry, dict) and "filename" in entry for entry in files
    ):
        raise DataError(
            f"cannot read {path} as a datasets save_to_disk directory (its state.json has "
            'no valid _data_files list of {"filename": ...})',
            hint=SAVED_HINT,
        )
    for entry in files:
        safe_join(
            path,
            entry["filename"],
            named_by=str(state_path),
            place=f"the data folder {path}",
            error=DataError,
            hint=SAVED_HINT,
        )


def load_hub_dataset(
    spec: str,
    name: str,
    config: str | None,
    split: str,
    text_column: str,
    label_column: str,
    require_labels: bool = True,
    pair_column: str | None = None,
) -> LabeledData:
    """`hf:NAME[/CONFIG]@SPLIT` through `datasets.load_dataset`: the local datasets cache
    ($HF_DATASETS_CACHE) when it has the data set (always, with HF_DATASETS_OFFLINE=1 or
    HF_HUB_OFFLINE=1), else a download from the Hub."""
    import os

    import datasets

    if Path(name).exists():  # load_dataset would read the local path instead of the Hub
        raise DataError(
            f"{spec} names {name!r}, which is also a local path here; datasets would read the "
            "local files instead of the Hub data set",
            hint=f"pass the local data as --data {name} itself, or run from another folder",
        )
    from huggingface_hub.utils import logging as hub_logging

    from uqcompress.runtime.planning import is_planning

    _quiet(datasets)
    hub_logging.set_verbosity_error()  # no retry narration: the outcome is one line
    cache = os.environ.get("HF_DATASETS_CACHE") or None  # read now, not at datasets' import
    # a dry run (uqc run --dry-run) reads the cache only: it downloads nothing
    offline = is_planning() or bool(datasets.config.HF_HUB_OFFLINE)
    saved = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = offline
    try:
        table = datasets.load_dataset(name, config, split=split, cache_dir=cache)
    except Exception as exc:  # not cached and offline, no such data set, config or split
        reason = _reason(exc)
        missing = isinstance(exc, ConnectionError | FileNotFoundError) or "Hub" in reason
        if missing:
            where = cache or str(datasets.config.HF_DATASETS_CACHE)
            mode = (
                "a dry run downloads nothing"
                if is_planning()
                else "offline mode is set"
                if offline
                else reason
            )
            raise DataError(
                f"{spec} is not in the local datasets cache ({where}) and cannot be fetched: "
                f"{mode}",
                hint="check the name (a configuration goes third: hf:ORG/NAME/CONFIG@SPLIT); "
                "load it once where the Hub is reachable so the cache has it, or pass a "
                "save_to_disk folder or a file",
            ) from exc
        raise DataError(
            f"cannot read {spec} ({reason})",
            hint="check the configuration and split names (hf:ORG/NAME/CONFIG@SPLIT)",
        ) from exc
    finally:
        datasets.config.HF_HUB_OFFLINE = saved
    return from_dataset(table, spec, text_column, label_column, require_labels, pair_column)


def _quiet(datasets: Any) -> None:
    """No progress bars and no log lines from `datasets` on our reads: a file it cannot read
    is reported in one line (DataError, with its reason), and its builders log the same
    failure at error level first ("Failed to read schema from ...", "Failed to load JSON
    from file ..."), a stray second line."""
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL + 1)


def class_names(table: Any, column: str) -> list[str] | None:
    """The names of a `datasets.ClassLabel` column, or None for a plain column."""
    import datasets

    feature = table.features.get(column)
    if isinstance(feature, datasets.ClassLabel):
        return [str(n) for n in feature.names]
    return None


def from_dataset(
    table: Any,
    spec: str,
    text_column: str,
    label_column: str,
    require_labels: bool,
    pair_column: str | None = None,
    row_base: int = 0,
    lines: list[int] | None = None,
) -> LabeledData:
    """A `datasets.Dataset` as labelled examples: its text (and pair) column, and its labels
    (a ClassLabel column's class ids become its names; -1, no label, is refused where labels
    are required and makes the set unlabelled where they are not). Rows are named from
    `row_base` (2 for a CSV's line numbers, 1 for a Parquet file's rows), or by `lines`, the
    file line of each row (JSON Lines)."""
    columns = list(table.column_names)
    labelled = require_labels or label_column in columns
    refuse_shared_columns(text_column, pair_column, label_column if labelled else None)
    needed = [("--text-column", text_column)]
    if pair_column is not None:
        needed.append(("--text-pair-column", pair_column))
    if labelled:
        needed.append(("--label-column", label_column))
    for flag, column in needed:
        if column not in columns:
            raise DataError(
                f"{spec} has no column {column!r}; its columns are {', '.join(columns)}",
                hint=f"pass {flag} with one of those names",
            )
    if len(table) == 0:  # a JSON/Parquet file or a saved split with no records
        raise DataError(f"{spec} has no rows", hint="pass a data set with at least one example")

    def where(index: int) -> str:
        if lines is not None:
            return f"line {lines[index]}"
        return f"line {index + row_base}" if row_base == 2 else f"row {index + row_base}"

    texts_raw = _values(table, text_column)
    pairs_raw = _values(table, pair_column) if pair_column is not None else None
    checks: list[tuple[str | None, list[Any] | None]] = [
        (text_column, texts_raw),
        (pair_column, pairs_raw),
    ]
    for name, values in checks:
        if values is not None and None in values:
            raise DataError(
                f"{spec} {where(values.index(None))}: empty {name!r}",
                hint="fill in or drop rows with missing values",
            )
        if values is not None and not _scalar_column(table, name):
            # a JSON object or list as a text cell became "{'a': 1}" through str()
            for index, value in enumerate(values):
                if isinstance(value, dict | list | tuple):
                    kind = "a JSON object" if isinstance(value, dict) else "a list"
                    raise DataError(
                        f"{spec} {where(index)}: the {name!r} cell holds {kind} "
                        f"({_short(value)}), not text",
                        hint=f"put a string in column {name!r} (flatten or serialise nested "
                        "values first)",
                    )
    names = class_names(table, label_column) if labelled else None
    labels: list[Any] | None = None
    if labelled:
        labels = _values(table, label_column)
        if None in labels:
            raise DataError(
                f"{spec} {where(labels.index(None))}: empty {label_column!r}",
                hint="fill in or drop rows with missing values",
            )
        if names is not None:
            unlabelled = sum(1 for v in labels if not 0 <= int(v) < len(names))
            if unlabelled and require_labels:
                raise DataError(
                    f"{spec} has {unlabelled} of {len(labels)} examples without a label (class "
                    f"id -1 of its ClassLabel column {label_column!r}, as in GLUE's test splits)",
                    hint="pass a labelled split (e.g. @validation), or use the set only where "
                    "labels are not needed (uqc predict, --ood)",
                )
            labels = None if unlabelled else [names[int(v)] for v in labels]
    fingerprint = content_fingerprint(
        table,
        text_column,
        pair_column,
        label_column if labels is not None else None,
        names if labels is not None else None,
    )
    return LabeledData(
        spec=spec,
        input_kind="text",
        texts=[str(t) for t in texts_raw],
        labels=labels,
        fingerprint=fingerprint,
        label_names=names if labels is not None else None,
        text_pairs=[str(t) for t in pairs_raw] if pairs_raw is not None else None,
        columns=[text_column] + ([pair_column] if pair_column is not None else []),
    )


def _scalar_column(table: Any, column: str | None) -> bool:
    """Whether a column's type holds only scalars (strings, numbers): no cell to check."""
    import datasets

    feature = table.features.get(column) if column is not None else None
    return isinstance(feature, datasets.Value | datasets.ClassLabel)


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def refuse_shared_columns(text: str, pair: str | None, label: str | None) -> None:
    """One column read as two things (a pair of a text with itself, a text that is also
    its label) is a mistyped flag: refused in one line, before any column is read."""
    roles = [("--text-column", text), ("--text-pair-column", pair), ("--label-column", label)]
    named = [(flag, column) for flag, column in roles if column is not None]
    for i, (flag, column) in enumerate(named):
        for other, same in named[i + 1 :]:
            if column == same:
                raise DataError(
                    f"{flag} and {other} both name the column {column!r}",
                    hint=f"pass a different column to {other}",
                )


def _values(table: Any, column: str) -> list[Any]:
    """A column as a Python list, through Arrow (`table[column]` formats row by row: about
    70x slower on 200k rows)."""
    import datasets

    feature = table.features.get(column)
    if not isinstance(feature, datasets.Value | datasets.ClassLabel):
        # e.g. a JSON column of mixed types (`Json`): Arrow holds it encoded, and only the
        # Python formatting decodes it ({"label": 1} and {"label": "pos"} -> 1, "pos")
        return list(table[column])
    values: list[Any] = table.with_format("arrow")[column].to_pylist()
    return values


FINGERPRINT_BATCH = 4096  # rows per Arrow batch while hashing


def _value_bytes(value: Any) -> bytes:
    """A label as hashed: ints (integral floats included, as labels read them) and strings
    are distinct (1 is a class index, "1" a class name); anything else by its repr."""
    if isinstance(value, bool):
        text = f"b{value}"
    elif isinstance(value, int):
        text = f"i{value}"
    elif isinstance(value, float) and value.is_integer():
        text = f"i{int(value)}"
    elif isinstance(value, str):
        text = f"s{value}"
    else:
        text = f"r{value!r}"
    return text.encode("utf-8")


def content_fingerprint(
    table: Any,
    text_column: str,
    pair_column: str | None,
    label_column: str | None,
    names: list[str] | None,
) -> str:
    """A hash of the examples' contents, in order: each text (as the model reads it, `str`),
    its pair text, and its label (a ClassLabel id as its class name; a ClassLabel column's
    class list is hashed too, since it orders the classes a new model adopts). Column names,
    file names and formats are not: the same rows from CSV, JSON Lines, Parquet, a
    save_to_disk folder or the Hub give the same fingerprint. Streams over the Arrow table
    in batches of FINGERPRINT_BATCH rows.
    """
    import hashlib

    digest = hashlib.sha256(b"uqc-text-v2")
    digest.update(b"P" if pair_column is not None else b"-")
    digest.update(b"L" if label_column is not None else b"-")
    if names is not None:
        digest.update(("\0".join(names) + "\1").encode("utf-8"))
    wanted = [c for c in (text_column, pair_column, label_column) if c is not None]
    for batch in table.select_columns(wanted).with_format("arrow").iter(FINGERPRINT_BATCH):
        texts = batch.column(text_column).to_pylist()
        pairs = batch.column(pair_column).to_pylist() if pair_column is not None else None
        labels = batch.column(label_column).to_pylist() if label_column is not None else None
        for i, text in enumerate(texts):
            parts = [str(text).encode("utf-8")]
            if pairs is not None:
                parts.append(str(pairs[i]).encode("utf-8"))
            if labels is not None:
                label = labels[i]
                parts.append(_value_bytes(names[int(label)] if names is not None else label))
            for part in parts:  # length-prefixed: no two rows hash alike by re-splitting
                digest.update(len(part).to_bytes(8, "little"))
                digest.update(part)
    return digest.hexdigest()[:32]


def _read_utf8(path: Path) -> str:
    """The text of a data file, or one line naming the first byte that is not UTF-8."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path} is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})",
            hint="re-save the file as UTF-8",
        ) from exc


def _check_csv_shape(path: Path) -> None:
    """Catch what `datasets` would report obscurely or not at all: encoding, empty files,
    rows whose field count differs from the header's (silently shifted columns)."""
    import csv
    import io

    text = _read_utf8(path)
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
