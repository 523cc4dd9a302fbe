"""The scorer registry: every scorer module registered, in help order, torch-free to import;
`uqc score` validates and dispatches through it with the messages it had before the split."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import torch

import uqcompress.methods.scoring as scoring
from uqcompress.errors import ConfigError
from uqcompress.methods.scoring import registry
from uqcompress.methods.scoring.scorer import Batch, Progress, Scorer, ScoreRequest
from uqcompress.models.tiny import tiny_bert
from uqcompress.steps.score import ScoreConfig

HELPERS = {"common", "registry", "scorer", "search"}  # the package's modules that score nothing


def test_every_scorer_module_is_registered_in_help_order() -> None:
    modules = {
        info.name for info in pkgutil.iter_modules(scoring.__path__) if info.name not in HELPERS
    }
    declared = {
        name: importlib.import_module(f"uqcompress.methods.scoring.{name}").SCORER
        for name in modules
    }
    assert all(isinstance(s, Scorer) for s in declared.values())
    assert set(registry.SCORERS) == set(declared.values())  # a new file needs its registry line
    # the order and the flags `steps/score.py` held in its own tuples before the registry
    assert registry.names() == ("taylor", "hies", "headmap", "greedy-circuit", "random", "l2")
    assert registry.needing_data() == ("taylor", "hies", "headmap", "greedy-circuit")
    assert registry.searching() == ("headmap", "greedy-circuit")


def test_old_names_find_their_scorer() -> None:
    circuit = registry.find("circuit")
    assert circuit is not None and circuit.name == "greedy-circuit"
    assert registry.find("greedy-circuit") is circuit
    assert registry.find("nope") is None and registry.find(None) is None
    # prune reads a summary's method, aliases included (artifacts from before the rename)
    assert [registry.is_searched(m) for m in ("circuit", "headmap", "hies", None, 3, ["x"])] == [
        True,
        True,
        False,
        False,
        False,
        False,
    ]


def test_method_help_is_the_help_before_the_registry() -> None:
    assert registry.method_help() == (
        "taylor, hies, headmap (HeadMap's layer-conditioned circuit locating, as Hydra-Circ "
        "uses it), greedy-circuit (uqc's own greedy forward search; 'circuit' is its old "
        "name), random or l2."
    )


def test_registry_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "from uqcompress.methods.scoring import registry\n"
        "assert registry.names()\n"
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize("name", scoring.__all__)
def test_every_name_imports_from_the_package_as_before(name: str) -> None:
    home = importlib.import_module(f"uqcompress.methods.scoring.{scoring._HOMES[name]}")
    assert getattr(scoring, name) is getattr(home, name)


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = scoring.nope


def _request(options: dict[str, Any]) -> ScoreRequest:
    """A request whose data must not be read: a data-free scorer never asks for batches."""

    def refuse(*_args: Any) -> Sequence[Batch]:
        raise AssertionError("a data-free scorer read batches")

    @contextmanager
    def progress(_label: str) -> Iterator[Progress]:
        raise AssertionError("a data-free scorer showed a search's progress")
        yield  # pragma: no cover

    return ScoreRequest(
        loaded=tiny_bert(),
        options=options,
        calibration=refuse,
        encode=refuse,
        examples=0,
        ood=None,
        gather=None,
        progress=progress,
    )


def test_data_free_scorers_read_no_batches() -> None:
    request = _request({"seed": 3})
    for name in ("random", "l2"):
        scorer = registry.find(name)
        assert scorer is not None and not scorer.needs_data
        tensors, summary = scorer.score(request)
        assert set(tensors) == {"score"} and summary == {}
        assert tensors["score"].shape == (2, 4) and tensors["score"].dtype == torch.float32
    random = registry.find("random")
    assert random is not None
    assert torch.equal(random.score(request).tensors["score"], scoring.random_scores(2, 4, seed=3))


@pytest.mark.parametrize(
    ("changes", "message", "hint"),
    [
        ({"method": "nope"}, "unknown --method 'nope'", "taylor, hies, headmap, greedy-circuit"),
        (
            {"method": "taylor", "ood": "builtin:digits@val"},
            "--ood is used by --method headmap and greedy-circuit only",
            "drop --ood, or use --method headmap",
        ),
        (
            {"method": "hies", "calib_pool": 64},
            "--calib-pool is used by --method headmap only (it keeps the pool's lowest-loss "
            "examples)",
            "drop --calib-pool, or use --method headmap",
        ),
        (
            {"method": "headmap", "ratio": 0.5, "calib_pool": 8},
            "--calib-pool 8 is smaller than --calib-size 32",
            "pass --calib-pool 128 or more",
        ),
        (
            {"method": "headmap", "ratio": 0.5, "members": 2},
            "--method headmap --members 2 would search the same lowest-loss examples for every "
            "member (identical circuits)",
            "pass --calib-pool N",
        ),
        (
            {"method": "circuit"},
            "--method circuit searches for a head budget: pass --ratio",
            "e.g. --ratio 0.5",
        ),
    ],
)
def test_score_config_checks_come_from_the_registry(
    changes: dict[str, Any], message: str, hint: str
) -> None:
    cfg = ScoreConfig(**{"data": "builtin:digits@train", **changes})
    with pytest.raises(ConfigError) as caught:
        cfg.validate()
    assert caught.value.message == message
    assert caught.value.hint is not None and hint in caught.value.hint


def test_score_config_reports_every_problem_bounds_first() -> None:
    cfg = ScoreConfig(method="nope", members=0, ood="builtin:digits@val", calib_pool=4)
    with pytest.raises(ConfigError) as caught:
        cfg.validate()
    lines = str(caught.value.message).splitlines()
    # the shared bounds (runtime/limits) first, then the scorer's own checks in their order
    assert [line.split(" (fix:")[0].strip() for line in lines if line.strip()][-4:] == [
        "--members 0 must be at least 1",
        "unknown --method 'nope'",
        "--ood is used by --method headmap and greedy-circuit only",
        "--calib-pool is used by --method headmap only (it keeps the pool's lowest-loss examples)",
    ]


@pytest.mark.parametrize("name", ["taylor", "hies"])
def test_gradient_scorers_report_each_backward_pass(name: str) -> None:
    """score shows a bar over the calibration batches: (done, total) after each one."""
    from tests.methods.test_scoring import LABELS, TEXTS, text_batches

    loaded = tiny_bert()
    batches = text_batches(loaded, TEXTS, LABELS, batch_size=2)
    reports: list[tuple[str, int, int]] = []

    @contextmanager
    def progress(label: str) -> Iterator[Progress]:
        yield lambda done, total: reports.append((label, done, total))

    options = {
        "alpha": 0.5,
        "his_abs": "sample",
        "norm_scope": "global",
        "taylor_layer_l2": False,
        "taylor_minmax": False,
    }
    request = ScoreRequest(
        loaded=loaded,
        options=options,
        calibration=lambda: batches,
        encode=lambda *_: batches,
        examples=6,
        ood=None,
        gather=None,
        progress=progress,
    )
    scorer = registry.find(name)
    assert scorer is not None
    scorer.score(request)
    assert reports == [(f"{name}: backward passes", i, 3) for i in (1, 2, 3)]
