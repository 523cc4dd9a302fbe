"""The bad-input matrix through the real CLI.

Every user mistake ends with exit 1 (or 2 for usage errors), exactly one `error:` line on stderr
that names the problem, nothing on stdout, no traceback, and nothing new in the output location.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CliResult, sentiment_rows, write_csv
from uqcompress.artifacts import open_artifact

Cli = Callable[..., CliResult]
BOX_CHARS = ("╭", "╮", "╰", "╯", "│", "─")


# --- helpers -----------------------------------------------------------------------------------


def _tree(root: Path) -> set[str]:
    """Every path under ``root`` (relative), hidden ones included."""
    if not root.exists():
        return set()
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def _run(cli: Cli, *args: object) -> CliResult:
    argv = [str(a) for a in args]
    try:
        return cli(*argv)
    except Exception as exc:  # an escaped exception is a bug: report it as a failure
        pytest.fail(
            f"uqc {' '.join(argv)} raised {type(exc).__module__}.{type(exc).__qualname__}: "
            f"{exc} (expected a one-line error and an exit code)",
            pytrace=True,
        )


def _assert_one_error_line(result: CliResult, code: int, *needles: str) -> str:
    assert result.code == code, f"exit code {result.code}, expected {code}; stderr: {result.err!r}"
    assert result.out == "", f"stdout must be empty on error, got {result.out!r}"
    assert "Traceback" not in result.err, result.err
    lines = result.err.splitlines()
    assert len(lines) == 1, f"stderr must be one line, got {len(lines)}: {result.err!r}"
    line = lines[0]
    assert line.startswith("error:"), line
    assert line.removeprefix("error:").strip(), line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    assert not any(ch in line for ch in BOX_CHARS), line
    return line


def expect_error(
    cli: Cli, tmp_path: Path, needles: tuple[str, ...], *args: object, code: int = 1
) -> str:
    """Run ``uqc ARGS`` and check the error contract; returns the error line."""
    before = _tree(tmp_path)
    result = _run(cli, *args)
    line = _assert_one_error_line(result, code, *needles)
    after = _tree(tmp_path)
    # An empty output root (mkdir -p of the default location) holds nothing; anything else new
    # is a leftover artifact, temp dir or file.
    new = sorted(
        p
        for p in after - before
        if not ((tmp_path / p).is_dir() and not any((tmp_path / p).iterdir()))
    )
    assert not new, f"new paths appeared: {new}"
    assert before <= after, f"paths vanished: {sorted(before - after)}"
    leftovers = [p for p in after if ".tmp-" in p]
    assert not leftovers, leftovers
    return line


def _copy(artifact: Path, tmp_path: Path, name: str = "copy") -> Path:
    dest = tmp_path / name
    shutil.copytree(artifact, dest)
    return dest


def _edit_manifest(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    manifest = path / "manifest.json"
    raw = json.loads(manifest.read_text(encoding="utf-8"))
    edit(raw)
    manifest.write_text(json.dumps(raw, indent=2), encoding="utf-8")


@pytest.fixture
def test_csv(sentiment_csv: dict[str, Path]) -> Path:
    return sentiment_csv["test"]


@pytest.fixture
def small_csv(tmp_path: Path) -> Path:
    return write_csv(tmp_path / "small.csv", list(sentiment_rows(8, seed=5)))


# --- paths that are not the expected artifact --------------------------------------------------


@pytest.mark.parametrize("command", ["finetune", "eval", "inspect", "verify"])
def test_missing_path(cli: Cli, tmp_path: Path, small_csv: Path, command: str) -> None:
    missing = tmp_path / "does-not-exist"
    data = ["--data", small_csv] if command in ("finetune", "eval") else []
    expect_error(cli, tmp_path, ("does-not-exist",), command, missing, *data)


@pytest.mark.parametrize("command", ["finetune", "eval", "inspect", "verify"])
@pytest.mark.parametrize("content", ["empty", "random-file"])
def test_directory_that_is_neither_artifact_nor_model(
    cli: Cli, tmp_path: Path, small_csv: Path, command: str, content: str
) -> None:
    directory = tmp_path / "not-a-model"
    directory.mkdir()
    if content == "random-file":
        (directory / "notes.bin").write_bytes(os.urandom(64))
    data = ["--data", small_csv] if command in ("finetune", "eval") else []
    expect_error(cli, tmp_path, ("not-a-model",), command, directory, *data)


def test_wrong_kind_of_artifact(
    cli: Cli, tmp_path: Path, trained_bert_artifact: Path, test_csv: Path, small_csv: Path
) -> None:
    made = _run(cli, "eval", trained_bert_artifact, "--data", test_csv)
    assert made.code == 0, made.err
    eval_artifact = Path(made.out.strip())
    assert open_artifact(eval_artifact).kind == "eval"
    line = expect_error(
        cli, tmp_path, (str(eval_artifact),), "finetune", eval_artifact, "--data", small_csv
    )
    assert "eval" in line.replace(str(eval_artifact), "")
    assert "model" in line.replace(str(eval_artifact), "")


# --- damaged artifacts -------------------------------------------------------------------------


def _tamper(path: Path) -> None:
    weights = path / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # inside the tensor data: same size, different hash
    weights.write_bytes(bytes(blob))


def _truncate(path: Path) -> None:
    weights = path / "model.safetensors"
    blob = weights.read_bytes()
    weights.write_bytes(blob[: len(blob) // 2])


@pytest.mark.parametrize("damage", [_tamper, _truncate], ids=["tampered", "truncated"])
@pytest.mark.parametrize("command", ["verify", "eval", "finetune"])
def test_damaged_weights_are_named(
    cli: Cli,
    tmp_path: Path,
    tiny_bert_artifact: Path,
    small_csv: Path,
    command: str,
    damage: Callable[[Path], None],
) -> None:
    copy = _copy(tiny_bert_artifact, tmp_path)
    damage(copy)
    data = ["--data", small_csv] if command != "verify" else []
    expect_error(cli, tmp_path, ("model.safetensors",), command, copy, *data)


@pytest.mark.parametrize("command", ["verify", "eval"])
def test_manifest_path_outside_the_directory(
    cli: Cli, tmp_path: Path, tiny_bert_artifact: Path, small_csv: Path, command: str
) -> None:
    copy = _copy(tiny_bert_artifact, tmp_path)
    evil = tmp_path / "evil.txt"
    evil.write_text("not yours\n")

    def add_escape(raw: dict[str, Any]) -> None:
        entry = next(iter(raw["files"].values()))
        raw["files"]["../evil.txt"] = dict(entry)

    _edit_manifest(copy, add_escape)
    data = ["--data", small_csv] if command != "verify" else []
    expect_error(cli, tmp_path, ("../evil.txt",), command, copy, *data)
    assert evil.read_text() == "not yours\n"


@pytest.mark.parametrize("command", ["verify", "inspect", "finetune"])
def test_newer_kind_version_asks_for_an_upgrade(
    cli: Cli, tmp_path: Path, tiny_bert_artifact: Path, small_csv: Path, command: str
) -> None:
    copy = _copy(tiny_bert_artifact, tmp_path)
    _edit_manifest(copy, lambda raw: raw.update(kind_version=99))
    data = ["--data", small_csv] if command == "finetune" else []
    line = expect_error(cli, tmp_path, ("99",), command, copy, *data)
    assert "upgrade" in line.lower()


# --- data --------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["finetune", "eval"])
@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (("--data", "builtin:nope"), "nope"),
        (("--data", "foo.txt"), "foo.txt"),
        (("--data", "{csv}", "--text-column", "nope"), "'nope'"),
        (("--data", "{csv}", "--label-column", "stars"), "'stars'"),
    ],
    ids=["unknown-builtin", "unknown-suffix", "unknown-text-column", "unknown-label-column"],
)
def test_unusable_data_spec(
    cli: Cli,
    tmp_path: Path,
    tiny_bert_artifact: Path,
    small_csv: Path,
    command: str,
    options: tuple[str, ...],
    needle: str,
) -> None:
    args = [str(small_csv) if value == "{csv}" else value for value in options]
    line = expect_error(cli, tmp_path, (needle,), command, tiny_bert_artifact, *args)
    if "column" in " ".join(options):
        assert "text" in line and "label" in line  # the columns the file does have


@pytest.mark.parametrize("command", ["finetune", "eval"])
def test_labels_that_do_not_match_the_model(
    cli: Cli, tmp_path: Path, tiny_bert_artifact: Path, command: str
) -> None:
    rows: list[tuple[object, object]] = [
        ("the movie was good", "pos"),
        ("the movie was bad", "neg"),
        ("the movie was odd", "maybe"),
    ]
    data = write_csv(tmp_path / "maybe.csv", rows)
    extra = ["--epochs", "1"] if command == "finetune" else []
    expect_error(cli, tmp_path, ("maybe",), command, tiny_bert_artifact, "--data", data, *extra)


@pytest.mark.parametrize("command", ["finetune", "eval"])
def test_empty_dataset(cli: Cli, tmp_path: Path, tiny_bert_artifact: Path, command: str) -> None:
    data = write_csv(tmp_path / "header-only.csv", [])
    expect_error(cli, tmp_path, ("header-only.csv",), command, tiny_bert_artifact, "--data", data)


# --- --out -------------------------------------------------------------------------------------


def test_out_holding_another_artifact_needs_force(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "X"
    first = _run(cli, "init", "--family", "bert", "--labels", "a,b", "--out", out)
    assert first.code == 0, first.err
    assert first.out == f"{out}\n"
    old_id = open_artifact(out).id

    line = expect_error(
        cli,
        tmp_path,
        (str(out),),
        "init",
        "--family",
        "bert",
        "--labels",
        "a,b",
        "--seed",
        "1",
        "--out",
        out,
    )
    assert "--force" in line
    assert open_artifact(out).id == old_id  # untouched

    forced = _run(
        cli, "init", "--family", "bert", "--labels", "a,b", "--seed", "1", "--out", out, "--force"
    )
    assert forced.code == 0, forced.err
    assert forced.out == f"{out}\n"
    replaced = open_artifact(out)
    assert replaced.id != old_id
    assert replaced.manifest.config["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "artifacts") == ["X"], (
        "no temp or trash directories may be left beside --out"
    )


def test_same_command_twice_reuses(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "X"
    args = ("init", "--family", "bert", "--labels", "a,b", "--out", out)
    first = _run(cli, *args)
    assert first.code == 0, first.err
    manifest = out / "manifest.json"
    stamp = manifest.stat().st_mtime_ns
    before = _tree(tmp_path)

    second = _run(cli, *args)
    assert second.code == 0, second.err
    assert second.out == first.out == f"{out}\n"
    assert manifest.stat().st_mtime_ns == stamp
    assert _tree(tmp_path) == before


def test_same_command_twice_reuses_default_location(cli: Cli, tmp_path: Path) -> None:
    args = ("init", "--family", "bert", "--labels", "a,b")
    first = _run(cli, *args)
    assert first.code == 0, first.err
    manifest = Path(first.out.strip()) / "manifest.json"
    stamp = manifest.stat().st_mtime_ns
    second = _run(cli, *args)
    assert second.code == 0, second.err
    assert second.out == first.out
    assert manifest.stat().st_mtime_ns == stamp


# --- bad values: ours to validate, exit 1 ------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("init", "--family", "gpt", "--labels", "a,b"), "gpt"),
        (("init", "--family", "bert", "--preset", "huge", "--labels", "a,b"), "huge"),
        (("init", "--family", "bert", "--labels", "a"), "label"),
        (("init", "--family", "bert", "--labels", "a,a"), "a,a|repeat|duplicate"),
        (("finetune", "{model}", "--data", "{csv}", "--epochs", "0"), "--epochs"),
        (("finetune", "{model}", "--data", "{csv}", "--lr", "5"), "--lr"),
        (("finetune", "{model}", "--data", "{csv}", "--batch-size", "0"), "--batch-size"),
        (("finetune", "{model}", "--data", "{csv}", "--threads", "0"), "--threads"),
        (("eval", "{model}", "--data", "{csv}", "--batch-size", "0"), "--batch-size"),
        (("eval", "{model}", "--data", "{csv}", "--threads", "0"), "--threads"),
        (("finetune", "{model}", "--data", "{csv}", "--device", "tpu"), "tpu"),
    ],
    ids=[
        "unknown-family",
        "unknown-preset",
        "one-label",
        "repeated-label",
        "epochs-0",
        "lr-5",
        "finetune-batch-size-0",
        "finetune-threads-0",
        "eval-batch-size-0",
        "eval-threads-0",
        "unknown-device",
    ],
)
def test_bad_values_exit_1(
    cli: Cli,
    tmp_path: Path,
    tiny_bert_artifact: Path,
    small_csv: Path,
    args: tuple[str, ...],
    needle: str,
) -> None:
    argv = [
        str(tiny_bert_artifact) if a == "{model}" else str(small_csv) if a == "{csv}" else a
        for a in args
    ]
    line = expect_error(cli, tmp_path, (), *argv)
    # A needle "x|y" accepts either wording.
    assert any(n.lower() in line.lower() for n in needle.split("|")), f"{needle!r} not in {line!r}"


def test_cuda_without_a_gpu_exits_1(
    cli: Cli, tmp_path: Path, tiny_bert_artifact: Path, small_csv: Path
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    expect_error(
        cli,
        tmp_path,
        ("cuda",),
        "finetune",
        tiny_bert_artifact,
        "--data",
        small_csv,
        "--device",
        "cuda",
    )


# --- usage errors: Typer's, exit 2, short -------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("init", "--bogus"), "--bogus"),
        (("finetune",), "model"),
        (("finetune", "{model}", "--data", "{csv}", "--epochs", "abc"), "--epochs"),
    ],
    ids=["unknown-option", "missing-argument", "non-integer"],
)
def test_usage_errors_exit_2(
    cli: Cli,
    tmp_path: Path,
    tiny_bert_artifact: Path,
    small_csv: Path,
    args: tuple[str, ...],
    needle: str,
) -> None:
    argv = [
        str(tiny_bert_artifact) if a == "{model}" else str(small_csv) if a == "{csv}" else a
        for a in args
    ]
    line = expect_error(cli, tmp_path, (), *argv, code=2)
    assert needle.lower() in line.lower(), f"{needle!r} not in {line!r}"
