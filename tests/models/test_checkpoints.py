"""Real checkpoints: headless encoders, Hub ids (offline here), checkpoints with own code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import write_csv
from uqcompress.artifacts import open_artifact
from uqcompress.models.factory import create_model


@pytest.fixture
def encoder_dir(tmp_path: Path) -> Path:
    """A sentence-encoder-like checkpoint: BertModel weights, tokenizer, no classifier."""
    loaded = create_model("bert", ["a", "b"], seed=5)
    path = tmp_path / "encoder"
    loaded.model.bert.save_pretrained(path)
    assert loaded.tokenizer is not None
    loaded.tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def three_class_csv(tmp_path: Path) -> Path:
    rows = [("good great film", "pos"), ("bad awful film", "neg"), ("the film", "meh")] * 8
    return write_csv(tmp_path / "three.csv", rows)


@pytest.mark.parametrize("via_import", [True, False])
def test_headless_encoder_gets_a_head_sized_from_the_data(
    cli,
    encoder_dir: Path,
    three_class_csv: Path,
    via_import: bool,  # type: ignore[no-untyped-def]
) -> None:
    model = cli("import", str(encoder_dir)).out.strip() if via_import else str(encoder_dir)
    tuned = cli("finetune", model, "--data", str(three_class_csv), "--epochs", "1")
    assert tuned.code == 0, tuned.err
    manifest = open_artifact(Path(tuned.out.strip())).manifest
    assert manifest.summary["labels"] == ["meh", "neg", "pos"]
    assert manifest.summary["classifier_initialised"] is True
    assert any("new head for 3 classes" in w for w in manifest.warnings)
    config = json.loads((Path(tuned.out.strip()) / "config.json").read_text())
    assert config["id2label"] == {"0": "meh", "1": "neg", "2": "pos"}
    assert cli("eval", tuned.out.strip(), "--data", str(three_class_csv)).code == 0
    # The trained head is kept by the next training step (only an import's flag means
    # "never trained"): a second finetune starts from it, with no new-head warning.
    again = cli("finetune", tuned.out.strip(), "--data", str(three_class_csv), "--epochs", "1")
    assert again.code == 0, again.err
    second = open_artifact(Path(again.out.strip())).manifest
    assert not any("new head" in w for w in second.warnings)


def test_hub_ids_fail_cleanly_offline(cli, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = cli("import", "some-org/some-model")
    assert result.code == 1
    assert "Hugging Face Hub id" in result.err and "HF_HUB_OFFLINE" in result.err


def test_checkpoints_with_their_own_code_need_a_yes(cli, encoder_dir: Path) -> None:  # type: ignore[no-untyped-def]
    config_path = encoder_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = {"AutoModel": "modeling_custom.CustomModel"}
    config_path.write_text(json.dumps(config))
    refused = cli("import", str(encoder_dir))
    assert refused.code == 1 and "--trust-remote-code" in refused.err
    accepted = cli("import", str(encoder_dir), "--trust-remote-code")
    assert accepted.code == 0, accepted.err


@pytest.mark.parametrize(
    "spec", ["art/nope", "./nope", "~/nope-uqc-i26", "/nope-uqc-i26/x", "a/b/c", "nope"]
)
def test_a_mistyped_local_path_is_not_a_hub_id(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    """Issue 26 item 2: a spec that looks like a path gets one line at once, no Hub lookup."""
    from uqcompress.models import loading

    def no_hub(repo_id: str) -> Path:
        raise AssertionError(f"{repo_id} was looked up on the Hub")

    monkeypatch.setattr(loading, "download_from_hub", no_hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "art").mkdir()  # `art/nope`: art exists, so a local path
    for command in (["eval", spec, "--data", "x.csv"], ["import", spec], ["export", spec]):
        result = cli(*command)
        assert result.code == 1 and result.out == ""
        lines = result.err.strip().splitlines()
        assert len(lines) == 1 and "does not exist (no such directory" in lines[0], result.err


def test_org_name_without_a_local_org_folder_is_still_a_hub_id(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from uqcompress.models.loading import is_hub_id

    monkeypatch.chdir(tmp_path)
    assert is_hub_id("some-org/some-model") and is_hub_id("bert/bert-base-uncased")
    (tmp_path / "some-org").mkdir()
    assert not is_hub_id("some-org/some-model")  # now a local path under ./some-org
    assert not any(is_hub_id(s) for s in ("./a/b", "~/a", "/a/b", "a/b/c", "a\\b", "a"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = cli("import", "other-org/some-model")
    assert result.code == 1 and "Hugging Face Hub id" in result.err
