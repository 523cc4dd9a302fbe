"""`uqc init` refuses configs that cannot make a working model, in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from uqcompress.artifacts import open_artifact
from uqcompress.models.factory import create_model
from uqcompress.models.loading import save_model


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "num_hidden_layers=abc"], "num_hidden_layers"),
        (["--set", "num_attention_heads=0"], "num_attention_heads=0"),
        (["--set", "hidden_size=0"], "hidden_size=0"),
        (["--set", "num_channels=0"], "num_channels=0"),
        (["--image-size", "0"], "--image-size 0"),
        (["--patch-size", "-1"], "--patch-size -1"),
    ],
)
def test_impossible_vit_configs(cli, args: list[str], needle: str) -> None:  # type: ignore[no-untyped-def]
    result = cli("init", "--family", "vit", "--labels", "a,b", *args)
    assert result.code == 1, result.err
    assert needle in result.err and result.err.count("\n") == 1 and "Traceback" not in result.err


def test_bert_vocab_must_cover_the_tokenizer(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("init", "--family", "bert", "--labels", "a,b", "--set", "vocab_size=5")
    assert result.code == 1 and "smaller than the shipped tokenizer" in result.err


def test_import_of_an_encoder_without_head_warns(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    loaded = create_model("bert", ["a", "b"])
    encoder = tmp_path / "encoder"
    loaded.model.bert.save_pretrained(encoder)  # headless: no classifier weights
    assert loaded.tokenizer is not None
    loaded.tokenizer.save_pretrained(encoder)
    result = cli("import", str(encoder))
    assert result.code == 0, result.err
    manifest = open_artifact(Path(result.out.strip())).manifest
    assert manifest.summary["classifier_initialised"] is True
    assert any("no classifier weights" in w for w in manifest.warnings)


def test_import_of_damaged_weights_is_one_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "damaged"
    save_model(create_model("bert", ["a", "b"]), source)
    (source / "model.safetensors").write_bytes(b"garbage")
    result = cli("import", str(source))
    assert result.code == 1 and "cannot load the model" in result.err
    assert result.err.count("\n") == 1
