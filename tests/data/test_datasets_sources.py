"""`save_to_disk` folders, `hf:` specs read from a local datasets cache (offline), ClassLabel
names, text pair columns, and content fingerprints equal across formats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from uqcompress.data import load_data, parse_spec
from uqcompress.data.labels import map_labels
from uqcompress.errors import DataError

ROWS = [
    ("a great film", "the acting was fun", "pos"),
    ("awful and boring", "it was dull", "neg"),
    ("fun", "really the best", "pos"),
    ("poor story", "terrible acting", "neg"),
]
RECORDS = [{"sentence1": a, "sentence2": b, "label": y} for a, b, y in ROWS]
PAIR = {"text_column": "sentence1", "text_pair_column": "sentence2"}


def _formats(root: Path, records: list[dict[str, Any]]) -> dict[str, str]:
    """The same rows as CSV, JSON Lines, Parquet and a save_to_disk folder."""
    import csv

    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    with (root / "d.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    (root / "d.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    pq.write_table(pa.Table.from_pylist(records), root / "d.parquet")
    datasets.disable_progress_bars()
    datasets.Dataset.from_list(records).save_to_disk(str(root / "saved"))
    return {
        "csv": str(root / "d.csv"),
        "jsonl": str(root / "d.jsonl"),
        "parquet": str(root / "d.parquet"),
        "disk": str(root / "saved"),
    }


def _class_label_dataset(names: list[str], records: list[dict[str, Any]]) -> Any:
    import datasets

    features = datasets.Features(
        {
            "sentence1": datasets.Value("string"),
            "sentence2": datasets.Value("string"),
            "label": datasets.ClassLabel(names=names),
        }
    )
    rows = [{**r, "label": names.index(r["label"]) if r["label"] in names else -1} for r in records]
    return datasets.Dataset.from_list(rows, features=features)


def test_save_to_disk_folder_reads_like_the_files_with_one_fingerprint(tmp_path: Path) -> None:
    specs = _formats(tmp_path, RECORDS)
    assert parse_spec(specs["disk"]).kind == "disk"
    read = {name: load_data(spec, **PAIR) for name, spec in specs.items()}
    for data in read.values():
        assert data.texts == [a for a, _, _ in ROWS]
        assert data.text_pairs == [b for _, b, _ in ROWS]
        assert data.labels == [y for _, _, y in ROWS]
        assert data.columns == ["sentence1", "sentence2"]
    assert len({d.fingerprint for d in read.values()}) == 1
    # single texts, and the same rows with one pair text edited, are other contents
    single = load_data(specs["disk"], text_column="sentence1")
    assert single.text_pairs is None and single.fingerprint != read["disk"].fingerprint
    edited = [dict(r) for r in RECORDS]
    edited[2]["sentence2"] = "really the worst"
    other = load_data(_formats(tmp_path / "edited", edited)["disk"], **PAIR)
    assert other.fingerprint != read["disk"].fingerprint
    # text and pair swapped: the same strings, another example
    swapped = load_data(specs["csv"], text_column="sentence2", text_pair_column="sentence1")
    assert swapped.fingerprint != read["csv"].fingerprint


def test_fingerprint_ignores_column_names_but_not_label_types(tmp_path: Path) -> None:
    renamed = [{"review": r["sentence1"], "y": r["label"]} for r in RECORDS]
    a = load_data(_formats(tmp_path / "a", renamed)["parquet"], "review", "y")
    b = load_data(_formats(tmp_path / "b", RECORDS)["csv"], "sentence1", "label")
    assert a.fingerprint == b.fingerprint
    ints = [{"text": r["sentence1"], "label": i % 2} for i, r in enumerate(RECORDS)]
    floats = [{"text": r["sentence1"], "label": float(i % 2)} for i, r in enumerate(RECORDS)]
    strings = [{"text": r["sentence1"], "label": str(i % 2)} for i, r in enumerate(RECORDS)]
    as_int = load_data(_formats(tmp_path / "i", ints)["csv"])
    as_float = load_data(_formats(tmp_path / "f", floats)["jsonl"])
    as_string = load_data(_formats(tmp_path / "s", strings)["jsonl"])
    assert as_int.labels == [0, 1, 0, 1] and as_string.labels == ["0", "1", "0", "1"]
    # integral floats are read as the ints they name; "1" is a class name, 1 a class index
    assert as_int.fingerprint == as_float.fingerprint != as_string.fingerprint


def test_class_label_keeps_its_names_in_its_order(tmp_path: Path) -> None:
    names = ["pos", "neg"]  # not sorted: a new model adopts this order
    _class_label_dataset(names, RECORDS).save_to_disk(str(tmp_path / "cl"))
    data = load_data(str(tmp_path / "cl"), **PAIR)
    assert data.labels == [y for _, _, y in ROWS]
    assert data.label_names == names
    adopted = map_labels(data, ["LABEL_0", "LABEL_1"], placeholder=True)
    assert adopted.adopted_labels == ["pos", "neg"]
    assert adopted.ids.tolist() == [0, 1, 0, 1]
    named = map_labels(data, ["neg", "pos"], placeholder=False)  # by name, not by class id
    assert named.ids.tolist() == [1, 0, 1, 0]
    # the class list is part of the contents; the rows as plain strings are not the same set
    plain = load_data(_formats(tmp_path / "plain", RECORDS)["disk"], **PAIR)
    assert plain.label_names is None and plain.fingerprint != data.fingerprint


def test_class_label_without_labels_is_refused_where_labels_are_needed(tmp_path: Path) -> None:
    unlabelled = [{**r, "label": "?"} for r in RECORDS]  # GLUE's test splits: class id -1
    _class_label_dataset(["neg", "pos"], unlabelled).save_to_disk(str(tmp_path / "test"))
    with pytest.raises(DataError, match=r"4 of 4 examples without a label \(class id -1"):
        load_data(str(tmp_path / "test"), **PAIR)
    data = load_data(str(tmp_path / "test"), require_labels=False, **PAIR)
    assert data.labels is None and data.text_pairs == [b for _, b, _ in ROWS]


def test_bad_save_to_disk_folders(tmp_path: Path) -> None:
    import datasets

    split = datasets.Dataset.from_list(RECORDS)
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(DataError, match=r"DatasetDict saved with save_to_disk \(splits: test, "):
        load_data(str(tmp_path / "dict"))
    assert len(load_data(str(tmp_path / "dict" / "test"), **PAIR)) == 4
    broken = tmp_path / "broken"
    split.save_to_disk(str(broken))
    for shard in broken.glob("*.arrow"):
        shard.write_bytes(b"not arrow")
    with pytest.raises(DataError, match=r"cannot read .*broken as a datasets save_to_disk"):
        load_data(str(broken), **PAIR)


@pytest.mark.parametrize("where", ["relative", "absolute", "symlink"])
def test_save_to_disk_folder_cannot_name_files_outside_it(tmp_path: Path, where: str) -> None:
    """A state.json whose _data_files leave the folder is refused before datasets reads them
    (it would read them: eval reported the metrics of the outside file)."""
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset.from_list(RECORDS).save_to_disk(str(tmp_path / "outside"))
    datasets.Dataset.from_list(RECORDS[:1]).save_to_disk(str(tmp_path / "saved"))
    shard = next((tmp_path / "outside").glob("*.arrow"))
    state_path = tmp_path / "saved" / "state.json"
    state = json.loads(state_path.read_text())
    if where == "relative":
        state["_data_files"] = [{"filename": f"../outside/{shard.name}"}]
    elif where == "absolute":
        state["_data_files"] = [{"filename": str(shard)}]
    else:
        (tmp_path / "saved" / "link.arrow").symlink_to(shard)
        state["_data_files"] = [{"filename": "link.arrow"}]
    state_path.write_text(json.dumps(state))
    with pytest.raises(DataError, match=r"state\.json names (an absolute path )?'") as caught:
        load_data(str(tmp_path / "saved"), **PAIR)
    assert "outside the data folder" in caught.value.message or where == "absolute"
    outside_state = tmp_path / "outside" / "state.json"  # the state.json itself a link out
    state_path.unlink()
    state_path.symlink_to(outside_state)
    with pytest.raises(DataError, match=r"names 'state\.json', which is outside the data folder"):
        load_data(str(tmp_path / "saved"), **PAIR)
    state_path.unlink()
    state["_data_files"] = "x.arrow"
    state_path.write_text(json.dumps(state))
    with pytest.raises(DataError, match=r"save_to_disk directory .*no valid _data_files list"):
        load_data(str(tmp_path / "saved"), **PAIR)


def test_missing_pair_column_names_the_columns(tmp_path: Path) -> None:
    specs = _formats(tmp_path, RECORDS)
    blank = tmp_path / "blank.csv"
    blank.write_text("sentence1,sentence2,label\na,b,pos\nc,,neg\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"blank\.csv line 3: empty 'sentence2'"):
        load_data(str(blank), **PAIR)
    with pytest.raises(DataError, match="has no column 'hypothesis'; its columns are sentence1"):
        load_data(specs["disk"], text_column="sentence1", text_pair_column="hypothesis")
    with pytest.raises(DataError, match="reads text pairs; builtin:digits holds images"):
        load_data("builtin:digits", text_pair_column="sentence2")


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (
            {"text_column": "sentence1", "text_pair_column": "sentence1"},
            "--text-column and --text-pair-column both name the column 'sentence1'",
        ),
        (
            {"text_column": "label"},
            "--text-column and --label-column both name the column 'label'",
        ),
        (
            {"text_column": "sentence1", "text_pair_column": "label"},
            "--text-pair-column and --label-column both name the column 'label'",
        ),
    ],
)
def test_one_column_cannot_be_read_as_two(
    tmp_path: Path, columns: dict[str, str], message: str
) -> None:
    """A text paired with itself gave pyarrow's 'Field exists 2 times' traceback."""
    specs = _formats(tmp_path, RECORDS)
    for spec in specs.values():
        with pytest.raises(DataError) as caught:
            load_data(spec, **columns)
        assert caught.value.message == message


