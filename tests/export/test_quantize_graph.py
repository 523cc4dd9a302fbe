"""export/quantize.py's graph passes, on hand-built ONNX graphs (the command end to end is in
tests/steps/test_quantize.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from uqcompress.export.quantize import fold_weight_transposes


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
