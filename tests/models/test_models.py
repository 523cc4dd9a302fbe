"""Models: presets, save/load round trips through plain transformers, import, tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from uqcompress.artifacts import open_artifact
from uqcompress.errors import ConfigError
from uqcompress.models.factory import create_model
from uqcompress.models.loading import load_model, resolve_model_source, save_model
from uqcompress.models.tiny import tiny_bert, tiny_vit


def test_tiny_presets_match_the_house_plan() -> None:
    for loaded in (tiny_bert(), tiny_vit()):
        config = loaded.config
        assert (config.num_hidden_layers, config.num_attention_heads, config.hidden_size) == (
            2,
            4,
            32,
        )
        assert len(loaded.family.attention_layers(loaded.model)) == 2


def test_same_seed_same_weights_different_seed_different() -> None:
    a, b, c = tiny_vit(seed=0), tiny_vit(seed=0), tiny_vit(seed=1)
    for (name, pa), (_, pb) in zip(
        a.model.state_dict().items(), b.model.state_dict().items(), strict=True
    ):
        assert torch.equal(pa, pb), name
    assert any(
        not torch.equal(pa, pc)
        for pa, pc in zip(a.model.state_dict().values(), c.model.state_dict().values(), strict=True)
    )


def test_model_artifact_loads_with_plain_transformers(
    tiny_bert_artifact: Path, tiny_vit_artifact: Path
) -> None:
    from transformers import (
        AutoModelForImageClassification,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )

    bert = AutoModelForSequenceClassification.from_pretrained(tiny_bert_artifact).eval()
    ours = load_model(resolve_model_source(tiny_bert_artifact))
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_artifact)
    batch = tokenizer(["a great movie", "bad"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(bert(**batch).logits, ours.model(**batch).logits)
    assert bert.config.id2label == {0: "neg", 1: "pos"}
    vit = AutoModelForImageClassification.from_pretrained(tiny_vit_artifact).eval()
    pixels = torch.randn(3, 1, 8, 8)
    ours_vit = load_model(resolve_model_source(tiny_vit_artifact))
    with torch.no_grad():
        reference = vit(pixel_values=pixels).logits
        assert torch.equal(reference, ours_vit.model(pixel_values=pixels).logits)
    assert ours_vit.preprocessing is not None and ours_vit.preprocessing.num_channels == 1
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(tiny_vit_artifact)
    assert processor.rescale_factor == pytest.approx(1 / 255)
    assert list(processor.image_mean) == [0.5] and processor.do_resize is True
    assert processor.size == {"height": 8, "width": 8}  # images of any size are resized


def test_padded_batch_gives_the_same_logits_as_single_examples() -> None:
    loaded = tiny_bert()
    assert loaded.tokenizer is not None
    texts = ["a great great movie with fun acting", "bad"]
    padded = loaded.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        together = loaded.model(**padded).logits
        for i, text in enumerate(texts):
            alone = loaded.model(**loaded.tokenizer([text], return_tensors="pt")).logits
            torch.testing.assert_close(together[i : i + 1], alone, atol=1e-5, rtol=0)


def test_shipped_tokenizer_knows_common_words() -> None:
    loaded = tiny_bert()
    assert loaded.tokenizer is not None
    tokens = loaded.tokenizer.tokenize("This movie was great, I loved it!")
    assert "[UNK]" not in tokens and tokens[:2] == ["this", "movie"]


def test_import_of_a_transformers_directory(
    cli,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    sentiment_csv: dict[str, Path],
) -> None:
    source = tmp_path / "hf-model"
    loaded = create_model("bert", ["neg", "pos"], seed=3)
    save_model(loaded, source)
    first = cli("import", str(source))
    assert first.code == 0, first.err
    artifact = open_artifact(Path(first.out.strip()), expect_kind="model")
    assert artifact.manifest.step == "import"
    assert artifact.manifest.inputs == []  # the hashed lineage root
    assert artifact.manifest.summary["labels"] == ["neg", "pos"]
    again = cli("import", str(source))
    assert again.out == first.out  # same content, same id: reused
    # A step also takes the directory directly, and records it as an external root.
    direct = cli("eval", str(source), "--data", str(sentiment_csv["test"]), "--json")
    assert direct.code == 0, direct.err
    import json

    payload = json.loads(direct.out)
    manifest = open_artifact(Path(payload["path"])).manifest
    assert manifest.inputs[0].kind == "transformers-dir"
    assert manifest.inputs[0].id.startswith("dir-")


def test_import_refuses_text_model_without_tokenizer(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "no-tok"
    create_model("bert", ["a", "b"]).model.save_pretrained(source)
    result = cli("import", str(source))
    assert result.code == 1
    assert "no tokenizer" in result.err


def test_bad_presets_and_configs_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown preset"):
        create_model("vit", ["a", "b"], preset="huge")
    with pytest.raises(ConfigError, match="not a multiple"):
        create_model("vit", ["a", "b"], image_size=9, patch_size=2)
    with pytest.raises(ConfigError, match="image families only"):
        create_model("bert", ["a", "b"], image_size=8)
    with pytest.raises(ConfigError, match="not a multiple of num_attention_heads"):
        create_model("bert", ["a", "b"], overrides={"num_attention_heads": 5})
