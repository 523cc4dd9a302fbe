"""`uqc export`: the ONNX graph follows the deployment contract and passes the parity gate;
a perturbed graph fails it and leaves nothing behind; safetensors loads with transformers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from uqcompress.artifacts import open_artifact
from uqcompress.export import onnx as uqc_onnx
from uqcompress.models.loading import load_model, resolve_model_source

TRACE_BATCH = 2  # the batch size of the example the exporter traces with
TRACE_LENGTH = 8  # ... and its sequence length (text)


def _meta(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def _dims(value_info: onnx.ValueInfoProto) -> list[onnx.TensorShapeProto.Dimension]:
    return list(value_info.type.tensor_type.shape.dim)


def _is_dynamic(dim: onnx.TensorShapeProto.Dimension) -> bool:
    return dim.HasField("dim_param") and bool(dim.dim_param) and not dim.HasField("dim_value")


def _check_contract(artifact_path: Path, source: Path, input_kind: str) -> onnx.ModelProto:
    artifact = open_artifact(artifact_path)
    assert artifact.kind == "onnx"
    files = {p.name for p in artifact_path.iterdir()}
    expected = {"manifest.json", "model.onnx", "parity.json", "README.md"}  # README: the card
    expected.add("config.json")  # with the processor's files below: for Hugging Face loaders
    if input_kind == "text":
        expected |= {"tokenizer.json", "tokenizer_config.json"}
    else:
        expected.add("preprocessor_config.json")
    assert files == expected
    assert not list(artifact_path.rglob("*.onnx.data"))
    assert not list(artifact_path.rglob("*.data"))

    model = onnx.load(str(artifact_path / "model.onnx"))
    onnx.checker.check_model(model)
    assert [o.name for o in model.graph.output] == [
        "member_logits",
        "probs",
        "entropy",
        "mutual_info",
        "logits",  # what Hugging Face loaders read (export/contract.LOGITS_OUTPUT)
    ]
    names = (
        ["input_ids", "attention_mask", "token_type_ids"]
        if input_kind == "text"
        else ["pixel_values"]
    )
    assert [i.name for i in model.graph.input] == names
    for value_info in model.graph.input:
        dims = _dims(value_info)
        assert _is_dynamic(dims[0]), f"{value_info.name}: batch axis is fixed"
        if input_kind == "text":
            assert len(dims) == 2
            assert _is_dynamic(dims[1]), f"{value_info.name}: sequence axis is fixed"
        else:
            assert len(dims) == 4
            assert all(d.HasField("dim_value") for d in dims[1:])
    for value_info in model.graph.output:
        assert _is_dynamic(_dims(value_info)[0]), f"{value_info.name}: batch axis is fixed"

    loaded = load_model(resolve_model_source(source))
    classes = len(loaded.labels)
    member_dims = _dims(model.graph.output[0])
    assert [d.dim_value for d in member_dims[1:]] == [1, classes]  # [B, M=1, C]

    meta = _meta(model)
    assert json.loads(meta["uqc.labels"]) == loaded.labels
    assert meta["uqc.input_kind"] == input_kind
    assert meta["uqc.members"] == "1"
    assert meta["uqc.source_id"] == open_artifact(source).id
    assert json.loads(meta["uqc.input_names"]) == names

    ops = {node.op_type for node in model.graph.node}
    assert "Einsum" not in ops
    assert "Softmax" in ops  # the uncertainty outputs are computed in the graph
    return model


def _parity(artifact_path: Path) -> dict[str, Any]:
    return json.loads((artifact_path / "parity.json").read_text())


def _check_parity_report(parity: dict[str, Any]) -> None:
    assert parity["passed"] is True
    assert 0 <= parity["max_abs_diff"]["probs"] <= 1e-4
    assert set(parity["max_abs_diff"]) == {
        "member_logits",
        "probs",
        "entropy",
        "mutual_info",
        "logits",
    }
    assert parity["max_abs_diff"]["mutual_info"] <= 1e-6  # M = 1
    assert parity["argmax_agreement"] == 1
    assert parity["batch_size"] != TRACE_BATCH
    assert parity["atol"] == pytest.approx(1e-4)


# --------------------------------------------------------------------------- contract


def test_bert_export_follows_the_contract(bert_onnx: Path, trained_bert_artifact: Path) -> None:
    _check_contract(bert_onnx, trained_bert_artifact, "text")
    parity = _parity(bert_onnx)
    _check_parity_report(parity)
    assert parity["padded_batches"] >= 1
    assert parity["examples"] >= 40  # the 40 rows of --data were checked
    lengths = [int(shape.split("x")[1]) for shape in parity["shapes"]]
    batches = [int(shape.split("x")[0]) for shape in parity["shapes"]]
    assert any(length != TRACE_LENGTH for length in lengths)
    assert len(set(lengths)) > 1
    assert any(b != TRACE_BATCH for b in batches)
    summary = open_artifact(bert_onnx).manifest.summary
    assert summary["input_kind"] == "text"
    assert summary["labels"] == ["neg", "pos"]
    assert summary["parity_max_abs_probs"] == parity["max_abs_diff"]["probs"]


def test_vit_export_follows_the_contract(vit_onnx: Path, tiny_vit_artifact: Path) -> None:
    _check_contract(vit_onnx, tiny_vit_artifact, "image")
    parity = _parity(vit_onnx)
    _check_parity_report(parity)
    assert parity["padded_batches"] == 0  # images never pad
    assert parity["examples"] > 12  # real digits, not only the synthetic images
    assert all(shape.split("x")[1:] == ["1", "8", "8"] for shape in parity["shapes"])
    assert "builtin:digits@test" in open_artifact(vit_onnx).manifest.summary["parity_data"]


def test_vit_export_without_data_checks_synthetic_images(
    vit_onnx_nodata: Path, vit_onnx: Path, tiny_vit_artifact: Path
) -> None:
    _check_contract(vit_onnx_nodata, tiny_vit_artifact, "image")
    parity = _parity(vit_onnx_nodata)
    _check_parity_report(parity)
    assert parity["examples"] >= 1
    assert parity["examples"] < _parity(vit_onnx)["examples"]
    summary = open_artifact(vit_onnx_nodata).manifest.summary
    assert summary["parity_data"] == "synthetic"
    assert open_artifact(vit_onnx_nodata).id != open_artifact(vit_onnx).id


# --------------------------------------------------------------------------- parity gate


def _perturb_classifier(path: Path) -> None:
    """Add 1.0 to class 0 of the classifier bias (or weight row, if the bias was folded away)."""
    model = onnx.load(str(path))
    targets = [i for i in model.graph.initializer if i.name.endswith("classifier.bias")]
    if not targets:
        targets = [i for i in model.graph.initializer if i.name.endswith("classifier.weight")]
    assert targets, "no classifier initializer in the graph"
    tensor = targets[0]
    values = numpy_helper.to_array(tensor).copy()
    values[0] += 1.0
    tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    onnx.save(model, str(path))


def test_parity_gate_refuses_a_perturbed_graph(
    cli: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    trained_bert_artifact: Path,
) -> None:
    original = uqc_onnx.export_graph
    calls: list[Path] = []

    def perturbed(graph: Any, loaded: Any, path: Path, *args: Any) -> bool:
        external = original(graph, loaded, path, *args)
        _perturb_classifier(path)
        calls.append(path)
        return external

    monkeypatch.setattr(uqc_onnx, "export_graph", perturbed)
    out = tmp_path / "exports" / "bert-bad"
    result = cli("export", trained_bert_artifact, "--format", "onnx", "--out", out)
    assert calls, "the perturbation hook never ran"
    assert result.code == 3, result.err
    assert result.out == ""
    error_lines = [line for line in result.err.splitlines() if "error" in line.lower()]
    assert len(error_lines) == 1, result.err
    line = error_lines[0]
    assert "probs" in line and "argmax" in line
    assert "no artifact" in line
    # The reported probs difference is a real number far above the tolerance.
    reported = float(line.split("probs", 1)[1].split(",")[0].strip())
    assert reported > 1e-2
    assert not out.exists()
    assert not list((tmp_path / "exports").glob("*.tmp-*"))
    assert not list((tmp_path / "exports").glob(".*"))


def _predictor_on_copy(source: Path, directory: Path, perturb: bool) -> Any:
    from uqcompress.export.runtime import Predictor

    directory.mkdir()
    for name in ("model.onnx", "tokenizer.json"):
        (directory / name).write_bytes((source / name).read_bytes())
    if perturb:
        _perturb_classifier(directory / "model.onnx")
    return Predictor(directory)


def test_check_parity_reports_a_perturbed_model(
    tmp_path: Path,
    bert_onnx: Path,
    trained_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
) -> None:
    from uqcompress.data import load_data
    from uqcompress.export.graph import graph_for

    loaded = load_model(resolve_model_source(trained_bert_artifact))
    graph = graph_for(loaded.model, "text")
    data = load_data(str(sentiment_csv["test"]), require_labels=False)

    good_predictor = _predictor_on_copy(bert_onnx, tmp_path / "good", False)
    reference = uqc_onnx.parity_reference(graph, loaded, good_predictor, data)
    good = uqc_onnx.check_parity(reference, good_predictor, 1e-4)
    assert good.passed is True
    assert good.max_abs_diff["probs"] <= 1e-4

    bad_predictor = _predictor_on_copy(bert_onnx, tmp_path / "bad", True)
    bad = uqc_onnx.check_parity(reference, bad_predictor, 1e-4)
    assert bad.passed is False
    assert bad.max_abs_diff["probs"] > 1e-2
    assert bad.max_abs_diff["member_logits"] == pytest.approx(1.0, abs=1e-4)  # the +1.0 bias
    assert bad.examples == good.examples >= 40
    assert "probs" in bad.describe()


# --------------------------------------------------------------------------- safetensors


def test_safetensors_export_loads_with_transformers(
    cli: Callable[..., Any], tmp_path: Path, trained_bert_artifact: Path
) -> None:
    from transformers import AutoModelForSequenceClassification

    out = tmp_path / "st"
    result = cli("export", trained_bert_artifact, "--format", "safetensors", "--out", out)
    assert result.code == 0, result.err
    assert result.out.strip() == str(out)
    artifact = open_artifact(out)
    assert artifact.kind == "safetensors"
    assert (out / "model.safetensors").is_file()
    assert not list(out.rglob("*.bin"))

    exported = AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    source = load_model(resolve_model_source(trained_bert_artifact))
    assert source.tokenizer is not None
    texts = ["the movie was great", "awful and boring acting in the film, really bad", "fun"]
    batch = source.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        want = source.model(**batch).logits.numpy()
        got = exported(**batch).logits.numpy()
    assert np.abs(want).max() > 0.1  # a trained model, not all-zero logits
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    assert exported.config.id2label == {0: "neg", 1: "pos"}


# --------------------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [("--format", "tflite", "tflite"), ("--atol", "0", "atol"), ("--opset", "11", "opset")],
)
def test_bad_values_exit_1(
    cli: Callable[..., Any],
    tmp_path: Path,
    tiny_bert_artifact: Path,
    flag: str,
    value: str,
    words: str,
) -> None:
    out = tmp_path / "x"
    args = ["export", tiny_bert_artifact, "--out", out, flag, value]
    result = cli(*args)
    assert result.code == 1, result.err
    assert result.out == ""
    error_lines = [line for line in result.err.splitlines() if "error" in line.lower()]
    assert len(error_lines) == 1 and words in error_lines[0], result.err
    assert not out.exists()
    assert not list(tmp_path.glob(".*tmp-*"))


# --------------------------------------------------------------------------- reuse


def test_identical_export_is_reused(
    cli: Callable[..., Any], bert_onnx: Path, trained_bert_artifact: Path, sentiment_csv: dict
) -> None:
    args = [
        "export",
        trained_bert_artifact,
        "--format",
        "onnx",
        "--data",
        sentiment_csv["test"],
        "--out",
        bert_onnx,
    ]
    manifest_before = (bert_onnx / "manifest.json").read_bytes()
    first = cli(*args)
    second = cli(*args)
    for result in (first, second):
        assert result.code == 0, result.err
        assert result.out == f"{bert_onnx}\n"
        assert "reusing" in result.err
    assert (bert_onnx / "manifest.json").read_bytes() == manifest_before
    # A different config is a different id: the same --out is then refused, not overwritten.
    other = cli(*args, "--atol", "1e-3")
    assert other.code == 1
    assert "already holds" in other.err
    assert (bert_onnx / "manifest.json").read_bytes() == manifest_before


def _preprocessing(onnx_dir: Path) -> dict[str, Any]:
    model = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False)
    return dict(json.loads(_meta(model)["uqc.preprocessing"]))


def test_export_keeps_the_training_length_and_max_length_overrides_it(
    cli: Callable[..., Any],
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
    tmp_path: Path,
) -> None:
    """issue 26 item 13: a model fine-tuned at --max-length 32 is exported at 32 (not the
    position table's 512); `export --max-length N` overrides it, bounded by the table."""
    from tests.conftest import ok

    tuned = ok(
        cli(
            "finetune", tiny_bert_artifact, "--data", sentiment_csv["train"], "--epochs", "1",
            "--max-length", "32", "--out", tmp_path / "ft",
        )
    )  # fmt: skip
    config = json.loads((Path(tuned) / "config.json").read_text())
    assert config["uqc_max_length"] == 32
    onnx_dir = Path(ok(cli("export", tuned, "--out", tmp_path / "onnx")))
    assert _preprocessing(onnx_dir)["max_length"] == 32
    assert open_artifact(onnx_dir).manifest.summary["max_length"] == 32
    wider = Path(ok(cli("export", tuned, "--max-length", "48", "--out", tmp_path / "onnx48")))
    assert _preprocessing(wider)["max_length"] == 48
    limit = int(json.loads((Path(tuned) / "config.json").read_text())["max_position_embeddings"])
    too_long = cli("export", tuned, "--max-length", str(limit + 1), "--out", tmp_path / "x")
    assert too_long.code == 1 and too_long.out == ""
    assert f"outside 3..{limit}" in too_long.err and len(too_long.err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("opset", ["99", "17", "0"])
def test_an_opset_outside_the_range_is_one_line_before_any_export(
    cli: Callable[..., Any], tiny_vit_artifact: Path, tmp_path: Path, opset: str
) -> None:
    """issue 26 item 25: `--opset 99` gave the version converter's traceback and an ONNX
    Runtime error (several lines); the range is checked first and named."""
    result = cli("export", tiny_vit_artifact, "--opset", opset, "--out", tmp_path / "x")
    assert result.code == 1 and result.out == ""
    lines = result.err.strip().splitlines()
    assert lines == [
        f"error: --opset {opset} is outside the supported range 18..23 (fix: pass --opset 18 "
        "(the default) or another of 18..23)"
    ]
    assert not (tmp_path / "x").exists()


def test_the_opset_range_is_the_exporters() -> None:
    from torch.onnx import _constants

    from uqcompress.steps.export import OPSETS

    assert OPSETS == (uqc_onnx.MIN_OPSET, _constants.ONNX_MAX_OPSET)


def test_the_export_frees_weights_that_other_objects_still_reference() -> None:
    """After tracing, onnxscript's rewrite rules keep the last graph they matched, and with
    it the parameter objects: `uqc export` empties the parameters themselves before ONNX
    Runtime loads the graph (moving the module to the meta device made new parameters and
    left the old ones, and their memory, alive)."""
    from uqcompress.steps.export import _free_weights

    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.LayerNorm(32))
    model.register_buffer("table", torch.ones(10, 10))
    held = [*model.parameters(), *model.buffers()]  # as the exporter's internals hold them
    assert sum(t.numel() for t in held) > 0
    _free_weights(model)
    assert all(t.numel() == 0 for t in held)
    assert all(t.dtype == torch.float32 for t in held)


def test_torch_weights_are_freed_before_onnx_runtime_opens_the_graph(
    cli: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    tiny_bert_artifact: Path,
    tmp_path: Path,
) -> None:
    """The parity check runs torch first, then empties the model's parameters, and only then
    does ONNX Runtime load the graph: the two copies of the weights never coexist."""
    from uqcompress.export import onnx as export_onnx
    from uqcompress.models import loading

    loaded_models: list[Any] = []
    seen: dict[str, Any] = {}
    load, check = loading.load_model, export_onnx.check_parity

    def recording_load(*args: Any, **kwargs: Any) -> Any:
        loaded_models.append(load(*args, **kwargs))
        return loaded_models[-1]

    def inspecting_check(reference: Any, predictor: Any, atol: float) -> Any:
        model = loaded_models[-1].model
        seen["weights_left"] = sum(p.numel() for p in model.parameters())
        seen["session_open"] = predictor._session is not None
        return check(reference, predictor, atol)

    monkeypatch.setattr(loading, "load_model", recording_load)
    monkeypatch.setattr(export_onnx, "check_parity", inspecting_check)
    result = cli("export", str(tiny_bert_artifact), "--out", str(tmp_path / "onnx"))
    assert result.code == 0, result.err
    assert seen == {"weights_left": 0, "session_open": False}
    report = json.loads((tmp_path / "onnx" / "parity.json").read_text())
    assert report["passed"] is True and report["examples"] > 0


def test_a_member_layout_that_changes_the_outputs_stops_the_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The export checks its own swap to one GEMM per member on the trace example, so the
    parity gate (which runs the swapped module) cannot hide a wrong swap."""
    from tests.methods.test_hydra import _members
    from uqcompress.export.graph import graph_for
    from uqcompress.methods.hydra import fuse
    from uqcompress.models.grouped import MemberLinears

    hydra = fuse(_members("bert", [[[0, 1], [2]], [[3], [0, 1]]]))
    right = MemberLinears.forward
    monkeypatch.setattr(MemberLinears, "forward", lambda self, x: right(self, x) * 1.01)
    path = tmp_path / "hydra.onnx"
    with pytest.raises(RuntimeError, match="member-wise layers"):
        uqc_onnx.export_graph(graph_for(hydra.model, hydra.input_kind), hydra, path, 18)
    assert not path.exists()
