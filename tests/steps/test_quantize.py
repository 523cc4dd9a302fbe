"""`uqc quantize`: int8 (dynamic, static QDQ) and float16 copies of ONNX exports that keep the
export contract and its uncertainty, behind a drift gate against the float32 export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import ok
from tests.export.test_quantize_graph import _matmul_weights
from uqcompress.artifacts import open_artifact
from uqcompress.export import contract
from uqcompress.export.quantize import uncertainty_tail
from uqcompress.export.runtime import Predictor

TEXT_DATA = "sentiment"  # the sentiment_csv test split
IMAGE_DATA = "builtin:digits@test"


def _hydra_onnx(root: Path, model: Path, data: str | None) -> Path:
    """A 2-member Hydra (partition pruning of `model`) exported to ONNX."""
    from uqcompress.steps import export, fuse, prune, score

    scores = score.run(model, score.ScoreConfig(method="l2"), root / "scores")
    members = prune.run(
        scores.artifact.path, prune.PruneConfig(members=2, select="partition"), out=root / "m"
    )
    hydra = fuse.run([members.artifact.path], fuse.FuseConfig(), root / "hydra")
    return export.run(
        hydra.artifact.path, export.ExportConfig(data=data), root / "onnx"
    ).artifact.path


@pytest.fixture(scope="module")
def trained_vit(tmp_path_factory: pytest.TempPathFactory, tiny_vit_artifact: Path) -> Path:
    """The tiny ViT after 3 epochs on digits@train (lr 3e-3): its predictions have margins, so
    the drift gate measures int8 rounding and not the reordering of near-ties. (The session's
    `briefly_trained_vit` is near uniform: its Hydra's agreement under int8 was 0.10-0.26 with
    max |probs diff| 3e-3, and whether it passed depended on the machine.)"""
    from uqcompress.steps import finetune

    cfg = finetune.FinetuneConfig(data="builtin:digits@train", epochs=3, lr=3e-3)
    root = tmp_path_factory.mktemp("quantize-trained-vit")
    return finetune.run(tiny_vit_artifact, cfg, root).artifact.path


@pytest.fixture(scope="module")
def exports(
    tmp_path_factory: pytest.TempPathFactory,
    bert_onnx: Path,
    vit_onnx: Path,
    trained_bert_artifact: Path,
    trained_vit: Path,
    sentiment_csv: dict[str, Path],
) -> dict[str, tuple[Path, str]]:
    """name -> (float32 ONNX artifact, gate data): tiny BERT and ViT, single and Hydra M=2."""
    root = tmp_path_factory.mktemp("quantize-exports")
    text = str(sentiment_csv["test"])
    return {
        "bert": (bert_onnx, text),
        "vit": (vit_onnx, IMAGE_DATA),
        "bert-hydra": (_hydra_onnx(root / "bert", trained_bert_artifact, text), text),
        "vit-hydra": (_hydra_onnx(root / "vit", trained_vit, IMAGE_DATA), IMAGE_DATA),
    }


def _meta(path: Path) -> dict[str, str]:
    model = onnx.load(str(path / contract.ONNX_FILE))
    return {p.key: p.value for p in model.metadata_props}


def _probe(predictor: Predictor, data: str) -> dict[str, np.ndarray]:
    """The contract outputs of a few examples (padded texts or images)."""
    if predictor.input_kind == "text":
        texts = ["good great fun", "the movie was really very bad and boring", "dull"]
        got = predictor.predict_texts(texts)
    else:
        pixels = np.random.default_rng(3).uniform(0, 255, size=(3, 1, 8, 8))
        got = predictor.predict_pixels(pixels.astype(np.float32))
    return {name: getattr(got, name) for name in contract.OUTPUT_NAMES}


# op types that only a quantized (or half-precision) graph holds, per mode
MARKERS = {
    "dynamic": {"DynamicQuantizeLinear", "MatMulInteger"},
    "static": {"QuantizeLinear", "DequantizeLinear"},
    "fp16": {"Cast"},
}


@pytest.mark.parametrize("mode", ["dynamic", "static", "fp16"])
@pytest.mark.parametrize("name", ["bert", "vit", "bert-hydra", "vit-hydra"])
def test_each_mode_keeps_the_contract_and_stays_within_the_gate(
    cli,  # type: ignore[no-untyped-def]
    exports: dict[str, tuple[Path, str]],
    name: str,
    mode: str,
) -> None:
    fp32, data = exports[name]
    # The toy Hydras are 2 members of half the heads each, not retrained: some digits sit near
    # a tie, and static int8 flipped 1-3 of the 232 gate rows depending on the CPU (AVX2 here,
    # 3 in CI, where the default 0.99 allows 2). This test is about the contract; the gate's
    # default bound is exercised by the refusal tests below, so the toys get a bound they meet
    # on every machine, and the test still checks the gate passed on what it measured.
    bound = ["--min-agreement", "0.95"] if name.endswith("hydra") and mode != "fp16" else []
    out = Path(ok(cli("quantize", str(fp32), "--mode", mode, "--data", data, *bound)))
    artifact = open_artifact(out, expect_kind="onnx")
    summary = artifact.manifest.summary
    flips = summary["drift_flips"]
    assert flips["allowed"] == int((1 - (0.95 if bound else 0.99)) * summary["drift_examples"])
    assert flips["flips"] <= flips["allowed"]
    assert artifact.manifest.step == "quantize"
    assert [ref.id for ref in artifact.manifest.inputs] == [open_artifact(fp32).id]  # lineage
    assert summary["quantization"]["mode"] == mode
    assert summary["members"] == open_artifact(fp32).manifest.summary["members"]
    # every uqc.* metadata value kept, the quantization recorded
    before, after = _meta(fp32), _meta(out)
    assert {k: v for k, v in after.items() if k != contract.META_QUANTIZATION} == before
    assert json.loads(after[contract.META_QUANTIZATION])["mode"] == mode
    assert (out / contract.TOKENIZER_FILE).is_file() == (fp32 / contract.TOKENIZER_FILE).is_file()
    # the graph is quantized, but its uncertainty tail is the float32 export's, node for node
    model_fp32 = onnx.load(str(fp32 / contract.ONNX_FILE))
    graph_fp32, graph = model_fp32.graph, onnx.load(str(out / contract.ONNX_FILE)).graph
    ops = {n.op_type for n in graph.node}
    assert MARKERS[mode] <= ops, ops
    if mode == "dynamic":
        # every MatMul with a constant weight runs in int8, also one whose weight reached it
        # through a Transpose (a Hydra's shared MLP, read once per member)
        assert _matmul_weights(graph) == set()
    tail = uncertainty_tail(model_fp32)
    assert {"Softmax", "Log"} <= {n.op_type for n in graph_fp32.node if n.name in tail}
    by_name = {n.name: n for n in graph.node}
    produced_by = {o: n for n in graph.node for o in n.output}
    for node in graph_fp32.node:
        if node.name in tail:
            assert by_name[node.name].op_type == node.op_type
            for tensor in by_name[node.name].input:
                source = produced_by.get(tensor)
                assert source is None or source.op_type != "QuantizeLinear"
    if mode == "fp16":
        halves = [t for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
        assert halves
    # the Predictor sees the same outputs: names, types, shapes; values close
    reference, quantized = Predictor(fp32), Predictor(out)
    assert [o.name for o in quantized.session.get_outputs()] == list(contract.GRAPH_OUTPUTS)
    assert [(i.name, i.type) for i in quantized.session.get_inputs()] == [
        (i.name, i.type) for i in reference.session.get_inputs()
    ]
    want, got = _probe(reference, data), _probe(quantized, data)
    for key in contract.OUTPUT_NAMES:
        assert got[key].shape == want[key].shape and got[key].dtype == np.float32
    assert np.allclose(got["probs"].sum(axis=1), 1.0, atol=1e-5)
    assert np.abs(got["probs"] - want["probs"]).max() < 0.05
    # the drift gate, recorded
    drift = json.loads((out / "drift.json").read_text())
    assert drift["passed"] is True
    assert drift["agreement"] >= (0.95 if bound else 0.99)
    assert {c["name"] for c in drift["checks"]} >= {
        *("agreement", "ece_delta", "nll_delta", "mean_entropy_shift", "mean_mi_shift")
    }
    assert drift["fp32"]["mean_entropy"] > 0 and "mean_mi" in drift["quantized"]
    assert abs(drift["deltas"]["ece"]) <= 0.01 and abs(drift["deltas"]["nll"]) <= 0.02
    assert summary["drift_max_abs_probs"] == drift["max_abs_diff"]["probs"]
    assert 0 < summary["size_ratio"] < (1 if mode != "static" else 1.5)


def test_dynamic_int8_shrinks_the_file_and_ood_auroc_is_gated(
    cli,  # type: ignore[no-untyped-def]
    exports: dict[str, tuple[Path, str]],
) -> None:
    fp32, data = exports["vit-hydra"]
    out = Path(
        ok(
            cli(
                "quantize",
                str(fp32),
                "--data",
                data,
                "--ood",
                "builtin:photo-patches",
                "--per-channel",
            )
        )
    )
    drift = json.loads((out / "drift.json").read_text())
    assert "auroc_delta" in {c["name"] for c in drift["checks"]}
    mi = [k for k in drift["deltas"] if k.endswith(".mi.auroc")]
    assert mi and all(drift["deltas"][k] >= -0.01 for k in drift["deltas"] if "auroc" in k)
    quantization = open_artifact(out).manifest.summary["quantization"]
    assert quantization["per_channel"] is True
    # the Hydra's member-wise layers are exported as one 2-D weight per member, so they are
    # int8 per channel like every other layer: no float MatMul reads an initializer
    graph = onnx.load(str(out / contract.ONNX_FILE)).graph
    weights = {t.name for t in graph.initializer}
    float_weights = [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    assert quantization["per_tensor_grouped"] == 0 and float_weights == []


def test_the_default_granularity_is_per_channel_then_per_tensor(
    cli,  # type: ignore[no-untyped-def]
    exports: dict[str, tuple[Path, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No --per-channel/--per-tensor: per channel is tried first and kept if it passes the
    gate; where it fails, per tensor is tried and each try is recorded in the summary."""
    from uqcompress.export import quantize as q

    fp32, data = exports["bert"]
    forced = open_artifact(
        Path(ok(cli("quantize", str(fp32), "--data", data, "--per-tensor")))
    ).manifest.summary
    assert [t["per_channel"] for t in forced["granularity_tries"]] == [False]
    assert forced["quantization"]["per_channel"] is False

    measured = q.measure_drift
    calls: list[bool] = []

    def per_channel_fails(*args, **kwargs):  # type: ignore[no-untyped-def]
        drift = measured(*args, **kwargs)
        calls.append(True)
        if len(calls) == 1:  # the first try (per channel) fails on one check
            drift.checks.append(q.Check("agreement", 0.0, "forced failure", False))
        return drift

    monkeypatch.setattr(q, "measure_drift", per_channel_fails)
    result = cli("quantize", str(fp32), "--data", data, "--out", str(fp32.parent / "auto"))
    summary = open_artifact(Path(ok(result))).manifest.summary
    tries = summary["granularity_tries"]
    assert [(t["per_channel"], t["passed"]) for t in tries] == [(True, False), (False, True)]
    assert "forced failure" in tries[0]["failed"]
    assert summary["quantization"]["per_channel"] is False
    assert "per tensor kept" in result.err


