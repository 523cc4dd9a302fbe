"""GGUF checkpoints (uqcompress/models/gguf.py): `uqc import model.gguf` on files this test
writes with the `gguf` package's GGUFWriter from tiny models built from config.

How a file is written here (`write_gguf`), as llama.cpp's convert_hf_to_gguf.py does for the
three architectures:

- weights under llama.cpp's tensor names (`token_embd`, `blk.N.attn_q`, ..., `output_norm`),
  the query and key projections of `llama` files row-permuted as llama.cpp permutes them (the
  loader undoes it; qwen2/qwen3 files are not permuted); 1-D tensors (norms, biases) always
  F32, the matrices F32, F16 or Q8_0; no `output.weight` (the classifier has no LM head, so
  the file reads as one with tied embeddings);
- the metadata transformers maps onto the config: context length, embedding length, block
  count, feed-forward length, head counts, rope dimension count and base, RMS epsilon,
  `attention.key_length` (Qwen3's head_dim), `general.file_type`;
- the tokenizer: the tiny decoders' byte-level BPE (tests/checkpoints.py) as a `gpt2`-model
  GGUF tokenizer: `tokenizer.ggml.tokens` in id order, `token_type` (3, CONTROL, for the one
  special token `<|endoftext|>`, 1 for the rest), `merges` from its tokenizer.json, and the
  bos/eos (and, unless asked not to, padding) ids, all `<|endoftext|>`. No `tokenizer.ggml.pre`:
  transformers then keeps GPT-2's split, the one that tokenizer was trained with, so the
  file's tokenizer gives the source's ids (asserted). That is the smallest honest tokenizer
  metadata transformers' GGUF loader accepts; no scores are needed for a `gpt2` model.

Mistral: llama.cpp writes it as a `llama` file; `write_gguf("mistral", ...)` does the same,
named "mistral" (the name transformers relabels, which uqc repairs).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.checkpoints import family_tokenizer
from tests.conftest import ok, sentiment_rows, write_csv
from uqcompress.artifacts import open_artifact

gguf = pytest.importorskip("gguf")

GGUF_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
TEXTS = ["the movie was really good", "awful and boring", "it", "great acting, dull story"]
FILE_TYPE = {"F32": 0, "F16": 1, "Q8_0": 7}

# transformers module name -> llama.cpp tensor name (per block, then outside the blocks)
_BLOCK_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
_TOP_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm"}


def _gguf_name(key: str) -> str:
    """`model.layers.1.mlp.up_proj.weight` -> `blk.1.ffn_up.weight`."""
    module, leaf = key.rsplit(".", 1)
    if module in _TOP_NAMES:
        return f"{_TOP_NAMES[module]}.{leaf}"
    _, _, block, part = module.split(".", 3)
    return f"blk.{block}.{_BLOCK_NAMES[part]}.{leaf}"


def _llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order for a `llama` file's q/k projection (rotary halves interleaved)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _stored(array: np.ndarray, storage: str) -> tuple[np.ndarray, Any]:
    """What the file holds for a float32 tensor (1-D tensors stay F32, as llama.cpp keeps
    them), and the raw ggml type to write it as (None: numpy's own dtype)."""
    if array.ndim == 1 or storage == "F32":
        return array, None
    if storage == "F16":
        return array.astype(np.float16), None
    q8 = gguf.GGMLQuantizationType.Q8_0
    return gguf.quants.quantize(array, q8), q8


def expected_weight(value: torch.Tensor, storage: str) -> torch.Tensor:
    """The float32 weight a loader must recover from a tensor written as `storage`."""
    array = value.numpy()
    if array.ndim == 1 or storage == "F32":
        return value
    if storage == "F16":
        return value.half().float()
    q8 = gguf.GGMLQuantizationType.Q8_0
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(array, q8), q8))


