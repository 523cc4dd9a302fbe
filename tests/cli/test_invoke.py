"""How every command runs and talks (cli/invoke.py, cli/options.py): -h, shell completion,
-q / -v, and --dry-run on every step."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import typer

from tests.conftest import ok
from uqcompress.cli.app import _HAND_WRITTEN, app
from uqcompress.cli.commands import HELP

COMMANDS = sorted([*HELP, *_HAND_WRITTEN])


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_dash_h_is_help_everywhere(cli, command: str) -> None:  # type: ignore[no-untyped-def]
    args = [command] if command else []
    short, long = cli(*args, "-h"), cli(*args, "--help")
    assert short.code == long.code == 0, short.err
    assert short.out == long.out and "Usage: uqc" in short.out


def test_every_command_takes_verbose_and_quiet() -> None:
    group = typer.main.get_command(app)
    for name in COMMANDS:
        params = {p.name: p for p in group.commands[name].params}  # type: ignore[attr-defined]
        assert params["verbose"].opts == ["-v", "--verbose"], name
        assert params["quiet"].opts == ["-q", "--quiet"], name
        if name in HELP:  # every step command plans
            assert params["dry_run"].opts == ["--dry-run"], name


def test_shell_completion_completes_commands_and_options(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from uqcompress.cli.app import run

    root = typer.main.get_command(app)
    assert {"install_completion", "show_completion"} <= {p.name for p in root.params}
    for words, cword, want in (("uqc pru", "1", "prune"), ("uqc prune --rat", "2", "--ratio")):
        monkeypatch.setenv("_UQC_COMPLETE", "complete_bash")
        monkeypatch.setenv("COMP_WORDS", words)
        monkeypatch.setenv("COMP_CWORD", cword)
        with pytest.raises(SystemExit) as done:
            run([])
        assert done.value.code == 0
        assert capsys.readouterr().out.split() == [want]


@pytest.fixture
def vit(cli, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    return Path(ok(cli("init", "--family", "vit", "--num-labels", "10", "--out", tmp_path / "m")))


def test_quiet_prints_only_the_path_and_errors(cli, vit: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = ("--data", "builtin:digits@test")
    loud = cli("eval", vit, *data, "--out", tmp_path / "e1")
    assert ok(loud) == str(tmp_path / "e1") and "NLL" in loud.err  # its table
    quiet = cli("eval", vit, *data, "--out", tmp_path / "e2", "-q")
    assert ok(quiet) == str(tmp_path / "e2") and quiet.err == ""
    assert "reusing" in cli("eval", vit, *data, "--out", tmp_path / "e1").err
    assert cli("-q", "eval", vit, *data, "--out", tmp_path / "e1").err == ""  # before the command
    failed = cli("eval", tmp_path / "nope", *data, "-q")
    assert failed.code == 1 and failed.out == ""
    assert failed.err.count("\n") == 1 and "does not exist" in failed.err
    # -q holds for one command: the next one talks again
    assert "reusing" in cli("eval", vit, *data, "--out", tmp_path / "e1").err


def test_verbose_says_the_config_and_what_each_phase_cost(cli, vit: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("eval", vit, "--data", "builtin:digits@test", "-v", "--out", tmp_path / "e")
    assert ok(result) == str(tmp_path / "e")
    assert "uqc eval: " in result.err and "batch_size=" in result.err and "device=cpu" in result.err
    for phase in ("read builtin:digits@test took", "build and install eval", "uqc eval took"):
        assert phase in result.err, phase
    planned = cli("eval", vit, "--data", "builtin:digits@test", "-v", "--dry-run")
    assert planned.code == 0 and "plan: uqc eval would" in planned.err
    assert "failed" not in planned.err  # a plan is not a failed run
    both = cli("eval", vit, "--data", "builtin:digits@test", "-v", "-q")
    assert both.code == 2 and "exclude each other" in both.err


@pytest.mark.parametrize(
    "args",
    [
        ("finetune", "{m}", "--data", "builtin:digits@val", "--epochs", "1"),
        ("eval", "{m}", "--data", "builtin:digits@test"),
        ("score", "{m}", "--method", "l2"),
        ("calibrate", "{m}", "--data", "builtin:digits@val"),
        ("export", "{m}", "--data", "builtin:digits@test"),
        ("mc-dropout", "{m}", "--samples", "2", "--rate", "0.1"),
    ],
    ids=lambda a: a[0],
)
def test_dry_run_plans_without_writing(
    cli, vit: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:  # type: ignore[no-untyped-def]
    argv = [a.format(m=vit) for a in args]
    root = Path(os.environ["UQC_ARTIFACTS"])
    before = sorted(root.iterdir()) if root.exists() else []
    planned = cli(*argv, "--dry-run")
    assert planned.code == 0, planned.err
    assert (sorted(root.iterdir()) if root.exists() else []) == before  # nothing written
    assert f"plan: uqc {args[0]} would build" in planned.err
    assert '  device = "cpu"' in planned.err  # the resolved config, device resolved
    plan = json.loads(cli(*argv, "--dry-run", "--json").out)
    assert plan["would"] == "build" and plan["path"] == planned.out.strip()
    assert plan["config"]["threads"] >= 1
    built = ok(cli(*argv))
    assert built == planned.out.strip()  # the path it said it would write
    assert Path(built).name.endswith(plan["id"][:8])
    again = json.loads(cli(*argv, "--dry-run", "--json").out)
    assert again["would"] == "reuse" and again["id"] == plan["id"]


def test_predict_dry_run_counts_the_records_and_writes_nothing(
    cli, vit: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "p.jsonl"
    planned = cli("predict", vit, "--data", "builtin:digits@test", "--out", out, "--dry-run")
    assert planned.code == 0, planned.err
    assert planned.out.strip() == str(out) and not out.exists()
    assert f"would write 360 records to {out}" in planned.err
    to_stdout = cli("predict", vit, "--data", "builtin:digits@test", "--dry-run")
    assert to_stdout.out == "" and "to stdout" in to_stdout.err
    missing = cli("predict", tmp_path / "nope", "--data", "builtin:digits@test", "--dry-run")
    assert missing.code == 1 and "does not exist" in missing.err


def test_dry_run_refuses_what_the_run_would_refuse(cli, vit: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("prune", vit, "--ratio", "0.5", "--dry-run")
    assert result.code == 1 and result.out == ""
    assert "needs its head scores" in result.err


def test_verbose_names_the_phases_of_init_import_fuse_and_mc_dropout(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path
) -> None:
    """Steps that build or rewrite a whole model say what they are doing (a spinner on a
    terminal; under -v a timed line per phase)."""
    init = cli("init", "--family", "bert", "--labels", "a,b", "-v", "--out", tmp_path / "m")
    model = ok(init)
    for phase in ("building it from its config took", "writing the model artifact took"):
        assert phase in init.err, phase
    import shutil

    exported = Path(ok(cli("export", model, "--format", "safetensors", "--out", tmp_path / "p")))
    plain = tmp_path / "plain"  # a save_pretrained directory: the export without its manifest
    shutil.copytree(exported, plain, ignore=shutil.ignore_patterns("manifest.json"))
    imported = cli("import", plain, "-v", "--out", tmp_path / "i")
    ok(imported)
    assert "loading the checkpoint took" in imported.err
    scores = ok(cli("score", model, "--method", "l2", "--out", tmp_path / "s"))
    members = ok(cli("prune", scores, "--members", "2", "--select", "partition"))
    fused = cli("fuse", members, "-v", "--out", tmp_path / "f")
    ok(fused)
    for phase in ("loading the members took", "fusing and checking parity took"):
        assert phase in fused.err, phase
    dropout = cli("mc-dropout", model, "--samples", "2", "-v", "--out", tmp_path / "d")
    ok(dropout)
    assert "loading the model took" in dropout.err
