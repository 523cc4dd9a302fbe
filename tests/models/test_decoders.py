"""Decoder classifiers: the last real token is read whatever the padding, half-precision
checkpoints load as float32, and a missing padding token is handled as transformers does."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.checkpoints import DECODER_FAMILIES, save_family_checkpoint
from tests.conftest import ok
from uqcompress.models.factory import create_model

TEXT = [7, 30, 120, 45, 9, 301, 66, 12]  # token ids of one text
OTHER = [88, 15, 240, 5, 19, 77, 130, 61, 42, 17, 8, 99]  # a longer one, to pad against


def _padded(rows: list[list[int]], pad: int, left: bool) -> dict[str, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        start = width - len(row) if left else 0
        ids[i, start : start + len(row)] = torch.tensor(row)
        mask[i, start : start + len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def _through_family(loaded: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    family, model = loaded.family, loaded.model
    hidden, mask = family.embed(family.embeddings(model), batch)
    for block in family.blocks(model):
        hidden = family.run_block(block, hidden, mask)
    return family.head(model, hidden, batch["attention_mask"])


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_the_last_real_token_is_read_with_left_or_right_padding(family: str) -> None:
    loaded = create_model(family, ["a", "b", "c"], preset="tiny", seed=2)
    pad = int(loaded.config.pad_token_id)
    alone = _padded([TEXT], pad, left=False)
    with torch.no_grad():
        expected = loaded.model(**alone).logits[0]
        for left in (False, True):
            batch = _padded([OTHER, TEXT], pad, left=left)
            for run in (loaded.model(**batch).logits, _through_family(loaded, batch)):
                torch.testing.assert_close(run[1], expected, rtol=0, atol=1e-5)
    assert not torch.allclose(expected, loaded.model(**_padded([OTHER], pad, False)).logits[0])


def test_a_bfloat16_checkpoint_loads_as_float32(tmp_path: Path, cli: Callable[..., Any]) -> None:
    from transformers import AutoModelForSequenceClassification

    source = save_family_checkpoint("qwen2", tmp_path / "ckpt", ("neg", "pos"))
    model = AutoModelForSequenceClassification.from_pretrained(str(source))
    model.to(torch.bfloat16).save_pretrained(str(source))  # as Hub checkpoints ship
    result = cli("import", source, "--out", tmp_path / "imported", "--json")
    assert result.code == 0, result.err
    payload = json.loads(result.out)
    imported = Path(payload["path"])
    summary = json.loads((imported / "manifest.json").read_text())["summary"]
    assert summary["checkpoint_dtype"] == "bfloat16" and summary["loaded_dtype"] == "float32"
    assert any(
        "stores bfloat16 weights; they were loaded as float32" in w for w in payload["warnings"]
    )
    config = json.loads((imported / "config.json").read_text())
    assert config["dtype"] == "float32"


def test_a_decoder_without_padding_token_pads_with_end_of_text(
    tmp_path: Path, cli: Callable[..., Any], sentiment_csv: dict[str, Path]
) -> None:
    source = save_family_checkpoint("llama", tmp_path / "ckpt", ("neg", "pos"))
    config = json.loads((source / "config.json").read_text())
    config["pad_token_id"] = None
    (source / "config.json").write_text(json.dumps(config))
    tokenizer = json.loads((source / "tokenizer_config.json").read_text())
    tokenizer.pop("pad_token", None)
    (source / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    result = cli("import", source, "--out", tmp_path / "imported", "--json")
    assert result.code == 0, result.err
    payload = json.loads(result.out)
    model = payload["path"]
    note = "has no padding token; the end-of-text token '<|endoftext|>' pads"
    assert any(note in w for w in payload["warnings"])
    # batches of several texts work (transformers alone refuses them without a pad token)
    ok(cli("eval", model, "--data", sentiment_csv["test"], "--out", tmp_path / "eval"))


@pytest.mark.parametrize(
    "family", ["bert", "roberta", "xlm-roberta", "distilbert", "electra", *DECODER_FAMILIES]
)
def test_an_init_models_tokenizer_comes_back_the_same(family: str, tmp_path: Path) -> None:
    from uqcompress.models.loading import load_model, resolve_model_source, save_model

    created = create_model(family, ["a", "b"])
    save_model(created, tmp_path / "m")
    loaded = load_model(resolve_model_source(tmp_path / "m"))
    text = "many among produce a great film"
    assert created.tokenizer is not None and loaded.tokenizer is not None
    expected = created.tokenizer(text)["input_ids"]
    assert loaded.tokenizer(text)["input_ids"] == expected
    assert len(expected) == 8  # [CLS], one token per word, [SEP]: words, not characters


def test_a_bfloat16_checkpoint_imports_and_exports_in_bfloat16(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    """import --dtype bfloat16 keeps the checkpoint's weights as they are (no float32 copy
    written); export traces them widened to float32, behind its parity gate, with float32
    inputs and outputs; quantize --mode fp16 then makes the half-precision graph."""
    import onnx
    from safetensors import safe_open
    from transformers import AutoModelForSequenceClassification

    source = save_family_checkpoint("qwen2", tmp_path / "ckpt", ("neg", "pos"))
    model = AutoModelForSequenceClassification.from_pretrained(str(source))
    model.to(torch.bfloat16).save_pretrained(str(source))
    half = json.loads(cli("import", source, "--dtype", "bfloat16", "--json").out)
    full = json.loads(cli("import", source, "--json").out)
    assert half["id"] != full["id"] and half["summary"]["loaded_dtype"] == "bfloat16"
    with safe_open(str(Path(half["path"]) / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in list(f.keys())} == {"BF16"}
    assert not any("they were loaded as" in w for w in half["warnings"])
    exported = cli("export", half["path"], "--json")
    assert exported.code == 0, exported.err
    onnx_dir = Path(json.loads(exported.out)["path"])
    graph = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False).graph
    float32 = onnx.TensorProto.FLOAT
    assert all(o.type.tensor_type.elem_type == float32 for o in graph.output)
    assert json.loads((onnx_dir / "parity.json").read_text())["passed"]
    data = tmp_path / "d.csv"
    data.write_text("text,label\nhello there,neg\ngood film,pos\nbad film,neg\nnice,pos\n")
    quantized = cli("quantize", onnx_dir, "--mode", "fp16", "--data", data)
    assert quantized.code == 0, quantized.err
