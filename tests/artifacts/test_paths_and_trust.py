"""What uqc trusts on disk: --force never deletes what is not ours, --out never lands in
another artifact or the working directory, paths read from files stay inside the artifact,
manifests are type-checked before use, and ONNX files uqc did not make are one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from uqcompress.artifacts import ArtifactWriter, OutputPlan, open_artifact, read_manifest
from uqcompress.errors import ArtifactError, IntegrityError, SchemaError

Cli = Callable[..., object]


def _plan(value: int = 1) -> OutputPlan:
    return OutputPlan(kind="eval", step="eval", config={"x": value}, id_config={"x": value})


def _write(dest: Path, plan: OutputPlan, force: bool = False) -> Path:
    with ArtifactWriter(dest, plan, force=force) as writer:
        (writer.dir / "data.txt").write_text(f"payload {plan.id}")
        (writer.dir / "sub").mkdir()
        (writer.dir / "sub" / "more.txt").write_text("more")
    return writer.artifact.path


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every entry under root: file bytes, or None for a folder."""
    return {
        p.relative_to(root).as_posix(): (None if p.is_dir() else p.read_bytes())
        for p in sorted(root.rglob("*"))
    }


def _one_error(result: object) -> str:
    code, out, err = result.code, result.out, result.err  # type: ignore[attr-defined]
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, err
    assert out == ""
    assert len(lines) == 1 and lines[0].startswith("error:") and "(fix: " in lines[0], err
    return str(lines[0])


