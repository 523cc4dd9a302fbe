"""Shared fixtures: no network, one torch thread, artifacts in a temp dir, a CLI runner."""

from __future__ import annotations

import csv
import io
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_VERBOSITY"] = "error"
os.environ.setdefault("UQC_THREADS", "1")
# Rich sizes tables to the terminal; tests (and pytest-xdist workers, which have none) get one
# fixed width, wide enough that no header is cut.
os.environ["COLUMNS"] = "200"

POSITIVE = ["good", "great", "love", "excellent", "amazing", "wonderful", "best", "fun"]
NEGATIVE = ["bad", "awful", "terrible", "hate", "worst", "boring", "poor", "dull"]
FILLER = ["the", "movie", "film", "was", "really", "very", "story", "acting", "and", "it"]


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture(autouse=True)
def _artifacts_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test writes default-location artifacts into its own temp dir."""
    root = tmp_path / "artifacts"
    monkeypatch.setenv("UQC_ARTIFACTS", str(root))
    return root


@pytest.fixture
def cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., CliResult]:
    """Run `uqc ARGS` in-process; returns exit code, stdout and stderr."""
    from uqcompress.cli.app import run

    def invoke(*args: str, stdin: str | None = None) -> CliResult:
        capsys.readouterr()
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        code = run([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code=code, out=captured.out, err=captured.err)

    return invoke


def ok(result: CliResult) -> str:
    """The path a successful step printed (the test fails with its stderr otherwise)."""
    assert result.code == 0, result.err
    return str(result.out.strip())


def sentiment_rows(n: int, seed: int) -> list[tuple[str, str]]:
    """A separable toy sentiment task over words in the shipped vocabulary."""
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = "pos" if i % 2 == 0 else "neg"
        cue = rng.sample(POSITIVE if label == "pos" else NEGATIVE, 2)
        words = rng.sample(FILLER, 4) + cue
        rng.shuffle(words)
        rows.append((" ".join(words), label))
    return rows


def write_csv(
    path: Path, rows: list[tuple[object, object]], header: tuple[str, str] = ("text", "label")
) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.fixture(scope="session")
def sentiment_csv(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sentiment")
    return {
        "train": write_csv(root / "train.csv", list(sentiment_rows(96, seed=1))),
        "test": write_csv(root / "test.csv", list(sentiment_rows(40, seed=2))),
    }


@pytest.fixture(scope="session")
def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("session-artifacts")


@pytest.fixture(scope="session")
def tiny_bert_artifact(session_root: Path) -> Path:
    """An untrained tiny BERT model artifact (labels neg,pos), built once per session."""
    from uqcompress.steps import init

    return init.run(
        init.InitConfig(family="bert", labels=["neg", "pos"]), session_root / "bert-init"
    ).artifact.path


@pytest.fixture(scope="session")
def tiny_llama_artifact(session_root: Path) -> Path:
    """An untrained tiny Llama model artifact (labels neg,pos), built once per session."""
    from uqcompress.steps import init

    return init.run(
        init.InitConfig(family="llama", preset="tiny", labels=["neg", "pos"], seed=0),
        session_root / "llama-init",
    ).artifact.path


@pytest.fixture(scope="session")
def tiny_vit_artifact(session_root: Path) -> Path:
    from uqcompress.steps import init

    return init.run(
        init.InitConfig(family="vit", labels=[str(d) for d in range(10)]), session_root / "vit-init"
    ).artifact.path


@pytest.fixture(scope="session")
def trained_bert_artifact(
    session_root: Path, tiny_bert_artifact: Path, sentiment_csv: dict[str, Path]
) -> Path:
    from uqcompress.steps import finetune

    cfg = finetune.FinetuneConfig(
        data=str(sentiment_csv["train"]), epochs=8, lr=3e-3, batch_size=16
    )
    return finetune.run(tiny_bert_artifact, cfg, session_root / "bert-ft").artifact.path


# Session-wide ONNX exports of the tiny models: each export costs seconds, so build it once.
def shared_export(
    tmp_path_factory: pytest.TempPathFactory, source: Path, name: str, data: str | None
) -> Path:
    from uqcompress.steps import export

    out = tmp_path_factory.getbasetemp() / "shared-exports" / name
    cfg = export.ExportConfig(format="onnx", data=data)
    return export.run(source, cfg, out).artifact.path


@pytest.fixture(scope="session")
def bert_onnx(
    tmp_path_factory: pytest.TempPathFactory,
    trained_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
) -> Path:
    """The trained tiny BERT (non-zero classifier bias, confident probs) as ONNX."""
    return shared_export(
        tmp_path_factory, trained_bert_artifact, "bert-onnx", str(sentiment_csv["test"])
    )


@pytest.fixture(scope="session")
def vit_onnx(tmp_path_factory: pytest.TempPathFactory, tiny_vit_artifact: Path) -> Path:
    return shared_export(tmp_path_factory, tiny_vit_artifact, "vit-onnx", "builtin:digits@test")


@pytest.fixture(scope="session")
def vit_onnx_nodata(tmp_path_factory: pytest.TempPathFactory, tiny_vit_artifact: Path) -> Path:
    """Exported without --data: the parity gate runs on synthetic images only."""
    return shared_export(tmp_path_factory, tiny_vit_artifact, "vit-onnx-nodata", None)


@pytest.fixture(scope="session")
def briefly_trained_vit(session_root: Path, tiny_vit_artifact: Path) -> Path:
    """The tiny ViT after 2 epochs on digits@val (lr 3e-3): trained enough for methods built
    on a fine-tuned model (SVE, Hydra members) to have something to keep."""
    from uqcompress.steps import finetune

    cfg = finetune.FinetuneConfig(data="builtin:digits@val", epochs=2, lr=3e-3)
    return finetune.run(tiny_vit_artifact, cfg, session_root / "vit-briefly-trained").artifact.path


# The modules that take longest run first: xdist's loadscope hands out modules in collection
# order, so a long module collected last (the family conformance chain, about a third of the
# suite's time) would run alone at the end while the other worker idles.
LONGEST_FIRST = (
    "tests/models/test_family_conformance.py",
    "tests/docs/test_walkthrough_examples.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within each group is kept