def _write_tokenizer(writer: Any, tokenizer: Any, padding: bool) -> None:
    saved = json.loads(tokenizer.backend_tokenizer.to_str())
    tokens: list[str] = [""] * len(tokenizer)
    for token, index in saved["model"]["vocab"].items():
        tokens[index] = token
    special = {entry["id"] for entry in saved["added_tokens"]}
    for entry in saved["added_tokens"]:
        tokens[entry["id"]] = entry["content"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in saved["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    writer.add_token_merges(merges)
    end = int(tokenizer.eos_token_id)
    writer.add_bos_token_id(end)
    writer.add_eos_token_id(end)
    if padding:
        writer.add_pad_token_id(end)


def write_gguf(
    family: str,
    path: Path,
    storage: str = "F32",
    *,
    file_type: bool = True,
    padding: bool = True,
    drop: tuple[str, ...] = (),
    seed: int = 0,
) -> tuple[Path, Any, Any]:
    """Write a tiny `family` decoder (random weights from `seed`) as a GGUF file; returns the
    file, the source classifier (its decoder is what the file holds) and its tokenizer.
    `drop`: llama.cpp tensor names to leave out (an incomplete file)."""
    from uqcompress.models.families import family_by_name

    tokenizer = family_tokenizer(family)
    impl = family_by_name(family)
    overrides = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
    config: Any = impl.build_config("tiny", overrides, ["neg", "pos"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = impl.classifier_class()(config).eval()
    architecture = "llama" if family == "mistral" else family
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(family if family == "mistral" else f"tiny {family}")
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(int(config.num_attention_heads))
    writer.add_head_count_kv(int(config.num_key_value_heads))
    head_dim = int(getattr(config, "head_dim", None) or 0) or (
        config.hidden_size // config.num_attention_heads
    )
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    if file_type:
        writer.add_file_type(FILE_TYPE[storage])
    _write_tokenizer(writer, tokenizer, padding)
    for key, value in model.state_dict().items():
        if key.startswith("score."):
            continue
        name = _gguf_name(key)
        if name in drop:
            continue
        array = value.numpy().astype(np.float32)
        if architecture == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_attention_heads if "attn_q" in name else config.num_key_value_heads
            array = _llama_cpp_permute(array, int(heads))
        data, raw_type = _stored(array, storage)
        writer.add_tensor(name, data, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, model, tokenizer


def _manifest(path: Path) -> Any:
    return open_artifact(path).manifest


def _decoder_weights(model: Any) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if not k.startswith("score.")}


def _logits(model: Any, tokenizer: Any) -> torch.Tensor:
    with torch.no_grad():
        batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
        return model(**batch).logits  # type: ignore[no-any-return]


@pytest.mark.parametrize("family", GGUF_FAMILIES)
def test_gguf_import_holds_the_source_weights_exactly(
    family: str, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    """A float32 GGUF file: every decoder weight comes back bit for bit, the tokenizer from
    the metadata splits as the source's, and with the source's head the logits are equal."""
    from transformers import AutoTokenizer

    from uqcompress.models.loading import load_model, resolve_model_source

    file, source, source_tokenizer = write_gguf(family, tmp_path / f"{family}.gguf", seed=4)
    imported = Path(ok(cli("import", file, "--out", tmp_path / "imported")))
    manifest = _manifest(imported)
    summary = manifest.summary
    expected_family = "llama" if family == "mistral" else family
    assert summary["family"] == expected_family
    assert summary["source_format"] == "gguf"
    assert summary["gguf_architecture"] == ("llama" if family == "mistral" else family)
    assert summary["gguf_quantization"] == "F32"
    assert summary["gguf_tensor_types"] == {"F32": len(_decoder_weights(source))}
    assert summary["classifier_initialised"] is True
    assert any("no classifier weights (score.weight)" in w for w in manifest.warnings)
    assert any("fine-tune before use" in w for w in manifest.warnings)
    assert not any("dequantized" in w for w in manifest.warnings)

    loaded = load_model(resolve_model_source(imported))
    assert loaded.family.name == expected_family
    weights = _decoder_weights(loaded.model)
    assert weights.keys() == _decoder_weights(source).keys()
    for key, value in _decoder_weights(source).items():
        assert torch.equal(weights[key], value), key

    tokenizer = AutoTokenizer.from_pretrained(str(imported))
    assert tokenizer(TEXTS)["input_ids"] == source_tokenizer(TEXTS)["input_ids"]
    source.score.weight.data.copy_(loaded.model.score.weight.data)
    source_tokenizer.padding_side = tokenizer.padding_side
    assert torch.allclose(
        _logits(loaded.model, tokenizer), _logits(source, source_tokenizer), atol=1e-6
    )


@pytest.mark.parametrize("storage", ["F16", "Q8_0"])
def test_gguf_half_and_quantized_weights_are_dequantized_to_float32(
    storage: str, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    """F16 matrices come back as the source rounded to fp16; Q8_0 ones as gguf's own
    dequantization of the quantized source; norms (stored F32) exactly. The summary and a
    warning record the file's quantization."""
    from uqcompress.models.loading import load_model, resolve_model_source

    file, source, _ = write_gguf("llama", tmp_path / "llama.gguf", storage, seed=2)
    imported = Path(ok(cli("import", file, "--out", tmp_path / "imported")))
    manifest = _manifest(imported)
    assert manifest.summary["gguf_quantization"] == storage
    assert set(manifest.summary["gguf_tensor_types"]) == {storage, "F32"}
    said = {
        "F16": "stores F16 weights; loaded as float32",
        "Q8_0": "stores Q8_0 weights; they were dequantized to float32",
    }
    assert any(said[storage] in w for w in manifest.warnings), manifest.warnings
    loaded = load_model(resolve_model_source(imported))
    assert all(p.dtype == torch.float32 for p in loaded.model.parameters())
    weights = _decoder_weights(loaded.model)
    for key, value in _decoder_weights(source).items():
        assert torch.equal(weights[key], expected_weight(value, storage)), key
    changed = [k for k, v in _decoder_weights(source).items() if not torch.equal(weights[k], v)]
    assert changed  # the matrices were rounded: the test would not see a float32 file


def test_gguf_without_a_file_type_records_its_tensor_types(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    file, _, _ = write_gguf("qwen2", tmp_path / "q.gguf", "F16", file_type=False)
    imported = Path(ok(cli("import", file, "--out", tmp_path / "imported")))
    assert _manifest(imported).summary["gguf_quantization"] == "F16+F32"


def test_imported_gguf_model_evaluates_and_pads_with_end_of_text(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    """A file without a padding id (as most llama.cpp files are): the end-of-text token pads,
    a note says so, and the artifact fine-tunes and evaluates through its own tokenizer. A
    folder holding the one .gguf file imports the same artifact (same id)."""
    folder = tmp_path / "folder"
    folder.mkdir()
    file, _, _ = write_gguf("llama", folder / "model.gguf", padding=False)
    imported = Path(ok(cli("import", file, "--out", tmp_path / "imported")))
    manifest = _manifest(imported)
    assert any("the end-of-text token '<|endoftext|>' pads" in w for w in manifest.warnings)
    assert json.loads((imported / "config.json").read_text())["pad_token_id"] is not None
    # as with any headless checkpoint: fine-tune (a head sized from the data), then evaluate
    data = write_csv(tmp_path / "data.csv", list(sentiment_rows(24, seed=5)))
    tuned = ok(cli("finetune", imported, "--data", data, "--epochs", "1", "--out", tmp_path / "t"))
    assert _manifest(Path(tuned)).summary["labels"] == ["neg", "pos"]
    evaluated = ok(cli("eval", tuned, "--data", data, "--out", tmp_path / "eval"))
    metrics = json.loads((Path(evaluated) / "metrics.json").read_text())
    assert 0.0 <= metrics["acc"] <= 1.0
    again = Path(ok(cli("import", folder, "--out", tmp_path / "again")))
    assert _manifest(again).id == manifest.id


def _one_line_failure(result: Any, out: Path) -> str:
    """The refusal every bad input gets: exit 1, one line (plus its hint), no artifact."""
    assert result.code == 1, result.err
    assert result.out == ""
    assert "Traceback" not in result.err
    assert not out.exists()
    assert not any(p.name.startswith(".") for p in out.parent.iterdir()), "temp dir left"
    return str(result.err.strip().splitlines()[0])


@pytest.mark.parametrize("architecture", ["gpt2", "phi3"])
def test_gguf_of_an_unsupported_architecture_is_refused(
    architecture: str, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    path = tmp_path / f"{architecture}.gguf"
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    line = _one_line_failure(cli("import", path, "--out", tmp_path / "x"), tmp_path / "x")
    assert f"holds a '{architecture}' model" in line
    assert "llama, qwen2, qwen3" in line


@pytest.mark.parametrize("keep", [0, 11, 200, 0.5, -100])
def test_damaged_or_truncated_gguf_is_refused(
    keep: float, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    """Cut anywhere (in the magic, the metadata, the tensor data) or not GGUF at all."""
    file, _, _ = write_gguf("qwen2", tmp_path / "whole.gguf")
    data = file.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep % len(data)
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(data[:cut] if cut else b"not a gguf file, just text\n" * 4)
    line = _one_line_failure(cli("import", damaged, "--out", tmp_path / "x"), tmp_path / "x")
    assert "is not a readable GGUF file, damaged or truncated" in line


def test_incomplete_gguf_is_refused_not_filled_at_random(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    file, _, _ = write_gguf("qwen3", tmp_path / "q.gguf", drop=("blk.1.ffn_down.weight",))
    line = _one_line_failure(cli("import", file, "--out", tmp_path / "x"), tmp_path / "x")
    assert "has no tensors for model.layers.1.mlp.down_proj.weight" in line


def test_gguf_folder_of_several_files_or_a_missing_file_is_refused(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    folder = tmp_path / "two"
    folder.mkdir()
    write_gguf("llama", folder / "a.gguf")
    write_gguf("llama", folder / "b.gguf", "F16")
    line = _one_line_failure(cli("import", folder, "--out", tmp_path / "x"), tmp_path / "x")
    assert "holds 2 GGUF files (a.gguf, b.gguf)" in line
    missing = cli("import", tmp_path / "nope.gguf", "--out", tmp_path / "x")
    assert "nope.gguf does not exist" in _one_line_failure(missing, tmp_path / "x")


def test_gguf_import_without_the_gguf_package_names_the_extra(
    tmp_path: Path, cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    file, _, _ = write_gguf("llama", tmp_path / "llama.gguf")
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    result = cli("import", file, "--out", tmp_path / "x")
    line = _one_line_failure(result, tmp_path / "x")
    assert "needs the gguf package" in line
    assert 'pip install "uqcompress[gguf]"' in result.err


def test_gguf_file_types_read_as_llama_cpp_names_them() -> None:
    from uqcompress.models.gguf import file_type_name

    assert [file_type_name(gguf, value) for value in (0, 1, 7, 15, 32)] == [
        "F32",
        "F16",
        "Q8_0",
        "Q4_K_M",
        "BF16",
    ]
    assert file_type_name(gguf, 9999) == "file type 9999"  # a newer llama.cpp's
