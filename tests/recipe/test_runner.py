"""`uqc run`: recipes checked as a whole, run like a build tool, gated."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from uqcompress.recipe.parse import RecipeError, Ref, load_recipe

LABELS = '["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]'

TINY = f"""# A tiny ViT on digits: init, one epoch, eval (for tests).
[vars]
train = "builtin:digits@train"
test = "builtin:digits@test"
epochs = 1

[steps.init]
run = "init"
family = "vit"
labels = {LABELS}

[steps.base]
run = "finetune"
model = "@init"
data = "${{vars.train}}"
epochs = "${{vars.epochs}}"
lr = 2e-3
batch_size = 64

[steps.eval]
run = "eval"
models = ["@base"]
data = "${{vars.test}}"
ood = ["builtin:photo-patches"]

[gate]
acc = ">= 0.0"
"""


def _write(tmp_path: Path, text: str, name: str = "recipe.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _report(result: Any) -> dict[str, Any]:
    assert result.code == 0, result.err
    report: dict[str, Any] = json.loads(result.out)
    return report


# --- checking ---------------------------------------------------------------------------


def test_every_problem_of_a_recipe_is_reported_at_once(
    cli: Callable[..., Any], tmp_path: Path, _artifacts_root: Path
) -> None:
    broken = _write(
        tmp_path,
        """# broken on purpose
[vars]
train = "builtin:digits@train"

[steps.init]
run = "init"
family = "vit"
colour = "blue"

[steps.base]
run = "finetune"
model = "@init"
data = "${vars.missing}"
epochs = "many"

[steps.eval]
run = "eval"
models = ["@nope"]
data = "builtin:digits@test"

[steps.extra]
run = "deploy"

[steps.score]
run = "score"

[gate]
accuracy = ">= 0.9"
ece = "small"

[publish]
to = "s3"
""",
    )
    with pytest.raises(RecipeError) as caught:
        load_recipe(broken)
    problems = caught.value.problems
    expected = [
        "publish: unknown table",
        "steps.init.colour: not an option of uqc init",
        "steps.base.data: ${vars.missing} is not defined",
        "steps.base.epochs: expected an integer, got 'many'",
        "steps.eval.models: @nope names no step",
        "steps.extra.run: 'deploy'; name a step command",
        "steps.score: missing 'model'",
        "gate.accuracy: unknown metric 'accuracy'",
        "gate.ece: cannot parse",
    ]
    for needle in expected:
        assert any(needle in p for p in problems), (needle, problems)
    assert len(problems) == len(expected), problems
    # On the command line: one block listing them, exit 1, nothing run or written.
    result = cli("run", broken)
    assert result.code == 1
    assert result.out == ""
    assert "has 9 problems" in result.err and "steps.base.epochs" in result.err
    assert not _artifacts_root.exists()


def test_predict_is_no_recipe_step(tmp_path: Path) -> None:
    """predict is a registered step, but it writes no artifact: a recipe says so in one line."""
    recipe = _write(
        tmp_path,
        """# predict in a recipe
[steps.init]
run = "init"
family = "vit"
labels = ["a", "b"]

[steps.predict]
run = "predict"
model = "@init"
data = "builtin:digits@test"
""",
    )
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe)
    assert caught.value.problems == [
        "steps.predict.run: 'predict' writes no artifact, so it cannot be a recipe step "
        "(run uqc predict on an artifact the recipe built)"
    ]


def test_cycles_and_forward_references(tmp_path: Path) -> None:
    cyclic = _write(
        tmp_path,
        """# a cycle
[steps.a]
run = "finetune"
model = "@b"
data = "builtin:digits@train"

[steps.b]
run = "finetune"
model = "@a"
data = "builtin:digits@train"
""",
    )
    with pytest.raises(RecipeError, match=r"@a -> @b -> @a form a cycle"):
        load_recipe(cyclic)
    # A step may be written before the step it uses: it runs after it.
    forward = _write(
        tmp_path,
        f"""# forward
[steps.tuned]
run = "finetune"
model = "@init"
data = "builtin:digits@train"

