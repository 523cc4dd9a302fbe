"""The step registry: one declaration per step, shared by the CLI, `uqc run` and the demo."""

from __future__ import annotations

import ast
import inspect
import math
import types
import typing
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from uqcompress.errors import ConfigError, ConfigProblems
from uqcompress.steps import config as fields
from uqcompress.steps.registry import STEPS, step

ROOT = Path(__file__).resolve().parents[2]


def _typer_params(name: str) -> dict[str, tuple[str | None, type, bool, bool, Any]]:
    """(flag, kind, many, required, default) of each parameter of `uqc NAME`, read from the
    Typer command (the way recipes read them before the registry): the oracle the registry's
    options must agree with."""
    import typer.models

    from uqcompress.cli.app import app

    callback = next(i.callback for i in app.registered_commands if i.name == name)
    assert callback is not None
    hints = typing.get_type_hints(callback, include_extras=True)
    params = {}
    for pname, parameter in inspect.signature(callback).parameters.items():
        if pname in ("force", "json_out", "dry_run", "verbose", "quiet"):
            continue  # how the command runs and talks, not options of the step
        hint = hints[pname]
        info = next(m for m in hint.__metadata__ if isinstance(m, typer.models.ParameterInfo))
        kind, many = _base(typing.get_args(hint)[0])
        flag = None
        if isinstance(info, typer.models.OptionInfo):
            names = [info.default, *(info.param_decls or ())]
            flag = next(d for d in names if isinstance(d, str) and d.startswith("--"))
            flag = flag.split("/")[0]  # "--per-channel/--per-tensor": the registry's is the first
        required = parameter.default is inspect.Parameter.empty
        params[pname.rstrip("_")] = (flag, kind, many, required, parameter.default)
    return params


def _base(hint: Any) -> tuple[type, bool]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _base(next(a for a in typing.get_args(hint) if a is not type(None)))
    if origin is list:
        return _base(typing.get_args(hint)[0])[0], True
    return (hint if hint in (int, float, bool) else str), False


@pytest.mark.parametrize("name", list(STEPS))
def test_every_option_of_a_step_command_is_a_registry_option(name: str) -> None:
    cli = _typer_params(name)
    options = step(name).options()
    assert set(cli) == set(options)
    for key, (flag, kind, many, required, _) in cli.items():
        option = options[key]
        assert (option.flag, option.kind, option.many, option.required) == (
            flag,
            kind,
            many,
            required,
        ), key


@pytest.mark.parametrize("name", list(STEPS))
def test_the_cli_defaults_are_the_config_defaults(name: str) -> None:
    """A recipe that leaves an option out gets what the command line gives without the flag."""
    spec = step(name)
    roles = {r.key for r in spec.inputs} | {"out"}
    defaults = {
        key: default
        for key, (_, _, _, required, default) in _typer_params(name).items()
        if not required and key not in roles
    }
    required = {
        key: ("x" if kind is str else 1)
        for key, (_, kind, _, req, _) in _typer_params(name).items()
        if req and key not in roles
    }
    assert spec.configure({**required, **defaults}) == spec.configure(required)


def test_options_that_are_not_their_field() -> None:
    init = step("init").configure({"family": "vit", "labels": "a, b", "set": ["hidden_size=8"]})
    assert init.labels == ["a", "b"] and init.overrides == {"hidden_size": 8}
    director = step("distill-director").configure({"data": "d", "freeze_head": True})
    assert director.train_head is False
    assert step("distill-director").configure({"data": "d"}).train_head is True
    assert step("compare").configure({"names": "a,b"}).names == ["a", "b"]
    # options default where a config built in code does not: auto device, $UQC_THREADS
    finetune = step("finetune").configure({"data": "d"})
    assert finetune.device == "auto" and finetune.threads is None
    assert step("prune").configure({}).device == "cpu"
    with pytest.raises(TypeError, match="no option colour"):
        step("init").configure({"family": "vit", "colour": "blue"})


def test_runtime_fields_are_left_out_of_the_id() -> None:
    from uqcompress.steps.eval import EvalConfig
    from uqcompress.steps.score import ScoreConfig

    cfg = EvalConfig(data="builtin:digits@test", ood=["x.csv"], gate="acc>=0.5")
    # --dtype changes results: float32 (what steps computed in before it) is left out; the
    # step resolves `auto` before the id, so a run never hashes "auto"
    assert set(fields.id_config(cfg)) == {"gate", "samples", "max_length", "dtype"}
    assert set(fields.id_config(replace(cfg, dtype="float32"))) == {"gate", "samples", "max_length"}
    assert fields.runtime_keys(ScoreConfig()) == {
        "data",
        "ood",
        "text_column",
        "label_column",
        "text_pair_column",  # the pair texts are in the data fingerprint
        "device",
        "threads",
        "workers",
    }
    # a recorded config with more keys than the dataclass keeps them
    assert fields.id_config(cfg, {"data": "d", "members": 2}) == {"members": 2}


