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


def test_init_builds_directly_in_a_half_dtype(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """--dtype bfloat16: weights written as bfloat16 (config.json says so), a distinct id,
    and the size bound counts 2 bytes per weight (a 1.5B shape builds, as float32 it does not)."""
    import json

    from safetensors import safe_open

    common = ("init", "--family", "llama", "--preset", "tiny", "--labels", "neg,pos", "--json")
    half = json.loads(cli(*common, "--dtype", "bfloat16").out)
    full = json.loads(cli(*common).out)
    assert half["id"] != full["id"] and half["summary"]["dtype"] == "bfloat16"
    with safe_open(str(Path(half["path"]) / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in list(f.keys())} == {"BF16"}
    assert json.loads((Path(half["path"]) / "config.json").read_text())["dtype"] == "bfloat16"
    from uqcompress.errors import ConfigError
    from uqcompress.models.factory import _check_size
    from uqcompress.models.families import family_by_name

    family = family_by_name("qwen2")
    sizes = {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12}
    sizes |= {"num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936}
    config = family.build_config("base", sizes, ["neg", "pos"], None, None)
    _check_size(family, config, "bfloat16")  # 2.9 GiB: within the bound
    with pytest.raises(ConfigError, match=r"5\.8 GiB in float32"):
        _check_size(family, config, "float32")