[steps.init]
run = "init"
family = "vit"
labels = {LABELS}
""",
        "forward.toml",
    )
    assert [s.name for s in load_recipe(forward).steps] == ["init", "tuned"]


def test_set_overrides_vars_steps_and_gate(tmp_path: Path) -> None:
    path = _write(tmp_path, TINY)
    recipe = load_recipe(
        path,
        [
            "vars.epochs=3",
            "vars.test=builtin:digits@val",
            "steps.base.lr=0.01",
            "steps.base.seed=7",  # not in the file: any option of the command may be set
            "gate.ece=<= 0.2",
        ],
    )
    base = next(s for s in recipe.steps if s.name == "base")
    assert base.values["epochs"] == 3 and base.values["lr"] == 0.01 and base.values["seed"] == 7
    evaluation = next(s for s in recipe.steps if s.name == "eval")
    assert evaluation.values["data"] == "builtin:digits@val"
    assert recipe.gate is not None
    assert [str(b) for b in recipe.gate.bounds] == ["acc>=0", "ece<=0.2"]


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("vars.tarin=x.csv", "no variable 'tarin' in [vars] (it has: epochs, test, train)"),
        ("steps.bse.epochs=2", "no step 'bse'"),
        ("steps.base.epoch=2", "steps.base.epoch: not an option of uqc finetune"),
        ("vars.epochs=two", "expected an integer, got 'two'"),
        ("model=x", "no such key"),
        ("gate.speed=>= 1", "unknown metric 'speed'"),
        ("novalue", "expected KEY=VALUE"),
    ],
)
def test_bad_set_is_one_clear_error(
    cli: Callable[..., Any], tmp_path: Path, override: str, needle: str, _artifacts_root: Path
) -> None:
    result = cli("run", _write(tmp_path, TINY), "--set", override)
    assert result.code == 1
    assert needle in result.err, result.err
    assert not _artifacts_root.exists()


# --- running ------------------------------------------------------------------------------


def test_a_rerun_reuses_every_artifact_and_dry_run_says_so(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    recipe = _write(tmp_path, TINY)
    plan = cli("run", recipe, "--dry-run", "--json")
    planned = _report(plan)["steps"]
    assert [s["status"] for s in planned.values()] == ["would build"] * 3
    assert "0 would be reused, 3 would be built" in plan.err

    first = cli("run", recipe, "--json")
    built = _report(first)
    assert [s["status"] for s in built["steps"].values()] == ["built"] * 3
    assert built["path"] == built["steps"]["eval"]["path"]
    assert built["gate"]["passed"] is True
    assert planned["init"]["path"] == built["steps"]["init"]["path"]  # the plan was right

    again = cli("run", recipe, "--json")
    reused = _report(again)
    assert [s["status"] for s in reused["steps"].values()] == ["reused"] * 3
    assert {n: s["id"] for n, s in reused["steps"].items()} == {
        n: s["id"] for n, s in built["steps"].items()
    }
    assert "3 steps: 0 built, 3 reused" in again.err
    assert "epoch" not in again.err.lower()  # no training progress: nothing re-executed

    plain = cli("run", recipe)
    assert plain.code == 0
    assert plain.out.strip().splitlines()[-1] == built["path"]  # last line: the last artifact
    replanned = _report(cli("run", recipe, "--dry-run", "--json"))
    assert [s["status"] for s in replanned["steps"].values()] == ["would reuse"] * 3

    # Changing one option rebuilds that step and what follows, not what precedes it.
    changed = _report(cli("run", recipe, "--json", "--set", "vars.epochs=2"))
    assert [s["status"] for s in changed["steps"].values()] == ["reused", "built", "built"]


def test_an_input_replaced_under_the_same_id_is_not_reused(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    """An id covers the inputs' ids, not their bytes: a resealed input must rebuild what
    follows it (and verify must say so), or a gate passes on stale numbers."""
    recipe = _write(tmp_path, TINY)
    built = _report(cli("run", recipe, "--json"))["steps"]
    base = Path(built["base"]["path"])
    manifest = json.loads((base / "manifest.json").read_text())
    manifest["created_utc"] = "2000-01-01T00:00:00+00:00"  # resealed: same id, other manifest
    (base / "manifest.json").write_text(json.dumps(manifest))

    stale = cli("verify", built["eval"]["path"])
    assert stale.code == 1
    assert "made from a model input that has changed since" in stale.err
    assert "resealed" in stale.err and len(stale.err.strip().splitlines()) == 1
    shown = cli("inspect", built["eval"]["path"], "--json")
    lineage = json.loads(shown.out)["lineage"]
    assert [node["status"] for node in lineage] == ["ok", "resealed", "ok"]  # eval, base, init

    again = _report(cli("run", recipe, "--json"))["steps"]
    assert [s["status"] for s in again.values()] == ["reused", "reused", "built"]
    assert again["eval"]["id"] == built["eval"]["id"]
    verified = cli("verify", again["eval"]["path"])
    assert verified.code == 0, verified.err


def test_a_failed_step_is_named_and_a_rerun_resumes(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    missing = tmp_path / "later.csv"
    recipe = _write(
        tmp_path,
        TINY.replace('ood = ["builtin:photo-patches"]', f'ood = ["{missing}"]'),
    )
    failed = cli("run", recipe)
    assert failed.code == 1
    assert "step 'eval' (uqc eval) failed:" in failed.err
    assert "rerunning the recipe resumes here" in failed.err
    assert failed.out == ""
    missing.write_text("text,label\nfoo,1\n", encoding="utf-8")  # the fix
    # image model, text data: still wrong - but only eval runs again
    rerun = cli("run", recipe, "--json")
    assert rerun.code == 1 and "step 'eval'" in rerun.err
    assert "[1/3] init" in rerun.err and "init: reused" in rerun.err
    assert "base: reused" in rerun.err


def test_an_interrupted_run_resumes(
    cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from uqcompress.steps import eval as eval_step

    real = eval_step.run
    calls = {"n": 0}

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(eval_step, "run", interrupted)
    recipe = _write(tmp_path, TINY)
    stopped = cli("run", recipe)
    assert stopped.code == 130
    assert "interrupted in step 'eval': the 2 finished steps are kept" in stopped.err
    resumed = _report(cli("run", recipe, "--json"))
    assert [s["status"] for s in resumed["steps"].values()] == ["reused", "reused", "built"]


def test_a_failing_gate_exits_3_naming_the_bound(cli: Callable[..., Any], tmp_path: Path) -> None:
    recipe = _write(tmp_path, TINY)
    result = cli("run", recipe, "--set", "gate.acc=>= 0.99")
    assert result.code == 3
    assert "quality gate failed on step 'eval': acc = " in result.err
    assert "fails acc>=0.99" in result.err
    assert Path(result.out.strip()).is_dir()  # the artifacts are written all the same


def test_ratio_gates_against_a_baseline(cli: Callable[..., Any], tmp_path: Path) -> None:
    recipe = _write(
        tmp_path,
        TINY.replace('[gate]\nacc = ">= 0.0"\n', "")
        + """