def _rehash(artifact: Path) -> None:
    """Re-record every listed file's sha256 and size, as a forger would."""
    path = artifact / "manifest.json"
    raw = json.loads(path.read_text())
    for rel in raw["files"]:
        data = (artifact / rel).read_bytes()
        raw["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    path.write_text(json.dumps(raw))


def _edit_manifest(artifact: Path, edit: Callable[[dict], None]) -> None:  # type: ignore[type-arg]
    path = artifact / "manifest.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


# -- item 1: --force ------------------------------------------------------------------------


def test_force_never_replaces_a_folder_with_a_foreign_manifest(
    cli: Cli, tmp_path: Path, tiny_vit_artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    site = tmp_path / "site"
    (site / "src").mkdir(parents=True)
    (site / "manifest.json").write_text('{"name":"app"}\n')
    (site / "index.html").write_text("x\n")
    before = _snapshot(site)
    result = cli(
        "eval", tiny_vit_artifact, "--data", "builtin:digits@test", "--out", "site", "--force"
    )
    assert "--force only replaces artifacts" in _one_error(result)
    assert _snapshot(site) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifacts", "site"] or sorted(
        p.name for p in tmp_path.iterdir()
    ) == ["site"]


@pytest.mark.parametrize("extra", ["notes.txt", "sub/notes.txt", "empty-folder/"])
def test_force_never_replaces_an_artifact_holding_other_files(tmp_path: Path, extra: str) -> None:
    dest = _write(tmp_path / "a", _plan(1))
    target = dest / extra
    if extra.endswith("/"):
        target.mkdir()
    else:
        target.write_text("mine")
    before = _snapshot(dest)
    with pytest.raises(ArtifactError, match=f"holds {extra.rstrip('/')}, which its manifest"):
        _write(dest, _plan(2), force=True)
    assert _snapshot(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_force_replaces_an_artifact_even_a_damaged_one(tmp_path: Path) -> None:
    dest = _write(tmp_path / "a", _plan(1))
    (dest / "data.txt").write_text("tampered")
    (dest / "sub" / "more.txt").unlink()
    _write(dest, _plan(2), force=True)
    assert open_artifact(dest).id == _plan(2).id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no .old-* left behind


def test_force_rechecks_the_folder_when_installing(tmp_path: Path) -> None:
    dest = _write(tmp_path / "a", _plan(1))
    with (
        pytest.raises(ArtifactError, match="which its manifest does not list"),
        ArtifactWriter(dest, _plan(2), force=True) as writer,
    ):
        (writer.dir / "data.txt").write_text("new")
        (dest / "added-meanwhile.txt").write_text("mine")  # the user writes while we run
    assert (dest / "added-meanwhile.txt").read_text() == "mine"
    assert open_artifact(dest, verify=False).id == _plan(1).id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_a_failed_final_rename_puts_the_previous_artifact_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = _write(tmp_path / "a", _plan(1))
    before = _snapshot(dest)
    real_rename = os.rename

    def failing_rename(src: object, dst: object) -> None:
        if ".tmp-" in Path(str(src)).name:  # the new artifact's rename into place
            raise OSError(28, "No space left on device")
        real_rename(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(ArtifactError, match="the previous artifact is kept"):
        _write(dest, _plan(2), force=True)
    monkeypatch.undo()
    assert _snapshot(dest) == before
    assert open_artifact(dest).id == _plan(1).id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no .a.old-*, no .a.tmp-*


# -- item 2: where --out may point ----------------------------------------------------------


def test_out_inside_another_artifact_is_refused(
    cli: Cli, tmp_path: Path, tiny_vit_artifact: Path
) -> None:
    other = _write(tmp_path / "other", _plan(1))
    before = _snapshot(other)
    result = cli("eval", tiny_vit_artifact, "--data", "builtin:digits@test", "--out", other / "sub")
    assert "is inside the artifact" in _one_error(result)
    assert _snapshot(other) == before
    open_artifact(other)  # still verifies


@pytest.mark.parametrize("force", [False, True])
def test_out_containing_an_artifact_is_refused(cli: Cli, tmp_path: Path, force: bool) -> None:
    inner = _write(tmp_path / "folder" / "inner", _plan(1))
    before = _snapshot(tmp_path / "folder")
    args = ["init", "--family", "vit", "--num-labels", "3", "--out", tmp_path / "folder"]
    result = cli(*args, *(["--force"] if force else []))
    needle = "--force only replaces artifacts" if force else "already holds files"
    assert needle in _one_error(result)
    assert _snapshot(tmp_path / "folder") == before
    open_artifact(inner)


def test_default_location_inside_an_artifact_is_refused(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = _write(tmp_path / "other", _plan(1))
    monkeypatch.setenv("UQC_ARTIFACTS", str(other / "artifacts"))
    result = cli("init", "--family", "vit", "--num-labels", "3")
    assert "the output folder" in _one_error(result)
    assert sorted(p.name for p in other.iterdir()) == ["data.txt", "manifest.json", "sub"]


@pytest.mark.parametrize("out", [".", "..", "../.."])
def test_out_at_or_above_the_working_directory_is_refused(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str
) -> None:
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    result = cli("init", "--family", "vit", "--num-labels", "3", "--out", out, "--force")
    assert "is the working directory or a folder that contains it" in _one_error(result)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "a",
        "a/b",
    ]


def test_out_that_is_a_symlink_is_refused(cli: Cli, tmp_path: Path) -> None:
    target = _write(tmp_path / "real", _plan(1))
    (tmp_path / "link").symlink_to(target)
    before = _snapshot(target)
    result = cli("init", "--family", "vit", "--num-labels", "3", "--out", tmp_path / "link")
    assert "is a symlink" in _one_error(result)
    assert _snapshot(target) == before


# -- item 3: paths from files stay inside; verify refuses non-regular entries ---------------


def test_verify_refuses_a_symlink_even_to_identical_bytes(cli: Cli, tmp_path: Path) -> None:
    art = _write(tmp_path / "a", _plan(1))
    outside = tmp_path / "outside.txt"
    shutil.copy(art / "data.txt", outside)
    (art / "data.txt").unlink()
    (art / "data.txt").symlink_to(outside)
    assert "data.txt in" in _one_error(cli("verify", art))
    with pytest.raises(IntegrityError, match="is a symlink"):
        open_artifact(art)


def test_verify_refuses_a_fifo_without_blocking(cli: Cli, tmp_path: Path) -> None:
    art = _write(tmp_path / "a", _plan(1))
    os.mkfifo(art / "sub" / "pipe")
    assert "sub/pipe in" in _one_error(cli("verify", art))
    (art / "sub" / "pipe").unlink()
    (art / "sub" / "more.txt").unlink()
    os.mkfifo(art / "sub" / "more.txt")  # a listed name: hashing it would block forever
    assert "not a regular file" in _one_error(cli("verify", art))


def test_a_manifest_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    art = _write(tmp_path / "a", _plan(1))
    real = tmp_path / "real-manifest.json"
    shutil.move(str(art / "manifest.json"), real)
    (art / "manifest.json").symlink_to(real)
    with pytest.raises(IntegrityError, match="not a regular file"):
        read_manifest(art)


# -- item 4: manifests are type-checked before use ------------------------------------------


def _deep(depth: int) -> object:
    value: object = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda m: m.update(kind=["eval"]), "kind must be a string, not a list"),
        (lambda m: m.update(kind_version=True), "kind_version must be an integer, not a boolean"),
        (lambda m: m.update(schema_version="1"), "schema_version must be an integer"),
        (lambda m: m.update(id=7), "id must be a string"),
        (lambda m: m.update(config=[]), "config must be an object, not a list"),
        (lambda m: m.update(inputs={}), "inputs must be a list"),
        (lambda m: m.update(inputs=["x"]), "inputs[0] must be an object"),
        (lambda m: m.update(inputs=[{"role": "m", "path": "x"}]), "inputs[0] is missing id"),
        (
            lambda m: m.update(inputs=[{"role": "m", "path": "x", "id": "y", "z": 1}]),
            "inputs[0] has unknown keys ['z']",
        ),
        (
            lambda m: m["files"]["data.txt"].update(bytes="many"),
            "files['data.txt'].bytes must be an integer, not a string",
        ),
        (lambda m: m["files"]["data.txt"].update(bytes=-1), "bytes is negative"),
        (lambda m: m["files"].update({"data.txt": "x"}), "files['data.txt'] must be an object"),
        (lambda m: m.update(warnings=[1]), "warnings[0] must be a string"),
        (lambda m: m.update(data=[3]), "data[0] must be an object"),
        (lambda m: m["summary"].update(members="3"), "summary.members must be an integer"),
        (lambda m: m["config"].update(deep=_deep(200)), "nests deeper than 64 levels"),
    ],
)
def test_wrong_types_are_one_schema_error(tmp_path: Path, edit: Callable, needle: str) -> None:  # type: ignore[type-arg]
    art = _write(tmp_path / "a", _plan(1))
    _edit_manifest(art, edit)
    with pytest.raises(SchemaError) as info:
        open_artifact(art)
    assert needle in info.value.message
    assert "\n" not in info.value.message


