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
