"""export/quantize.py's graph passes, on hand-built ONNX graphs, and its drift gate on
hand-made outputs (the command end to end is in tests/steps/test_quantize.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from uqcompress.export.quantize import Bounds, fold_weight_transposes, measure_drift
from uqcompress.uq.outputs import OUTPUT_FIELDS


def _shared_weight_graph() -> onnx.ModelProto:
    """y_m = x_m @ W.T for two inputs reading one W through one Transpose (as the exporter
    writes a Hydra's shared MLP run once per member), and z = x_0 @ V, V untouched."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((5, 3)).astype(np.float32)  # [out, in], as nn.Linear's
    other = rng.standard_normal((3, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x0", "Wt"], ["y0"]),
        helper.make_node("MatMul", ["x1", "Wt"], ["y1"]),
        helper.make_node("MatMul", ["x0", "V"], ["z"]),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x0", "x1")]
    outputs = [
        helper.make_tensor_value_info("y0", TensorProto.FLOAT, [2, 5]),
        helper.make_tensor_value_info("y1", TensorProto.FLOAT, [2, 5]),
        helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4]),
    ]
    graph = helper.make_graph(
        nodes,
        "shared",
        inputs,
        outputs,
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(other, "V")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run(model: onnx.ModelProto, path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    onnx.save(model, str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [np.asarray(out) for out in session.run(None, feed)]


def test_a_transposed_weight_becomes_one_initializer_every_reader_shares(tmp_path: Path) -> None:
    model = _shared_weight_graph()
    feed = {
        "x0": np.arange(6, dtype=np.float32).reshape(2, 3),
        "x1": -np.arange(6, dtype=np.float32).reshape(2, 3),
    }
    before = _run(model, tmp_path / "before.onnx", feed)
    assert fold_weight_transposes(model) == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul", "MatMul", "MatMul"]
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert set(initializers) == {"Wt", "V"}  # W is read by nothing now: dropped
    assert initializers["Wt"].shape == (3, 5)
    after = _run(model, tmp_path / "after.onnx", feed)
    for want, got in zip(before, after, strict=True):
        np.testing.assert_array_equal(got, want)
    assert fold_weight_transposes(model) == 0  # nothing left to fold


def test_an_initializer_that_is_also_a_graph_input_is_kept() -> None:
    """Older exporters list initializers among the graph's inputs (overridable defaults):
    dropping one would turn it into a required input."""
    model = _shared_weight_graph()
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [5, 3]))
    assert fold_weight_transposes(model) == 1
    assert {t.name for t in model.graph.initializer} == {"W", "Wt", "V"}


def test_the_default_perm_reverses_the_axes(tmp_path: Path) -> None:
    model = _shared_weight_graph()
    del model.graph.node[0].attribute[:]  # Transpose without perm: reversed axes
    assert fold_weight_transposes(model) == 1
    folded = {t.name: t for t in model.graph.initializer}["Wt"]
    assert list(folded.dims) == [3, 5]


def test_a_hydra_with_a_wide_mlp_runs_every_weight_matmul_in_int8(tmp_path: Path) -> None:
    """A Hydra whose shared MLP is wide enough that the exporter keeps one Transpose for its
    per-member reads (over ~10k weights; tiny widths are folded by the exporter itself):
    before the fold its MLP MatMuls stayed float32 under dynamic int8; now none does."""
    from tests.methods.test_hydra import _pruned_copies
    from uqcompress.export.graph import graph_for
    from uqcompress.export.onnx import export_graph
    from uqcompress.export.quantize import quantize_graph
    from uqcompress.methods.hydra import fuse
    from uqcompress.models.factory import create_model

    base = create_model("bert", ["a", "b"], overrides={"intermediate_size": 1024}, seed=0)
    heads = int(base.config.num_attention_heads)
    layers = int(base.config.num_hidden_layers)
    keeps = [[list(range(m, heads, 2))] * layers for m in range(2)]
    hydra = fuse(_pruned_copies(base, keeps))
    fp32, int8 = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    export_graph(graph_for(hydra.model, hydra.input_kind), hydra, fp32, 18)
    graph = onnx.load(str(fp32)).graph
    assert "Transpose" in {n.op_type for n in graph.node if n.output[0] in _matmul_weights(graph)}
    quantize_graph(fp32, int8, "dynamic", work_dir=tmp_path)
    quantized = onnx.load(str(int8)).graph
    assert _matmul_weights(quantized) == set()  # every weight MatMul is a MatMulInteger now
    assert "MatMulInteger" in {n.op_type for n in quantized.node}


def _matmul_weights(graph: onnx.GraphProto) -> set[str]:
    """The constant weights (initializers, or Transposes of one) that float MatMuls read."""
    constants = {t.name for t in graph.initializer}
    transposed = {
        n.output[0] for n in graph.node if n.op_type == "Transpose" and n.input[0] in constants
    }
    return {
        n.input[1]
        for n in graph.node
        if n.op_type == "MatMul" and n.input[1] in constants | transposed
    }


def test_an_older_export_with_batched_member_weights_is_int8_per_tensor_there(
    tmp_path: Path,
) -> None:
    """Exports made before one 2-D GEMM per member hold a Hydra's member-wise layers as
    `[M, in, out]` weights, which ONNX Runtime's per-channel kernel does not take: a
    per-channel dynamic run quantizes them per tensor after it, never leaving them float32."""
    from tests.methods.test_hydra import _pruned_copies
    from uqcompress.export.graph import graph_for
    from uqcompress.export.onnx import export_graph
    from uqcompress.export.quantize import quantize_graph
    from uqcompress.methods.hydra import fuse
    from uqcompress.models.factory import create_model

    base = create_model("bert", ["a", "b"], seed=0)
    heads = int(base.config.num_attention_heads)
    layers = int(base.config.num_hidden_layers)
    keeps = [[list(range(m, heads, 2))] * layers for m in range(2)]
    hydra = fuse(_pruned_copies(base, keeps))
    fp32, int8 = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    graph = graph_for(hydra.model, hydra.input_kind)
    export_graph(graph, hydra, fp32, 18, member_gemms=False)
    result = quantize_graph(fp32, int8, "dynamic", per_channel=True, work_dir=tmp_path)
    assert result.per_tensor_grouped > 0
    quantized = onnx.load(str(int8)).graph
    ranks = {t.name: len(t.dims) for t in quantized.initializer}
    assert not [
        n.name
        for n in quantized.node
        if n.op_type == "MatMul" and any(ranks.get(i, 2) == 3 for i in n.input)
    ]


def test_the_uncertainty_tail_starts_after_every_members_classifier(tmp_path: Path) -> None:
    """One classifier GEMM per member: the tail kept in float32 starts after each of them,
    so every member's bias Add stays float32 (not member 0's only)."""
    from tests.methods.test_hydra import _pruned_copies
    from uqcompress.export.graph import graph_for
    from uqcompress.export.onnx import export_graph
    from uqcompress.export.quantize import uncertainty_tail
    from uqcompress.methods.hydra import fuse
    from uqcompress.models.factory import create_model

    base = create_model("bert", ["a", "b"], seed=0)
    heads = int(base.config.num_attention_heads)
    layers = int(base.config.num_hidden_layers)
    keeps = [[list(range(m, heads, 3))] * layers for m in range(3)]
    hydra = fuse(_pruned_copies(base, keeps))
    path = tmp_path / "hydra.onnx"
    export_graph(graph_for(hydra.model, hydra.input_kind), hydra, path, 18)
    model = onnx.load(str(path))
    tail = set(uncertainty_tail(model))
    produced_by = {o: n for n in model.graph.node for o in n.output}
    # the GEMMs that the tail reads from: the members' classifier heads, none of them in it
    heads_read = {
        produced_by[i].name
        for n in model.graph.node
        if n.name in tail
        for i in n.input
        if i in produced_by and produced_by[i].op_type == "MatMul"
    }
    assert len(heads_read) == 3 and not heads_read & tail


class _FixedOutputs:
    """A stand-in Predictor whose `run` returns the given probabilities, row by row as fed
    (the batch carries the row indices)."""

    noise = None
    calibration = None

    def __init__(self, probs: np.ndarray) -> None:
        self.probs = probs

    def run(self, batch: dict[str, np.ndarray]) -> object:
        p = self.probs[batch["rows"]]
        entropy = -np.sum(p * np.log(p), axis=1)
        values = {
            "member_logits": np.log(p)[:, None, :],
            "probs": p,
            "entropy": entropy,
            "mutual_info": np.zeros(len(p)),
        }
        return type("Outputs", (), {name: values[name] for name in OUTPUT_FIELDS})()


def _gate(before: np.ndarray, after: np.ndarray, labels: np.ndarray) -> dict[str, object]:
    batches = [{"rows": np.arange(i, min(i + 50, len(labels)))} for i in range(0, len(labels), 50)]
    drift = measure_drift(
        _FixedOutputs(before), _FixedOutputs(after), batches, labels, {}, Bounds()
    )
    return {c.name: c.passed for c in drift.checks} | {"deltas": drift.deltas}


def test_the_gate_does_not_refuse_rows_that_only_cross_a_ece_bin_edge() -> None:
    # 200 gate rows, 40 of them on either side of the 0.8 bin edge; an "int8" model that
    # moves every confidence by 2e-6 and flips nothing. The plain ECE difference is 0.01 or
    # more (a gate on it would refuse); the change on fixed bins is ~0.
    rng = np.random.default_rng(3)
    conf = np.concatenate(
        [np.full(20, 0.8 - 1e-6), np.full(20, 0.8 + 1e-6), rng.uniform(0.5, 1, 160)]
    )
    labels = np.concatenate(
        [np.zeros(20), np.tile([0, 1], 10), (rng.uniform(size=160) > conf[40:])]
    ).astype(int)
    before = np.stack([conf, 1 - conf], axis=1)
    after = np.stack([conf + 2e-6, 1 - conf - 2e-6], axis=1)
    gate = _gate(before, after, labels)
    deltas = gate["deltas"]
    assert isinstance(deltas, dict)
    assert abs(deltas["ece_plain"]) >= 0.01
    assert abs(deltas["ece"]) <= 2e-6 and gate["ece_delta"] is True


def test_the_gate_refuses_a_model_grown_overconfident() -> None:
    # Calibrated at 0.7 (70 of 100 right, then 100 more at 0.9 with 90 right); the quantized
    # model says 0.8 and 0.99: the same argmax everywhere, 0.095 more confident on average.
    conf = np.concatenate([np.full(100, 0.7), np.full(100, 0.9)])
    labels = np.concatenate([np.zeros(70), np.ones(30), np.zeros(90), np.ones(10)]).astype(int)
    shifted = np.concatenate([np.full(100, 0.8), np.full(100, 0.99)])
    before = np.stack([conf, 1 - conf], axis=1)
    after = np.stack([shifted, 1 - shifted], axis=1)
    gate = _gate(before, after, labels)
    deltas = gate["deltas"]
    assert isinstance(deltas, dict)
    assert gate["agreement"] is True
    assert deltas["ece"] == pytest.approx(0.095) and deltas["ece_plain"] == pytest.approx(0.095)
    assert gate["ece_delta"] is False
