"""Member-wise linear maps: the batched form that trains and the per-member form that is
exported compute the same, and the export gives ONNX Runtime 2-D weights only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
import torch

from uqcompress.models.grouped import GroupedLinear, MemberLinears, split_grouped_linears


def _grouped(members: int, inputs: int, outputs: int, seed: int = 0) -> GroupedLinear:
    generator = torch.Generator().manual_seed(seed)
    grouped = GroupedLinear(members, inputs, outputs)
    with torch.no_grad():
        grouped.weight.copy_(torch.randn(members, inputs, outputs, generator=generator))
        grouped.bias.copy_(torch.randn(members, 1, outputs, generator=generator))
    return grouped


@pytest.mark.parametrize("lead", [(6,), (6, 7)], ids=["rows", "rows-tokens"])
def test_member_linears_compute_what_the_grouped_linear_computes(lead: tuple[int, ...]) -> None:
    grouped = _grouped(members=3, inputs=4, outputs=5)
    x = torch.randn(*lead, 4, generator=torch.Generator().manual_seed(1))  # M*B rows
    split = MemberLinears(grouped)
    assert [tuple(w.shape) for w in split.weights] == [(4, 5)] * 3
    assert [tuple(b.shape) for b in split.biases] == [(5,)] * 3
    out = split(x)
    assert out.shape == (*lead, 5)
    torch.testing.assert_close(out, grouped(x), atol=1e-6, rtol=0)
    # member m's rows see member m's weights only
    rows = lead[0] // 3
    for m in range(3):
        want = x[m * rows : (m + 1) * rows] @ grouped.weight[m] + grouped.bias[m, 0]
        torch.testing.assert_close(out[m * rows : (m + 1) * rows], want, atol=1e-6, rtol=0)


def _tiny_hydra() -> Any:
    from tests.methods.test_hydra import _members
    from uqcompress.methods.hydra import fuse

    return fuse(_members("bert", [[[0, 1], [2]], [[3], [0, 1]], [[2], [3]]]))


def test_splitting_a_hydra_replaces_every_grouped_linear_and_keeps_its_outputs() -> None:
    from tests.methods.test_hydra import _batch, _fused

    hydra = _tiny_hydra()
    batch = _batch(hydra)
    before = _fused(hydra, batch)
    grouped = sum(isinstance(m, GroupedLinear) for m in hydra.model.modules())
    assert grouped > 0
    assert split_grouped_linears(hydra.model) == grouped
    assert not any(isinstance(m, GroupedLinear) for m in hydra.model.modules())
    torch.testing.assert_close(_fused(hydra, batch), before, atol=1e-5, rtol=0)
    assert split_grouped_linears(hydra.model) == 0  # nothing left to split


def test_an_exported_hydra_multiplies_by_two_dimensional_weights_only(tmp_path: Path) -> None:
    """ONNX Runtime pre-packs a constant 2-D MatMul weight once; a batched `[M, in, out]`
    one it packs on every call. The export holds no weight of more than 2 dimensions."""
    from uqcompress.export.graph import graph_for
    from uqcompress.export.onnx import export_graph

    hydra = _tiny_hydra()
    path = tmp_path / "hydra.onnx"
    export_graph(graph_for(hydra.model, hydra.input_kind), hydra, path, 18)
    graph = onnx.load(str(path)).graph
    weights = {t.name: len(t.dims) for t in graph.initializer}
    read = {n.input[1] for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights}
    assert read  # the weight MatMuls read initializers directly
    assert all(weights[name] == 2 for name in read)
    batched = _tiny_hydra()
    kept = tmp_path / "batched.onnx"
    export_graph(
        graph_for(batched.model, batched.input_kind), batched, kept, 18, member_gemms=False
    )
    graph = onnx.load(str(kept)).graph
    weights = {t.name: len(t.dims) for t in graph.initializer}
    assert any(
        weights.get(n.input[1]) == 3 for n in graph.node if n.op_type == "MatMul"
    )  # the batched layout, still exportable for comparison


def test_a_hydra_layer_without_heads_exports_and_runs_as_in_torch(tmp_path: Path) -> None:
    """A layer where no member keeps a head adds its output biases alone: the split layers
    give them in the batched layout, and ONNX Runtime computes what torch does."""
    import numpy as np
    import onnxruntime as ort

    from tests.methods.test_hydra import UNEVEN_WITH_EMPTY_LAYER, _members
    from uqcompress.export.graph import graph_for
    from uqcompress.export.onnx import export_graph
    from uqcompress.methods.hydra import fuse

    hydra = fuse(_members("vit", UNEVEN_WITH_EMPTY_LAYER))
    graph = graph_for(hydra.model, hydra.input_kind)
    pixels = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        before = graph(pixels)
    path = tmp_path / "hydra.onnx"
    export_graph(graph, hydra, path, 18)
    with torch.inference_mode():
        after = graph(pixels)  # split in place by the export
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    onnx_out = session.run(None, {session.get_inputs()[0].name: pixels.numpy()})
    assert len(onnx_out) == len(before) == len(after)
    for want, split, got in zip(before, after, onnx_out, strict=True):
        torch.testing.assert_close(split, want, atol=1e-5, rtol=0)
        np.testing.assert_allclose(got, want.numpy(), atol=1e-5, rtol=0)
