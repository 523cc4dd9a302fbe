"""Model loading turns a library's exception into one line, even one without a message."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from uqcompress.errors import ConfigError
from uqcompress.models.loading import first_line, load_model, resolve_model_source


@pytest.mark.parametrize("raised", [KeyError(), OSError(""), ValueError("\n  \n")])
def test_unreadable_config_with_an_empty_message_is_one_line(
    tiny_bert_artifact: Path, monkeypatch: pytest.MonkeyPatch, raised: Exception
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise raised

    source = resolve_model_source(tiny_bert_artifact)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", fail)
    with pytest.raises(ConfigError) as caught:
        load_model(source)
    message = str(caught.value)
    assert "cannot be read by transformers" in message
    assert f"({type(raised).__name__})" in message and "\n" not in message


def test_first_line_skips_blank_lines_and_joins_a_trailing_colon() -> None:
    assert first_line(KeyError()) == "KeyError"
    assert first_line(ValueError("\n\n  real cause  \nmore")) == "real cause"
    assert first_line(ValueError("while loading:\n  bad shape")) == "while loading: bad shape"


def _checkpoint(tmp_path: Path, family: str, name: str) -> Path:
    """A transformers directory (no manifest): its files are read as they are."""
    from uqcompress.models.factory import create_model
    from uqcompress.models.loading import save_model

    path = tmp_path / name
    save_model(create_model(family, ["neg", "pos"]), path)
    return path


@pytest.mark.parametrize(
    ("name", "body", "message"),
    [
        ("tokenizer.json", "{}", "tokenizer.json is broken: it has no 'model' or 'added_tokens'"),
        ("tokenizer.json", "[]", "tokenizer.json is broken: it holds list, not a JSON object"),
        ("tokenizer.json", "{oops", "tokenizer.json is broken: not valid JSON (JSONDecodeError"),
        ("tokenizer_config.json", "{", "tokenizer_config.json is broken: not valid JSON"),
    ],
)
def test_a_broken_tokenizer_file_is_named_not_called_missing(
    tmp_path: Path, cli, name: str, body: str, message: str
) -> None:  # type: ignore[no-untyped-def]
    """`{}` as tokenizer.json gave KeyError: 'added_tokens' (a traceback); an unparsable one
    was reported as "no tokenizer files"."""
    path = _checkpoint(tmp_path, "bert", "broken-tok")
    (path / name).write_text(body)
    result = cli("import", str(path), "--out", str(tmp_path / "imported"))
    assert result.code == 1 and result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and f"{path / name}" in lines[0] and message in lines[0], result.err
    assert "no tokenizer files" not in lines[0]
    assert not (tmp_path / "imported").exists()


def test_a_tokenizer_the_library_cannot_build_is_broken_not_missing(tmp_path: Path) -> None:
    from uqcompress.errors import ArtifactError

    path = _checkpoint(tmp_path, "bert", "bad-model")
    (path / "tokenizer.json").write_text(
        '{"version": "1.0", "model": {"type": "WordPiece"}, "added_tokens": []}'
    )
    with pytest.raises(ArtifactError, match=r"the tokenizer in .*bad-model \(tokenizer\.json"):
        load_model(resolve_model_source(path))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"size": {"height": -8, "width": -8}}, "size.height is -8; a side must be 1..8192"),
        ({"size": 0}, "size is 0; a side must be 1..8192"),
        ({"size": {"height": 10**9, "width": 8}}, "size.height is 1000000000"),
        ({"size": {"height": "8", "width": 8}}, "size.height is '8', not a whole number"),
        ({"rescale_factor": -1}, "rescale_factor is -1, not a positive number"),
        ({"image_std": [0.0]}, "image_std [0.0] has a zero"),
        ({"image_mean": [0.5, 0.5]}, "image_mean has 2 values; the model has 1 channel"),
        ({"image_mean": "x"}, "image_mean is 'x', not a number or a list of numbers"),
        ({"resample": 99}, "resample is 99, not a PIL filter number"),
        ({"do_resize": "yes"}, "do_resize is 'yes', not true or false"),
        (
            {"do_center_crop": True, "crop_size": {"height": -1, "width": 8}},
            "crop_size.height is -1",
        ),
    ],
)
def test_import_and_load_refuse_an_invalid_image_processor_config(
    tmp_path: Path, cli, edit: dict[str, object], message: str
) -> None:  # type: ignore[no-untyped-def]
    """A negative resize was accepted by `uqc import` and failed in PIL with a traceback."""
    import json

    from uqcompress.errors import ArtifactError

    path = _checkpoint(tmp_path, "vit", "bad-prep")
    config_path = path / "preprocessor_config.json"
    config = json.loads(config_path.read_text())
    config.update(edit)
    config_path.write_text(json.dumps(config))
    result = cli("import", str(path), "--out", str(tmp_path / "imported"))
    assert result.code == 1 and result.out == "", result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "is not a valid image-processor config: " + message in lines[0]
    assert not (tmp_path / "imported").exists()
    with pytest.raises(ArtifactError, match="is not a valid image-processor config"):
        load_model(resolve_model_source(path))