[steps.scores]
run = "score"
model = "@base"
method = "l2"

[steps.pruned]
run = "prune"
input = "@scores"
ratio = 0.5

[steps.pruned_eval]
run = "eval"
models = ["@pruned"]
data = "${vars.test}"

[gate]
step = "pruned_eval"
baseline = "eval"
params_ratio = "< 1"
flops_ratio = "< 0.9"
""",
    )
    report = _report(cli("run", recipe, "--json"))
    values = report["gate"]["values"]
    assert report["gate"]["passed"] and report["gate"]["step"] == "pruned_eval"
    assert 0.5 < values["params_ratio"] < 1
    assert 0.3 < values["flops_ratio"] < 0.9


def test_ratio_gate_needs_a_baseline(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"a ratio needs gate\.baseline"):
        load_recipe(_write(tmp_path, TINY.replace('acc = ">= 0.0"', 'params_ratio = "< 1"')))


INIT = f'[steps.init]\nrun = "init"\nfamily = "vit"\nlabels = {LABELS}\n'
EVAL = '[steps.e]\nrun = "eval"\nmodels = ["@init"]\ndata = "x.csv"\n'


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (
            INIT + '[steps.t]\nrun = "finetune"\nmodel = ["@init", "@init"]\ndata = "x.csv"\n',
            "steps.t.model: uqc finetune takes one model, got 2",
        ),
        (
            INIT + '[steps."a.b"]\nrun = "eval"\nmodels = ["@init"]\ndata = "x.csv"\n',
            "steps.a.b: a step name may hold letters, digits",
        ),
        (
            INIT + '[steps.t]\nrun = "finetune"\nmodel = "@init/member0"\ndata = "x.csv"\n',
            "'@init/member0': a reference is \"@name\" alone",
        ),
        (
            INIT + '[steps.t]\nrun = "finetune"\nmodel = "-"\ndata = "x.csv"\n',
            "steps.t.model: '-' (read stdin) has no meaning in a recipe",
        ),
        (
            INIT + '[steps.t]\nrun = "finetune"\nmodel = "@init"\ndata = "${var.train}"\n',
            "has a ${...} that is not ${vars.NAME}",
        ),
        (
            INIT + '[steps.e]\nrun = "eval"\nmodels = []\ndata = "x.csv"\n',
            "steps.e.models: needs at least one value",
        ),
        (
            INIT + EVAL + '[gate]\nacc = ">= 0.9, nll <= 2"\n',
            "gate.acc: one bound per key",
        ),
        (
            INIT + EVAL + '[gate]\nlatency_ms = "< 5"\n',
            "gate.latency_ms: latency is reported, never gated",
        ),
        (
            INIT + '[steps.t]\nrun = "finetune"\nmodel = "@init"\ndata = "x.csv"\nlr = inf\n',
            "steps.t.lr: expected a finite number, got inf",
        ),
        (
            INIT + '[steps.t]\nrun = "finetune"\nmodel = "@init"\ndata = "x.csv"\nlr = "nan"\n',
            "steps.t.lr: expected a finite number, got 'nan'",
        ),
    ],
)
def test_recipe_mistakes_are_named(tmp_path: Path, body: str, needle: str) -> None:
    with pytest.raises(RecipeError) as caught:
        load_recipe(_write(tmp_path, "# x\n" + body))
    assert any(needle in p for p in caught.value.problems), caught.value.problems


def test_forgiving_forms_that_mean_one_thing(tmp_path: Path) -> None:
    body = (
        INIT
        + '[steps.t]\nrun = "finetune"\nmodel = ["@init"]\ndata = "x.csv"\n'
        + '[steps.e]\nrun = "eval"\nmodels = ["@t"]\ndata = "x.csv"\n'
        + '[gate]\nood.photo-patches.entropy.auroc = ">= 0.5"\n'  # unquoted: a nested table
        + "e = 1\n"
    )
    path = _write(tmp_path, "# x\n" + body.replace("\ne = 1\n", "\n"))
    recipe = load_recipe(path, ["steps.e.ood=builtin:photo-patches,y.csv", "steps.t.lr=0.5"])
    tuned = next(s for s in recipe.steps if s.name == "t")
    assert tuned.needs == ["init"] and tuned.values["lr"] == 0.5
    evaluation = next(s for s in recipe.steps if s.name == "e")
    assert evaluation.values["ood"] == ["builtin:photo-patches", "y.csv"]
    assert recipe.gate is not None
    assert [b.metric for b in recipe.gate.bounds] == ["ood.photo-patches.entropy.auroc"]


@pytest.mark.parametrize(
    ("text", "override"),
    [
        ('gate = "x"\n' + INIT, "gate.acc=>= 1"),
        ("steps = [1]\n", "steps.a.epochs=1"),
        ("vars = 3\n" + INIT, "vars.x=1"),
    ],
)
def test_set_on_a_malformed_recipe_is_an_error_not_a_crash(
    cli: Callable[..., Any], tmp_path: Path, text: str, override: str
) -> None:
    result = cli("run", _write(tmp_path, "# x\n" + text), "--set", override)
    assert result.code == 1
    assert result.err.startswith("error: recipe"), result.err


def test_a_directory_is_not_a_recipe(cli: Callable[..., Any], tmp_path: Path) -> None:
    result = cli("run", tmp_path)
    assert result.code == 1 and "is a directory" in result.err


CALIBRATED = (
    INIT
    + '[steps.cal]\nrun = "calibrate"\nmodel = "@init"\ndata = "builtin:digits@val"\n'
    + '[steps.onnx]\nrun = "export"\nmodel = "@cal"\n'
)


@pytest.mark.parametrize(
    ("models", "bound", "needle"),
    [
        ('["@init"]', '"ood.photo-patches.mi.auroc" = ">= 0.5"', "unknown metric"),
        ('["@init"]', 'disagreement = "< 0.5"', "unknown metric 'disagreement'"),
        ('["@init"]', 'temperature = "< 2"', "unknown metric 'temperature'"),
        ('["@onnx"]', 'abstain_risk = "< 0.1"', "unknown metric 'abstain_risk'"),
        ('["@onnx"]', 'temperature = "< 2"', None),  # calibrated, through the export
        ('["@init", "@onnx"]', 'disagreement = "< 0.5"', None),  # a deep ensemble
        ('"/some/model/outside"', 'temperature = "< 2"', None),  # cannot tell: accepted
    ],
)
def test_gates_on_metrics_the_model_cannot_report_are_refused_before_the_run(
    tmp_path: Path, models: str, bound: str, needle: str | None
) -> None:
    body = (
        CALIBRATED
        + f'[steps.e]\nrun = "eval"\nmodels = {models}\ndata = "builtin:digits@test"\n'
        + 'ood = ["builtin:photo-patches"]\n'
        + f"[gate]\n{bound}\n"
    )
    path = _write(tmp_path, "# x\n" + body)
    if needle is None:
        assert load_recipe(path).gate is not None
        return
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    assert any(needle in p for p in caught.value.problems), caught.value.problems


def test_a_recipe_quantizes_an_export_and_evaluates_it(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    body = (
        INIT
        + '[steps.onnx]\nrun = "export"\nmodel = "@init"\n'
        + '[steps.int8]\nrun = "quantize"\nmodel = "@onnx"\nmode = "dynamic"\n'
        + 'data = "builtin:digits@test"\nmax_ece_delta = 0.02\n'
        + '[steps.e]\nrun = "eval"\nmodels = ["@int8"]\ndata = "builtin:digits@test"\n'
    )
    report = _report(cli("run", _write(tmp_path, "# x\n" + body), "--json"))
    steps = report["steps"]
    assert [s["status"] for s in steps.values()] == ["built"] * 4
    int8 = Path(steps["int8"]["path"])
    summary = json.loads((int8 / "manifest.json").read_text())["summary"]
    assert summary["quantization"]["mode"] == "dynamic" and summary["size_ratio"] < 1
    assert json.loads((int8 / "drift.json").read_text())["passed"] is True


def test_json_reports_the_failed_step_and_its_error(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    """issue 26 item 15: `uqc run --json` printed nothing when a step failed; it prints the
    report with the steps that ran and the failure, and the exit code stays the step's."""
    recipe = _write(
        tmp_path,
        TINY.replace('ood = ["builtin:photo-patches"]', f'ood = ["{tmp_path / "nope.csv"}"]'),
    )
    result = cli("run", recipe, "--json")
    assert result.code == 1
    report = json.loads(result.out)
    assert list(report["steps"]) == ["init", "base"]
    assert all(s["status"] == "built" for s in report["steps"].values())
    failed = report["failed"]
    assert failed["step"] == "eval" and failed["command"] == "eval"
    assert failed["exit_code"] == 1
    assert "nope.csv" in failed["error"]
    assert failed["error"].startswith("step 'eval' (uqc eval) failed:")
    error_line = [line for line in result.err.splitlines() if line.startswith("error: ")]
    assert error_line == [f"error: {failed['error']} (fix: {failed['fix']})"]