def test_reduce_range_reaches_onnx_runtime_and_is_recorded(
    cli,  # type: ignore[no-untyped-def]
    exports: dict[str, tuple[Path, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--reduce-range (7-bit weights, for AVX2 CPUs without VNNI) is passed to ONNX Runtime's
    quantizer, recorded in the graph's metadata and the summary, and changes the id."""
    import onnxruntime.quantization as ortq

    fp32, data = exports["bert"]
    seen: list[bool] = []
    real = ortq.quantize_dynamic

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs.get("reduce_range", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(ortq, "quantize_dynamic", spy)
    full = Path(ok(cli("quantize", str(fp32), "--data", data, "--per-tensor")))
    reduced = Path(ok(cli("quantize", str(fp32), "--data", data, "--per-tensor", "--reduce-range")))
    assert seen == [False, True]
    assert open_artifact(full).manifest.summary["quantization"]["reduce_range"] is False
    assert open_artifact(reduced).manifest.summary["quantization"]["reduce_range"] is True
    meta = {p.key: p.value for p in onnx.load(str(reduced / contract.ONNX_FILE)).metadata_props}
    assert json.loads(meta[contract.META_QUANTIZATION])["reduce_range"] is True
    assert open_artifact(full).id != open_artifact(reduced).id


def test_an_impossible_gate_exits_3_and_writes_nothing(
    cli,  # type: ignore[no-untyped-def]
    exports: dict[str, tuple[Path, str]],
    tmp_path: Path,
    _artifacts_root: Path,
) -> None:
    fp32, data = exports["bert"]
    target = tmp_path / "q"
    result = cli(
        "quantize",
        str(fp32),
        "--data",
        data,
        "--max-nll-delta",
        "0",
        "--max-ece-delta",
        "0",
        "--out",
        str(target),
    )
    assert result.code == 3, result.err
    assert result.out == ""
    assert "drifts from the float32 export" in result.err and "no artifact written" in result.err
    assert "nll_delta" in result.err
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert not _artifacts_root.exists() or not any(_artifacts_root.iterdir())


@pytest.mark.parametrize(
    ("mode", "both", "other", "granularity"),
    [
        ("dynamic", False, "static", True),
        ("static", False, "dynamic", True),
        ("static", True, "dynamic", False),
    ],
)
def test_a_refused_gate_suggests_what_was_not_tried(
    mode: str, both: bool, other: str, granularity: bool
) -> None:
    """The fix names the other mode, never the one that just failed (a refused static run
    was told to try --mode static), and the other granularity only if one was tried."""
    from uqcompress.steps.quantize import gate_hint

    hint = gate_hint(mode, tried_both_granularities=both)
    assert hint.startswith(f"try --mode {other} ") and f"--mode {mode}" not in hint
    assert ("--per-channel/--per-tensor" in hint) is granularity


def test_the_gate_bounds_the_shift_of_uncertainty(
    cli,  # type: ignore[no-untyped-def]
    exports: dict[str, tuple[Path, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Entropy and MI drift were recorded but never gated: with no slack, any shift fails."""
    from uqcompress.export import quantize as quantization

    monkeypatch.setattr(quantization, "UNCERTAINTY_FLOOR", 0.0)
    fp32, data = exports["bert"]
    result = cli("quantize", str(fp32), "--data", data, "--max-entropy-shift", "0")
    assert result.code == 3, result.err
    assert "mean_entropy_shift" in result.err


def test_predict_eval_and_verify_take_a_quantized_artifact(
    cli,  # type: ignore[no-untyped-def]
    exports: dict[str, tuple[Path, str]],
) -> None:
    fp32, data = exports["bert"]
    out = ok(cli("quantize", str(fp32), "--data", data))
    assert cli("verify", out).code == 0
    evaluation = json.loads(ok(cli("eval", out, "--data", data, "--json")))["summary"]
    baseline = json.loads(ok(cli("eval", str(fp32), "--data", data, "--json")))["summary"]
    assert evaluation["acc"] == pytest.approx(baseline["acc"], abs=0.03)
    assert evaluation["ece"] == pytest.approx(baseline["ece"], abs=0.01)
    rows = [json.loads(line) for line in ok(cli("predict", out, "--data", data)).splitlines()]
    want = [json.loads(line) for line in ok(cli("predict", str(fp32), "--data", data)).splitlines()]
    assert len(rows) == len(want) and set(rows[0]) == set(want[0])
    agree = np.mean([a["label"] == b["label"] for a, b in zip(rows, want, strict=True)])
    assert agree >= 0.99
    compared = cli("compare", *[ok(cli("eval", p, "--data", data)) for p in (str(fp32), out)])
    assert compared.code == 0, compared.err


def test_a_calibrated_export_keeps_its_temperature_and_abstention_coverage(
    cli,  # type: ignore[no-untyped-def]
    trained_vit: Path,
) -> None:
    # The ViT, not the tiny BERT: that one fits its sentiment rows so well that calibration
    # sharpens it to float32 saturation (temperature 0.10, every 1 - msp near 6e-7), where int8
    # rounding moves every row across the abstention threshold.
    data = IMAGE_DATA
    calibrated = ok(
        cli(
            "calibrate",
            str(trained_vit),
            "--data",
            "builtin:digits@val",
            "--abstain-coverage",
            "0.8",
        )
    )
    exported = ok(cli("export", calibrated, "--data", data))
    # one flip over the default's 3 of 360 (measured: agreement 0.9889 per tensor) on this tiny
    # ViT: the gate is loosened by that, explicitly; the coverage bound stays the default
    gate = ["--min-agreement", "0.98"]
    out = Path(ok(cli("quantize", exported, "--data", data, *gate)))
    assert _meta(out)[contract.META_CALIBRATION] == _meta(Path(exported))[contract.META_CALIBRATION]
    drift = json.loads((out / "drift.json").read_text())
    assert "coverage_delta" in {c["name"] for c in drift["checks"]}
    assert abs(drift["deltas"]["coverage"]) <= 0.02
    assert Predictor(out).calibration is not None


@pytest.mark.parametrize("kind", ["sve", "director"])
def test_sve_and_director_exports_quantize_within_the_gate(
    kind: str, cli, tmp_path: Path, trained_vit: Path
) -> None:  # type: ignore[no-untyped-def]
    """Every exported kind quantizes: an SVE (factorised) and a DIRECTOR student, whose
    `noise` input stays float32 and whose predictions stay deterministic per example."""
    if kind == "sve":
        args = ["svd-ensemble", trained_vit, "--members", "2", "--epochs", "1"]
    else:
        args = ["distill-director", trained_vit, "--samples", "2", "--epochs", "1"]
    model = ok(cli(*args, "--data", "builtin:digits@val", "--out", tmp_path / kind))
    fp32 = ok(cli("export", model, "--data", IMAGE_DATA, "--out", tmp_path / "fp32"))
    # A student trained 1 epoch is nearly uniform, so int8 rounding flips a few near-tied
    # argmaxes (measured: agreement 0.975-0.981 at the default 0.99, max |probs diff| 4e-3 for
    # DIRECTOR): the gate is loosened here, explicitly, as a user would for such a model.
    gate = ["--min-agreement", "0.95"]
    quantize = ["quantize", fp32, "--mode", "dynamic", "--data", IMAGE_DATA, *gate]
    int8 = ok(cli(*quantize, "--out", tmp_path / "q"))
    summary = open_artifact(Path(int8)).manifest.summary
    drift = json.loads((Path(int8) / "drift.json").read_text())
    assert summary["drift_agreement"] >= 0.95 and all(c["passed"] for c in drift["checks"])
    graph = onnx.load(str(Path(int8) / contract.ONNX_FILE))
    inputs = {i.name: i.type.tensor_type.elem_type for i in graph.graph.input}
    if kind == "director":
        assert inputs[contract.NOISE_INPUT] == onnx.TensorProto.FLOAT
    assert MARKERS["dynamic"] & {node.op_type for node in graph.graph.node}
    first = _probe(Predictor(Path(int8)), IMAGE_DATA)
    again = _probe(Predictor(Path(int8)), IMAGE_DATA)
    for name in contract.OUTPUT_NAMES:  # deterministic per example (DIRECTOR's seeded noise)
        np.testing.assert_array_equal(first[name], again[name])


def test_static_calibrates_on_a_seeded_sample_and_gates_on_the_other_rows(
    cli,  # type: ignore[no-untyped-def]
    exports: dict[str, tuple[Path, str]],
) -> None:
    """Issue 26 item 7: the gate was measured on the very rows that calibrated."""
    from uqcompress.steps.quantize import calibration_split

    fp32, data = exports["bert"]
    out = Path(ok(cli("quantize", str(fp32), "--mode", "static", "--data", data)))
    summary = open_artifact(out).manifest.summary
    rows = summary["drift_rows"]
    assert rows["calibration"] == 20 and rows["gate"] == 20  # 40 rows: at most half calibrate
    assert summary["drift_examples"] == 20
    calib, gate = calibration_split(40, 128, 0)
    assert not set(calib) & set(gate) and len(calib) + len(gate) == 40
    assert calib != list(range(20))  # a random sample, not the first rows in file order
    assert calibration_split(40, 128, 1)[0] != calib


def test_gate_data_gates_on_its_own_rows_and_small_gates_are_flagged(
    cli,  # type: ignore[no-untyped-def]
    exports: dict[str, tuple[Path, str]],
    sentiment_csv: dict[str, Path],
) -> None:
    """--gate-data: --data only calibrates; a gate on fewer rows than one flip needs warns."""
    fp32, data = exports["bert"]
    result = cli(
        "quantize",
        str(fp32),
        *("--mode", "static", "--data", str(sentiment_csv["train"]), "--calib-size", "16"),
        *("--gate-data", data),
    )
    out = Path(ok(result))
    manifest = open_artifact(out).manifest
    rows = manifest.summary["drift_rows"]
    assert rows["split"].startswith("all rows of --gate-data gate")
    assert rows["gate"] == 40 and rows["calibration"] == 16
    assert manifest.summary["drift_examples"] == 40
    assert [entry["role"] for entry in manifest.data] == ["data", "gate"]
    flips = manifest.summary["drift_flips"]
    assert flips["allowed"] == 0 and flips["flips"] == 0  # 40 rows at 0.99: no flip allowed
    assert "not one flip is allowed there" in result.err and "at least 100 rows" in result.err
    drift = json.loads((out / "drift.json").read_text())
    agreement = next(c for c in drift["checks"] if c["name"] == "agreement")
    assert agreement["bound"] == "flips <= 0 of 40 (agreement >= 0.99)"
