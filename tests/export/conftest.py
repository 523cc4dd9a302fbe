"""Session-wide ONNX exports of the tiny models: each export costs seconds, so build it once.

Exports land in fixed directories under the session's base temp dir; a module elsewhere that
exports the same model with the same config into the same directory reuses it (same id).
"""

from __future__ import annotations

from pathlib import Path

import pytest


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