def test_model_is_the_model_key_of_every_step(tmp_path: Path) -> None:
    """issue 26 item 15: eval took `models`, quantize `model`; `model` is now the key of the
    model input everywhere (eval: one model or a list), `models` still reads the same, and
    --set reaches the key the recipe wrote under either name."""
    body = (
        INIT
        + '[steps.t]\nrun = "finetune"\nmodels = ["@init"]\ndata = "x.csv"\n'
        + '[steps.onnx]\nrun = "export"\nmodel = "@t"\n'
        + '[steps.q]\nrun = "quantize"\nmodel = "@onnx"\n'
        + '[steps.e]\nrun = "eval"\nmodel = "@q"\ndata = "x.csv"\n'
        + '[steps.e2]\nrun = "eval"\nmodel = ["@t", "@init"]\ndata = "x.csv"\n'
        + '[steps.e3]\nrun = "eval"\nmodels = ["@t"]\ndata = "x.csv"\n'
    )
    recipe = load_recipe(_write(tmp_path, "# x\n" + body), ["steps.e3.model=@init"])
    by_name = {s.name: s for s in recipe.steps}
    assert isinstance(by_name["t"].values["model"], Ref)
    assert by_name["e"].values["models"] == [Ref("q")] and by_name["e"].needs == ["q"]
    assert by_name["e2"].values["models"] == [Ref("t"), Ref("init")]
    assert by_name["e3"].values["models"] == [Ref("init")]
    assert "model" not in by_name["e"].values


@pytest.mark.parametrize(
    ("step", "needle"),
    [
        (
            '[steps.q]\nrun = "quantize"\nmodels = ["@init", "@init"]\n',
            "steps.q.models: uqc quantize takes one model, got 2",
        ),
        (
            '[steps.e]\nrun = "eval"\nmodel = "@init"\nmodels = ["@init"]\ndata = "x.csv"\n',
            "model and models are the same key",
        ),
    ],
)
def test_the_model_key_given_twice_or_as_a_list_is_refused(
    tmp_path: Path, step: str, needle: str
) -> None:
    with pytest.raises(RecipeError) as caught:
        load_recipe(_write(tmp_path, "# x\n" + INIT + step))
    assert any(needle in p for p in caught.value.problems), caught.value.problems
