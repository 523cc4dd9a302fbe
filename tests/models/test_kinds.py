"""The model-kind registry: one entry per kind, recognised from config.json alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from uqcompress.errors import ConfigError
from uqcompress.models import hydra_model, surgery
from uqcompress.models.kinds import (
    DIRECTOR,
    HYDRA,
    KINDS,
    PLAIN,
    PRUNED,
    SVE,
    ModelKind,
    kind_of,
)
from uqcompress.models.loading import ModelSource, refuse_fused


def test_every_module_uses_its_kind_key_from_the_registry() -> None:
    assert HYDRA.key == hydra_model.HYDRA_KEY
    assert PRUNED.key == surgery.KEPT_HEADS_KEY


def test_keys_are_distinct_and_plain_marks_nothing() -> None:
    keys = [kind.key for kind in KINDS if kind.key is not None]
    assert len(keys) == len(set(keys)) == len(KINDS) - 1
    assert kind_of({}) is PLAIN and kind_of({"uqc_sve": None}) is PLAIN


def test_an_ensemble_made_from_a_pruned_model_is_the_ensemble() -> None:
    heads = {"uqc_kept_heads": [[0]]}
    assert kind_of(heads) is PRUNED
    assert kind_of({**heads, "uqc_sve": {"members": 3}}) is SVE
    assert kind_of({**heads, "uqc_director": {"members": 5}}) is DIRECTOR


def test_members_of_each_kind() -> None:
    hydra = {"uqc_hydra": {"members": 3}}
    assert kind_of(hydra).members(hydra) == 3
    assert PRUNED.members({"uqc_kept_heads": [[0]]}) == 1
    assert PLAIN.members({}) == 1


@pytest.mark.parametrize(
    ("kind", "hint"),
    [
        (HYDRA, "score the base model before pruning members and fusing them"),
        (SVE, "score the base model the ensemble was built from"),
        (DIRECTOR, "score the teacher it was distilled from"),
    ],
)
def test_a_step_on_one_classifier_refuses_an_ensemble_with_its_hint(
    tmp_path: Path, kind: ModelKind, hint: str
) -> None:
    import json

    from uqcompress.artifacts import SourceRef

    (tmp_path / "config.json").write_text(json.dumps({str(kind.key): {"members": 2}}))
    ref = SourceRef(role="model", path=tmp_path, id="dir-x", kind="transformers-dir")
    with pytest.raises(ConfigError) as caught:
        refuse_fused(ModelSource(path=tmp_path, ref=ref, is_artifact=False), "score")
    assert f"is {kind.described}; score works on one classifier" in str(caught.value)
    assert caught.value.hint == hint
