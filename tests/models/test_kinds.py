"""The model-kind registry: one entry per kind, recognised from config.json alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from uqcompress.errors import ConfigError
from uqcompress.models import (
    director_model,
    hydra_model,
    kind_base,
    mc_dropout_model,
    surgery,
    sve_model,
)
from uqcompress.models.director_model import DIRECTOR
from uqcompress.models.hydra_model import HYDRA
from uqcompress.models.kind_base import ModelKind
from uqcompress.models.kinds import PLAIN, kind_of, registered_kinds
from uqcompress.models.loading import ModelSource, refuse_fused
from uqcompress.models.surgery import PRUNED
from uqcompress.models.sve_model import SVE


def test_every_module_declares_its_kind_with_its_key() -> None:
    assert HYDRA.key == hydra_model.HYDRA_KEY == kind_base.HYDRA_KEY
    assert SVE.key == sve_model.SVE_KEY == kind_base.SVE_KEY
    assert DIRECTOR.key == director_model.DIRECTOR_KEY == kind_base.DIRECTOR_KEY
    assert mc_dropout_model.MC_DROPOUT.key == kind_base.MC_DROPOUT_KEY
    assert PRUNED.key == surgery.KEPT_HEADS_KEY == kind_base.KEPT_HEADS_KEY


def test_the_registry_recognises_kinds_in_order() -> None:
    """Ensembles first (one made from a pruned model records the kept heads too), plain last."""
    names = [kind.name for kind in registered_kinds()]
    assert names == ["hydra", "sve", "director", "mc-dropout", "pruned", "plain"]
    assert registered_kinds()[-1] is PLAIN and registered_kinds()[-2] is PRUNED


def test_the_registry_imports_without_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import uqcompress.models.kinds, uqcompress.models.kind_base; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_keys_are_distinct_and_plain_marks_nothing() -> None:
    keys = [kind.key for kind in registered_kinds() if kind.key is not None]
    assert len(keys) == len(set(keys)) == len(registered_kinds()) - 1
    assert kind_of({}) is PLAIN and kind_of({"uqc_sve": None}) is PLAIN


def test_an_ensemble_made_from_a_pruned_model_is_the_ensemble() -> None:
    heads = {"uqc_kept_heads": [[0]]}
    assert kind_of(heads) is PRUNED
    assert kind_of({**heads, "uqc_sve": {"members": 3}}) is SVE
    assert kind_of({**heads, "uqc_director": {"members": 5}}) is DIRECTOR
    assert kind_of({**heads, "uqc_mc_dropout": {"members": 4}}) is mc_dropout_model.MC_DROPOUT


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