def test_one_problem_reads_as_before_and_several_are_listed_together() -> None:
    from uqcompress.steps.score import ScoreConfig

    with pytest.raises(ConfigError) as one:
        ScoreConfig(method="nope").validate()
    assert one.value.message == "unknown --method 'nope'"
    assert one.value.hint == "use one of: taylor, hies, headmap, greedy-circuit, random, l2"

    with pytest.raises(ConfigProblems) as several:
        ScoreConfig(method="nope", members=0, calib_size=0).validate()
    lines = several.value.message.splitlines()
    assert lines[0] == "3 problems with the options:"
    # the bounds every config shares (runtime/limits) first, in field order; then the step's own
    assert lines[1] == "  --calib-size 0 must be at least 1 (fix: pass --calib-size 32)"
    assert lines[2] == "  --members 0 must be at least 1 (fix: pass --members 1 for one, or " + (
        "e.g. --members 4 for four)"
    )
    assert lines[3] == (
        "  unknown --method 'nope' (fix: use one of: taylor, hies, headmap, greedy-circuit, "
        "random, l2)"
    )
    assert len(several.value.problems) == 3
    assert several.value.hint is None  # every line has its own fix


def test_training_problems_are_collected_with_the_step_problems() -> None:
    from uqcompress.steps.sve import SVEConfig

    with pytest.raises(ConfigProblems) as caught:
        SVEConfig(data="d", members=0, epochs=0, lr=2.0).validate()
    messages = [p.message for p in caught.value.problems]
    assert messages == [
        "--members 0 must be at least 1",
        "--epochs 0 must be at least 1",
        "--lr 2.0 must be in (0, 1)",
    ]


@pytest.mark.parametrize("name", list(STEPS))
def test_every_config_refuses_non_finite_numbers_first(name: str) -> None:
    spec = step(name)
    cfg = spec.configure({o.key: "x" for o in spec.options().values() if o.required and o.field})
    floats = [o for o in spec.options().values() if o.kind is float and o.field is not None]
    for option in floats:
        assert option.field is not None
        bad = replace(cfg, **{option.field: math.inf})
        with pytest.raises(ConfigError) as caught:
            bad.validate()
        assert caught.value.message == f"{option.flag} inf is not a finite number"


def test_plan_says_where_the_artifact_goes_without_writing(tmp_path: Path) -> None:
    from uqcompress.steps.init import InitConfig

    init = step("init")
    cfg = InitConfig(family="vit", labels=["a", "b"])
    planned = init.plan({}, cfg, root=tmp_path / "root")
    assert planned.dest == tmp_path / "root" / f"model-{planned.id[:8]}"
    assert not planned.reusable and not (tmp_path / "root").exists()
    built = init.run({}, cfg, root=tmp_path / "root")
    assert built.artifact.id == planned.id and built.artifact.path == planned.dest
    assert init.plan({}, cfg, root=tmp_path / "root").reusable


def test_recipes_and_steps_do_not_import_the_cli() -> None:
    for package in ("recipe", "steps"):
        for path in (ROOT / "uqcompress" / package).glob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            imported = [
                n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
            ] + [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            assert not [m for m in imported if m.startswith("uqcompress.cli")], path


def test_ids_are_those_the_steps_had_before_the_registry(tmp_path: Path) -> None:
    """Ids computed before the registry existed (issue 15), for configs built from option
    values the way the CLI and recipes build them: runtime fields moved into the dataclasses
    and option defaults must not change an id, or every finished artifact would be rebuilt."""
    labels = ",".join(str(d) for d in range(10))
    init = step("init").execute({"family": "vit", "labels": labels, "out": tmp_path / "i"})
    # model kind_version 2 (issue 26 item 6: fuse's summary keys) changed every model id once
    assert init.artifact.id == "1008a6bfc38754ec7c65b37722e08d28"
    finetune = step("finetune")
    inputs, cfg, out = finetune.prepare(
        {
            "model": str(init.artifact.path),
            "data": "builtin:digits@train",
            "val": "builtin:digits@val",
            "epochs": 1,
            "batch_size": 64,
            # with --val the default is now the best epoch by nll (issue 21), a different
            # result; the last epoch, as before, keeps the id
            "select_best": "none",
        }
    )
    assert finetune.plan(inputs, cfg, out).id == "73daa7a6cd0a7bb813e33193926b4df2"


def test_a_recipe_runs_its_steps_through_the_registry_into_its_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`uqc run --artifacts DIR`: the root is passed down, the environment is left alone."""
    import os

    from uqcompress.recipe.parse import load_recipe
    from uqcompress.recipe.runner import run_recipe
    from uqcompress.steps import init

    calls: list[Any] = []
    real = init.run
    monkeypatch.setattr(init, "run", lambda *a, **k: calls.append(a) or real(*a, **k))
    recipe = tmp_path / "r.toml"
    recipe.write_text('[steps.base]\nrun = "init"\nfamily = "vit"\nnum_labels = 2\n', "utf-8")
    before = dict(os.environ)
    report = run_recipe(load_recipe(recipe), root=tmp_path / "root")
    assert dict(os.environ) == before and len(calls) == 1
    (outcome,) = report.steps
    assert outcome.path == tmp_path / "root" / f"model-{outcome.id[:8]}"
    assert outcome.argv == ["init", "--family", "vit", "--num-labels", "2"]


def test_init_family_help_names_every_registered_family() -> None:
    """`--family`'s help is static text (naming the families from the registry would import
    torch for `uqc --help`): this holds it to the registry."""
    import dataclasses
    import re

    from uqcompress.models.families import FAMILIES
    from uqcompress.steps.init import InitConfig

    text = next(f for f in dataclasses.fields(InitConfig) if f.name == "family").metadata["help"]
    words = re.findall(r"[a-z0-9-]+", text)
    missing = [name for name in FAMILIES if name not in words]
    assert not missing, f"uqc init --family's help does not name {missing}"