def test_cli_on_a_list_kind_and_a_100k_deep_manifest(cli: Cli, tmp_path: Path) -> None:
    art = _write(tmp_path / "a", _plan(1))
    _edit_manifest(art, lambda m: m.update(kind=["eval"]))
    for command in ("verify", "inspect"):
        assert "kind must be a string" in _one_error(cli(command, art))
    text = (art / "manifest.json").read_text()
    depth = 100_000
    (art / "manifest.json").write_text(
        text.replace('"config": {', '"config": {"deep": ' + "[" * depth + "]" * depth + ", ", 1)
    )
    for command in ("verify", "inspect"):
        assert "nests too deeply" in _one_error(cli(command, art))


# -- items 3 and 13: ONNX files -------------------------------------------------------------


@pytest.fixture(scope="module")
def text_onnx(tmp_path_factory: pytest.TempPathFactory, tiny_bert_artifact: Path) -> Path:
    from uqcompress.steps import export

    out = tmp_path_factory.mktemp("issue14") / "bert-onnx"
    return export.run(tiny_bert_artifact, export.ExportConfig(format="onnx"), out).artifact.path


def _set_meta(onnx_path: Path, changes: dict[str, str | None]) -> None:
    import onnx

    model = onnx.load(str(onnx_path))
    props = {p.key: p.value for p in model.metadata_props}
    for key, value in changes.items():
        if value is None:
            props.pop(key, None)
        else:
            props[key] = value
    del model.metadata_props[:]
    for key, value in props.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(onnx_path))


def _meta(onnx_path: Path) -> dict[str, str]:
    import onnx

    return {p.key: p.value for p in onnx.load(str(onnx_path)).metadata_props}


