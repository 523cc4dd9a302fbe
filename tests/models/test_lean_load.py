"""models.lean_load: a checkpoint is loaded, cast and copied one tensor at a time, each
tensor's mapped pages released after it; the weights are exactly transformers' and
safetensors' own, and the peak is one copy of them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from tests.process_memory import reset_peak, status
from uqcompress.models.factory import create_model
from uqcompress.models.lean_load import cast_in_place, load_streamed, release_pages
from uqcompress.models.loading import cast_loaded, load_model, resolve_model_source, save_model

FAMILIES = ["bert", "distilbert", "llama", "qwen3", "mistral", "vit", "dinov2"]


def _saved(family: str, dtype: str, directory: Path, **config: Any) -> Path:
    loaded = create_model(family, ["a", "b"], "tiny", overrides=config or None)
    cast_loaded(loaded, dtype)
    save_model(loaded, directory)
    return directory


def test_a_bfloat16_checkpoint_loads_as_float32_with_one_copy_in_memory(tmp_path: Path) -> None:
    """Loading raises the peak RSS by about the float32 weights, not by them plus the
    bfloat16 file's pages (transformers' own cast: about 1.5x them)."""
    directory = _saved(
        "llama", "bfloat16", tmp_path / "m", hidden_size=512, intermediate_size=2048,
        num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=8,
    )  # fmt: skip
    # the first load's one-time costs (imports, kernels) are not the weights': paid before
    load_model(resolve_model_source(_saved("llama", "bfloat16", tmp_path / "t")), "float32")
    reset_peak()
    start = status("VmRSS")
    loaded = load_model(resolve_model_source(directory), dtype="float32")
    rise = status("VmHWM") - start
    weights = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    assert weights > 80 * 2**20  # large enough for the pages to show
    assert rise < 1.2 * weights, rise / weights


def _transformers_model(directory: Path, dtype: str) -> Any:
    """What transformers itself loads (its own cast while the file is mapped)."""
    from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification

    loader = (
        AutoModelForImageClassification
        if (directory / "preprocessor_config.json").exists()
        else AutoModelForSequenceClassification
    )
    return loader.from_pretrained(str(directory), dtype=getattr(torch, dtype))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("stored", "wanted"), [("bfloat16", "float32"), ("float32", "bfloat16")])
def test_a_cast_load_holds_exactly_what_transformers_loads(
    tmp_path: Path, family: str, stored: str, wanted: str
) -> None:
    directory = _saved(family, stored, tmp_path / "m")
    torch.manual_seed(0)
    loaded = load_model(resolve_model_source(directory), dtype=wanted)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    reference = _transformers_model(directory, wanted)
    expected = dict(reference.state_dict())
    assert torch.equal(after, torch.get_rng_state())  # the random state moved as it does there
    got = loaded.model.state_dict()
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name
    # the buffers a model computes and does not save too (rotary inv_freq stays float32)
    computed, buffers = dict(loaded.model.named_buffers()), dict(reference.named_buffers())
    assert set(computed) == set(buffers)
    for name, tensor in buffers.items():
        assert computed[name].dtype == tensor.dtype and torch.equal(computed[name], tensor), name
    assert loaded.model.config.dtype == getattr(torch, wanted)
    assert loaded.checkpoint_dtype == (stored if stored != "float32" else None)


def test_a_checkpoint_without_a_head_gets_the_head_transformers_initialises(
    tmp_path: Path,
) -> None:
    """The new head is initialised in the dtype asked for, as before (transformers' cast)."""
    from safetensors.torch import load_file

    directory = _saved("bert", "bfloat16", tmp_path / "m")
    weights = load_file(str(directory / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if not k.startswith("classifier")},
              str(directory / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    torch.manual_seed(0)
    loaded = load_model(resolve_model_source(directory), dtype="float32")
    torch.manual_seed(0)
    expected = dict(_transformers_model(directory, "float32").state_dict())
    assert loaded.new_head_keys == ["classifier.bias", "classifier.weight"]
    for name, tensor in expected.items():
        assert torch.equal(loaded.model.state_dict()[name], tensor), name


def test_cast_in_place_keeps_a_shared_tensor_shared() -> None:
    first = torch.nn.Linear(4, 4).to(torch.bfloat16)
    second = torch.nn.Linear(4, 4).to(torch.bfloat16)
    second.weight = first.weight  # tied
    model = torch.nn.Sequential(first, second)
    before = first.weight.detach().float().clone()
    cast_in_place(model, torch.float32)
    assert first.weight is second.weight
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert torch.equal(first.weight, before)


def _big(tmp_path: Path, dtype: torch.dtype) -> tuple[Path, dict[str, torch.Tensor]]:
    """A 64 MiB (float32) safetensors file of 8 tensors."""
    generator = torch.Generator().manual_seed(0)
    tensors = {
        f"layers.{i}.weight": torch.randn(1024, 2048, generator=generator).to(dtype)
        for i in range(8)
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    return path, tensors


class _Layers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(2048, 1024, bias=False) for _ in range(8))


def test_release_pages_drops_a_mapped_tensors_pages_and_keeps_its_values(
    tmp_path: Path,
) -> None:
    from safetensors import safe_open

    path, tensors = _big(tmp_path, torch.float32)
    with safe_open(str(path), "pt") as handle:
        mapped = handle.get_tensor("layers.3.weight")
    expected = tensors["layers.3.weight"]
    assert torch.equal(mapped, expected)  # reads (maps in) all 8 MiB of its pages
    resident = status("RssFile")
    release_pages(mapped)
    assert resident - status("RssFile") > 6 * 2**20  # most of its 8 MiB left the RSS
    assert torch.equal(mapped, expected)  # read again from the file when touched


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_load_streamed_copies_one_tensor_at_a_time(tmp_path: Path, stored: torch.dtype) -> None:
    """The weights are safetensors' own; the load raises the peak RSS by about the float32
    weights (64 MiB), not by them plus the file's pages (safetensors' load_model: +64 MiB
    more from a float32 file)."""
    path, tensors = _big(tmp_path, stored)
    model = _Layers()  # float32, built before the load (as a skeleton is)
    load_streamed(model, path)  # the first load's one-time costs, paid before measuring
    reset_peak()
    start = status("VmRSS")
    load_streamed(model, path)
    rise = status("VmHWM") - start
    for i, layer in enumerate(model.layers):
        assert torch.equal(layer.weight, tensors[f"layers.{i}.weight"].float())
    assert rise < 0.5 * 64 * 2**20, rise / 2**20  # the weights were allocated before


def test_load_streamed_refuses_what_does_not_fit(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    model = torch.nn.Linear(3, 2)
    for tensors, message in [
        ({"weight": torch.zeros(2, 3)}, "missing ['bias']"),
        ({"weight": torch.zeros(2, 3), "bias": torch.zeros(2), "x": torch.zeros(1)},
         "unexpected ['x']"),
        ({"weight": torch.zeros(3, 3), "bias": torch.zeros(2)}, "weight has shape [3, 3]"),
    ]:  # fmt: skip
        save_file(tensors, str(path))
        before = model.weight.detach().clone()
        with pytest.raises(ValueError, match=re.escape(message)):
            load_streamed(model, path)
        assert torch.equal(model.weight, before)  # nothing copied