def _hub_cache(root: Path, records: list[dict[str, Any]]) -> Path:
    """A datasets cache holding `uqc-test/tiny-pairs` (configuration `plain`, splits train
    and test), as `load_dataset` leaves it after a download: built offline from a local file
    with the packaged JSON builder, then moved under the Hub id's cache folder."""
    import datasets
    from datasets.packaged_modules.json.json import Json

    source = root / "train.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    cache = root / "hf-cache"
    features = _class_label_dataset(["neg", "pos"], records[:1]).features
    builder = Json(
        cache_dir=str(cache),
        dataset_name="tiny-pairs",
        config_name="plain",
        config_id="plain",
        data_files={"train": str(source), "test": str(source)},
        features=features,
        hash="0123456789abcdef",
    )
    datasets.disable_progress_bars()
    builder.download_and_prepare()
    (cache / "tiny-pairs").rename(cache / "uqc-test___tiny-pairs")
    return cache


def test_hub_spec_reads_the_local_cache_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets

    assert datasets.config.HF_HUB_OFFLINE  # conftest: nothing may reach the network
    cache = _hub_cache(tmp_path, RECORDS)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    spec = "hf:uqc-test/tiny-pairs/plain@train"
    parsed = parse_spec(spec)
    assert (parsed.kind, parsed.name, parsed.config, parsed.split) == (
        "hf",
        "uqc-test/tiny-pairs",
        "plain",
        "train",
    )
    data = load_data(spec, **PAIR)
    assert data.name == "plain"
    assert data.texts == [a for a, _, _ in ROWS] and data.text_pairs == [b for _, b, _ in ROWS]
    assert data.labels == [y for _, _, y in ROWS] and data.label_names == ["neg", "pos"]
    # the configuration can be left out when the cache holds one; the same contents
    assert load_data("hf:uqc-test/tiny-pairs@test", **PAIR).fingerprint == data.fingerprint
    # a save_to_disk copy of the same rows and ClassLabel is the same data set
    _class_label_dataset(["neg", "pos"], RECORDS).save_to_disk(str(tmp_path / "copy"))
    assert load_data(str(tmp_path / "copy"), **PAIR).fingerprint == data.fingerprint


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("hf:uqc-test/not-there@train", "is not in the local datasets cache"),
        ("hf:uqc-test/tiny-pairs/other@train", "Couldn't find cache for uqc-test/tiny-pairs"),
        ("hf:uqc-test/tiny-pairs/plain@dev", 'Unknown split "dev"'),
        ("hf:uqc-test/tiny-pairs", "names no split"),
        ("hf:a//b@train", "cannot parse the Hub data spec"),
        ("hf:a/b/c/d@train", "cannot parse the Hub data spec"),
    ],
)
def test_bad_hub_specs_are_one_line(
    spec: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_CACHE", str(_hub_cache(tmp_path, RECORDS)))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=message) as caught:
        load_data(spec, **PAIR)
    assert "\n" not in str(caught.value) and caught.value.hint


def test_unknown_hub_data_set_offline_says_it_cannot_be_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(DataError) as caught:
        load_data("hf:uqc-test/not-there/cfg@train")
    assert "cannot be fetched: offline mode is set" in str(caught.value)
    assert "hf:ORG/NAME/CONFIG@SPLIT" in caught.value.hint


def test_a_dry_run_reads_the_hub_cache_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets

    from uqcompress.runtime.planning import planning

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # as if online
    monkeypatch.setenv("HF_DATASETS_CACHE", str(_hub_cache(tmp_path, RECORDS)))
    monkeypatch.chdir(tmp_path)
    with planning():
        assert len(load_data("hf:uqc-test/tiny-pairs/plain@train", **PAIR)) == 4
        with pytest.raises(DataError, match="cannot be fetched: a dry run downloads nothing"):
            load_data("hf:uqc-test/not-there@train")
    assert datasets.config.HF_HUB_OFFLINE is False  # restored