def _copy(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    return dest


def test_tokenizer_path_outside_the_artifact_is_refused(
    cli: Cli, tmp_path: Path, text_onnx: Path
) -> None:
    art = _copy(text_onnx, tmp_path / "x")
    (tmp_path / "outside").mkdir()
    shutil.copy(art / "tokenizer.json", tmp_path / "outside" / "tokenizer.json")
    preprocessing = json.loads(_meta(art / "model.onnx")["uqc.preprocessing"])
    preprocessing["tokenizer"] = "../outside/tokenizer.json"
    _set_meta(art / "model.onnx", {"uqc.preprocessing": json.dumps(preprocessing)})
    _rehash(art)
    (tmp_path / "d.csv").write_text("text\ngood movie\n")
    assert "outside the artifact directory" in _one_error(cli("verify", art))
    result = cli("predict", art, "--data", tmp_path / "d.csv")
    assert "'../outside/tokenizer.json', which is outside" in _one_error(result)


def test_tokenizer_symlink_out_of_the_artifact_is_refused(
    cli: Cli, tmp_path: Path, text_onnx: Path
) -> None:
    art = _copy(text_onnx, tmp_path / "x")
    shutil.move(str(art / "tokenizer.json"), tmp_path / "tokenizer.json")
    (art / "tokenizer.json").symlink_to(tmp_path / "tokenizer.json")
    assert "tokenizer.json in" in _one_error(cli("verify", art))
    from uqcompress.export.runtime import Predictor

    with pytest.raises(IntegrityError, match="outside the artifact"):
        Predictor(art)  # the Python API on the folder resolves the link and refuses it too


@pytest.mark.parametrize("location", ["../outside/w.data", "ABSOLUTE"])
def test_external_data_outside_the_model_folder_is_refused(
    cli: Cli, tmp_path: Path, vit_onnx: Path, location: str
) -> None:
    import onnx

    from uqcompress.export.runtime import Predictor

    (tmp_path / "outside").mkdir()
    model = onnx.load(str(vit_onnx / "model.onnx"))
    onnx.save(
        model,
        str(tmp_path / "outside" / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="w.data",
        size_threshold=256,
    )
    Predictor(tmp_path / "outside" / "model.onnx")  # loads where the data is beside it
    where = str(tmp_path / "outside" / "w.data") if location == "ABSOLUTE" else location
    external = onnx.load(str(tmp_path / "outside" / "model.onnx"), load_external_data=False)
    moved = 0
    for tensor in external.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value, moved = where, moved + 1
    assert moved > 0
    art = _copy(vit_onnx, tmp_path / "art")
    onnx.save(external, str(art / "model.onnx"))
    _rehash(art)
    with pytest.raises(IntegrityError, match="external data"):
        Predictor(art / "model.onnx")
    assert "external data" in _one_error(cli("verify", art))
    result = cli("predict", art, "--data", "builtin:digits@test")
    assert "external data" in _one_error(result)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"uqc.labels": None}, "no uqc.labels"),
        ({"uqc.input_kind": None}, "no uqc.input_kind"),
        ({"uqc.input_names": None}, "no uqc.input_names"),
        ({"uqc.members": None}, "no uqc.members"),
        ({"uqc.preprocessing": None}, "no uqc.preprocessing"),
        ({"uqc.labels": "[1, 2]"}, "uqc.labels must be a non-empty list"),
        ({"uqc.labels": "{not json"}, "uqc.labels is not valid JSON"),
        ({"uqc.labels": "[" * 100_000}, "uqc.labels is not valid JSON"),
        ({"uqc.input_kind": "audio"}, "'audio', not 'text' or 'image'"),
        ({"uqc.input_names": '["x"]'}, "must list distinct inputs out of pixel_values"),
        ({"uqc.members": "two"}, "'two', not a positive integer"),
        ({"uqc.preprocessing": '{"image_size": 8}'}, "has no 'num_channels'"),
        (
            {"uqc.noise": '{"samples": 2}', "uqc.input_names": '["pixel_values", "noise"]'},
            "uqc.noise has no 'steps'",
        ),
        ({"uqc.noise": '{"samples": 2}'}, "(noise included)"),
        ({"uqc.input_names": '["pixel_values", "noise"]'}, "inputs out of pixel_values for"),
        ({"uqc.calibration": '{"abstain": {}}'}, "uqc.calibration is malformed"),
        ({"uqc.labels": '["a", "b"]'}, "returns 10 classes, the metadata names 2"),
        ({"uqc.members": "3"}, "returns 1 members, the metadata says 3"),
    ],
)
def test_partial_or_wrong_uqc_metadata_is_one_line(
    cli: Cli, tmp_path: Path, vit_onnx: Path, changes: dict[str, str | None], needle: str
) -> None:
    from uqcompress.export.runtime import Predictor

    art = _copy(vit_onnx, tmp_path / "art")
    _set_meta(art / "model.onnx", changes)
    with pytest.raises(ArtifactError) as info:
        Predictor(art / "model.onnx")
    assert needle in info.value.message and "uqc export contract" in info.value.message
    _rehash(art)
    assert needle in _one_error(cli("predict", art, "--data", "builtin:digits@test"))


