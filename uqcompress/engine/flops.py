"""FLOPs per example of the models behind an eval, for `flops_ratio` gates.

Counted by running the model once under torch's FlopCounterMode on one fixed input (text:
one sequence of `TEXT_TOKENS` tokens, or the model's limit if lower; image: one image of
the model's size), so two models of one family are compared on the same input. Matrix
products only (what FlopCounterMode counts), plus attention on CPU, which it does not count
by itself. An ONNX artifact is counted through the model it was exported from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from uqcompress.engine.modality import modality_of
from uqcompress.errors import ArtifactError

TEXT_TOKENS = 128


def _cpu_attention_flops(
    query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any
) -> int:
    """QK^T and AV of `[B, H, T, d]` tensors: 2 multiply-adds of B*H*Tq*Tk*d each."""
    b, h, tq, d = query_shape
    tk = key_shape[2]
    dv = value_shape[3]
    return 2 * b * h * tq * tk * d + 2 * b * h * tq * tk * dv


def model_flops(loaded: Any) -> int:
    """FLOPs of one forward pass of one example. Shape: the fixed input described above."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from uqcompress.models.outputs import member_logits

    tokens = min(TEXT_TOKENS, loaded.max_length or TEXT_TOKENS)  # text only
    inputs = modality_of(loaded.input_kind).example_inputs(loaded, 1, tokens)
    mapping = {}
    cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_sdpa is not None:  # keyed by overload packet; FlopCounterMode wraps the formula
        mapping[cpu_sdpa] = _cpu_attention_flops
    model = loaded.model.eval()
    with torch.inference_mode(), FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        member_logits(model, inputs)
    return int(counter.get_total_flops())


def eval_flops(eval_path: Path) -> int:
    """Total FLOPs per example of every model an eval artifact evaluated (a deep ensemble
    sums its members)."""
    from uqcompress.artifacts import open_artifact

    manifest = open_artifact(eval_path, expect_kind="eval").manifest
    return sum(_source_flops((eval_path / ref.path).resolve()) for ref in manifest.inputs)


def _source_flops(path: Path) -> int:
    from uqcompress.artifacts import MANIFEST_NAME, open_artifact, read_manifest
    from uqcompress.models.loading import load_model, resolve_model_source

    if not path.exists():
        raise ArtifactError(
            f"{path} (an input of the eval) is gone; its FLOPs cannot be counted",
            hint="keep the artifacts a gated eval was made from",
        )
    kind = read_manifest(path).kind if (path / MANIFEST_NAME).is_file() else None
    if kind == "onnx":
        onnx = open_artifact(path, expect_kind="onnx").manifest
        return sum(_source_flops((path / ref.path).resolve()) for ref in onnx.inputs)
    if kind == "members":
        count = int(open_artifact(path, expect_kind="members").manifest.summary["members"])
        return sum(_source_flops(path / f"member{m}") for m in range(count))
    return model_flops(load_model(resolve_model_source(path)))