def _foreign_graph(path: Path, meta: dict[str, str], input_name: str = "x") -> Path:
    """A graph uqc did not make: one float input, the four contract outputs."""
    from onnx import TensorProto, helper, save

    nodes = [
        helper.make_node("ReduceMean", [input_name], ["probs"], axes=[2, 3], keepdims=0),
        helper.make_node("Unsqueeze", ["probs", "one"], ["member_logits"]),
        helper.make_node("ReduceSum", ["probs", "one"], ["entropy"], keepdims=0),
        helper.make_node("ReduceMax", ["probs"], ["mutual_info"], axes=[1], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "foreign",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["b", 1, 8, 8])],
        [
            helper.make_tensor_value_info("member_logits", TensorProto.FLOAT, ["b", 1, 1]),
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["b", 1]),
            helper.make_tensor_value_info("entropy", TensorProto.FLOAT, ["b"]),
            helper.make_tensor_value_info("mutual_info", TensorProto.FLOAT, ["b"]),
        ],
        initializer=[helper.make_tensor("one", TensorProto.INT64, [1], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in meta.items():
        model.metadata_props.add(key=key, value=value)
    save(model, str(path))
    return path


def test_full_metadata_on_a_graph_with_other_inputs_is_one_line(
    cli: Cli, tmp_path: Path, vit_onnx: Path
) -> None:
    from uqcompress.export.runtime import Predictor

    meta = _meta(vit_onnx / "model.onnx")
    meta["uqc.labels"] = '["only"]'
    foreign = _foreign_graph(tmp_path / "foreign.onnx", meta)
    with pytest.raises(ArtifactError, match=r"takes inputs \['x'\], the metadata says"):
        Predictor(foreign)
    art = _copy(vit_onnx, tmp_path / "art")
    shutil.copy(foreign, art / "model.onnx")
    _rehash(art)
    result = cli("predict", art, "--data", "builtin:digits@test")
    assert "takes inputs ['x']" in _one_error(result)
    # the same graph with the contract's input name runs: the check is not over-strict
    fits = _foreign_graph(tmp_path / "fits.onnx", meta, input_name="pixel_values")
    assert Predictor(fits).members == 1


def test_text_metadata_on_an_image_graph_is_one_line(tmp_path: Path, vit_onnx: Path) -> None:
    from uqcompress.export.runtime import Predictor

    art = _copy(vit_onnx, tmp_path / "art")
    _set_meta(
        art / "model.onnx",
        {
            "uqc.input_kind": "text",
            "uqc.input_names": '["input_ids", "attention_mask"]',
            "uqc.preprocessing": '{"tokenizer": "tokenizer.json", "max_length": 8}',
        },
    )
    with pytest.raises(ArtifactError, match="the graph takes inputs"):
        Predictor(art)


def test_a_file_that_is_not_onnx_is_one_line(tmp_path: Path) -> None:
    from uqcompress.export.runtime import Predictor

    (tmp_path / "model.onnx").write_bytes(b"\x08\x01garbage that is not a protobuf")
    with pytest.raises(ArtifactError, match=r"model\.onnx"):
        Predictor(tmp_path)
