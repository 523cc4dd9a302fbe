"""`builtin:photo-patches` and `uqc eval --ood`: OOD metrics equal an independent computation,
ensembles add mutual information, and an ONNX export measures like its source model."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from uqcompress.artifacts import open_artifact
from uqcompress.data import builtin as builtin_data
from uqcompress.data import load_data
from uqcompress.models.loading import load_model, resolve_model_source

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SCORES = ("msp", "entropy")
OOD_KEYS = ("auroc", "aupr", "fpr95")


# --------------------------------------------------------------------------- photo-patches


def _independent_tiles() -> np.ndarray:
    """Every non-overlapping 8x8 tile of the sample photos, china.jpg then flower.jpg,
    row-major within each photo, as PIL "L" grey values. Shape: `[T, 8, 8]`."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    bunch = load_sample_images()
    by_name = {Path(f).name: img for f, img in zip(bunch.filenames, bunch.images, strict=True)}
    tiles = []
    for name in ("china.jpg", "flower.jpg"):
        grey = np.array(Image.fromarray(by_name[name]).convert("L"), dtype=np.float32)
        for top in range(0, grey.shape[0] - 7, 8):
            for left in range(0, grey.shape[1] - 7, 8):
                tiles.append(grey[top : top + 8, left : left + 8])
    return np.stack(tiles)


def test_photo_patches_are_seeded_grey_tiles_of_the_sample_photos() -> None:
    data = load_data("builtin:photo-patches")
    assert data.spec == "builtin:photo-patches" and data.name == "photo-patches"
    assert data.input_kind == "image"
    assert data.labels is None
    assert len(data) == 1000
    assert data.images is not None
    images = data.images.as_pixels(1)
    assert images.shape == (1000, 1, 8, 8) and images.dtype == np.float32
    assert images.min() >= 0.0 and images.max() <= 255.0
    assert images.max() > 200 and images.min() < 50  # the 0..255 scale is used
    assert float(images.std(axis=(1, 2, 3)).mean()) > 1.0  # textured tiles, not flat

    tiles = _independent_tiles()
    assert len(tiles) == 2 * (427 // 8) * (640 // 8)
    pick = np.sort(np.random.default_rng(0).choice(len(tiles), 1000, replace=False))
    assert pick[-1] >= len(tiles) // 2 > pick[0]  # both photos contribute
    flower_first = int(np.argmax(pick >= len(tiles) // 2))
    for k in (0, 1, 357, flower_first, 999):
        np.testing.assert_array_equal(images[k, 0], tiles[pick[k]])

    # Deterministic: rebuilt from scratch, the same pixels and fingerprint.
    fingerprint = data.fingerprint
    builtin_data._photo_patch_pixels.cache_clear()
    again = load_data("builtin:photo-patches")
    assert again.fingerprint == fingerprint
    assert again.images is not None
    np.testing.assert_array_equal(again.images.as_pixels(1), images)
    assert fingerprint != load_data("builtin:digits@val").fingerprint


# --------------------------------------------------------------------------- eval --ood


def _member_probs(model_path: Path, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """The model's softmax in float64, batched like `uqc eval`. Shape: `[N, C]`."""
    loaded = load_model(resolve_model_source(model_path))
    assert loaded.preprocessing is not None
    pixels = loaded.preprocessing.normalise(images)
    chunks = []
    with torch.inference_mode():
        for start in range(0, len(pixels), batch_size):
            batch = torch.from_numpy(pixels[start : start + batch_size])
            chunks.append(loaded.model(pixel_values=batch).logits.float().numpy())
    logits = np.concatenate(chunks).astype(np.float64)
    return torch.softmax(torch.from_numpy(logits), dim=-1).numpy()


def _entropy(p: np.ndarray) -> np.ndarray:
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def _images(spec: str) -> np.ndarray:
    images = load_data(spec, require_labels=False).images
    assert images is not None
    return images.as_pixels(1)


def _artifacts_empty() -> bool:
    root = Path(os.environ["UQC_ARTIFACTS"])
    return not root.exists() or not any(root.iterdir())


def test_eval_with_ood_reports_detection_metrics(
    cli: Callable[..., Any], tiny_vit_artifact: Path
) -> None:
    from sklearn.metrics import average_precision_score, roc_auc_score

    result = cli(
        "eval",
        tiny_vit_artifact,
        "--data",
        "builtin:digits@val",
        "--ood",
        "builtin:photo-patches",
    )
    assert result.code == 0, result.err
    path = Path(result.out.strip())
    summary = open_artifact(path).manifest.summary
    for key in ("acc", "nll", "brier", "ece", "aurc"):
        assert isinstance(summary[key], float) and np.isfinite(summary[key])
    for score in SCORES:
        for key in OOD_KEYS:
            value = summary[f"ood.photo-patches.{score}.{key}"]
            assert 0.0 <= value <= 1.0
    assert not any(k == "mi" or ".mi." in k for k in summary)
    assert "disagreement" not in summary
    assert summary["members"] == 1 and summary["examples"] == 180
    metrics = json.loads((path / "metrics.json").read_text())
    assert metrics["ood.photo-patches.entropy.auroc"] == summary["ood.photo-patches.entropy.auroc"]
    for png in ("reliability.png", "ood_scores.png"):
        data = (path / png).read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 1000

    p_in = _member_probs(tiny_vit_artifact, _images("builtin:digits@val"))
    p_out = _member_probs(tiny_vit_artifact, _images("builtin:photo-patches"))
    is_out = np.r_[np.zeros(len(p_in)), np.ones(len(p_out))]
    entropy = np.r_[_entropy(p_in), _entropy(p_out)]
    msp = np.r_[1 - p_in.max(axis=1), 1 - p_out.max(axis=1)]
    assert summary["ood.photo-patches.entropy.auroc"] == pytest.approx(
        roc_auc_score(is_out, entropy), abs=1e-6
    )
    assert summary["ood.photo-patches.entropy.aupr"] == pytest.approx(
        average_precision_score(is_out, entropy), abs=1e-6
    )
    # each example's scores are kept for `uqc compare`'s histograms, in example order
    from uqcompress.steps.eval import SCORES_FILE, read_scores

    kept_in, kept_ood = read_scores(path / SCORES_FILE)
    assert set(kept_in) == set(SCORES) and set(kept_ood) == {"photo-patches"}
    np.testing.assert_allclose(kept_in["entropy"], _entropy(p_in), atol=1e-5)
    np.testing.assert_allclose(kept_ood["photo-patches"]["msp"], 1 - p_out.max(axis=1), atol=1e-5)
    assert summary["ood.photo-patches.msp.auroc"] == pytest.approx(
        roc_auc_score(is_out, msp), abs=1e-6
    )
    labels = np.asarray(load_data("builtin:digits@val").labels)
    assert summary["acc"] == pytest.approx(float(np.mean(p_in.argmax(axis=1) == labels)))


def test_two_model_ensemble_reports_disagreement_and_mi(
    cli: Callable[..., Any], tmp_path: Path, tiny_vit_artifact: Path
) -> None:
    from sklearn.metrics import roc_auc_score

    from uqcompress.steps import init

    other = init.run(
        init.InitConfig(family="vit", labels=[str(d) for d in range(10)], seed=1),
        tmp_path / "vit-seed1",
    ).artifact.path
    assert open_artifact(other).id != open_artifact(tiny_vit_artifact).id
    result = cli(
        "eval",
        tiny_vit_artifact,
        other,
        "--data",
        "builtin:digits@val",
        "--ood",
        "builtin:photo-patches",
    )
    assert result.code == 0, result.err
    summary = open_artifact(Path(result.out.strip())).manifest.summary
    assert summary["members"] == 2
    for key in OOD_KEYS:
        assert 0.0 <= summary[f"ood.photo-patches.mi.{key}"] <= 1.0

    members_in = np.stack(
        [_member_probs(m, _images("builtin:digits@val")) for m in (tiny_vit_artifact, other)],
        axis=1,
    )  # [N, M, C]
    ensemble = members_in.mean(axis=1)
    want = float(np.mean(members_in.argmax(axis=2) != ensemble.argmax(axis=1)[:, None]))
    assert want > 0  # two differently seeded random models do disagree
    assert summary["disagreement"] == pytest.approx(want, abs=1e-12)

    members_out = np.stack(
        [_member_probs(m, _images("builtin:photo-patches")) for m in (tiny_vit_artifact, other)],
        axis=1,
    )

    def mi(members: np.ndarray) -> np.ndarray:
        return _entropy(members.mean(axis=1)) - _entropy(members).mean(axis=1)

    scores = np.r_[mi(members_in), mi(members_out)]
    is_out = np.r_[np.zeros(len(members_in)), np.ones(len(members_out))]
    assert summary["ood.photo-patches.mi.auroc"] == pytest.approx(
        roc_auc_score(is_out, scores), abs=1e-6
    )


def test_eval_of_onnx_export_equals_eval_of_source(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, tiny_vit_artifact: Path
) -> None:
    from uqcompress.steps import eval as eval_step
    from uqcompress.steps import export

    out = tmp_path_factory.getbasetemp() / "shared-exports" / "vit-onnx"  # built once
    exported = export.run(
        tiny_vit_artifact, export.ExportConfig(format="onnx", data="builtin:digits@test"), out
    ).artifact.path
    cfg = eval_step.EvalConfig(data="builtin:digits@val", ood=["builtin:photo-patches"])
    onnx_eval = eval_step.run([exported], cfg, tmp_path / "onnx").artifact
    torch_eval = eval_step.run([tiny_vit_artifact], cfg, tmp_path / "torch").artifact
    assert onnx_eval.manifest.inputs[0].id == open_artifact(exported).id
    assert torch_eval.manifest.inputs[0].id == open_artifact(tiny_vit_artifact).id
    from_onnx, reference = onnx_eval.manifest.summary, torch_eval.manifest.summary
    for key in ("acc", "nll", "ece", "brier", "ood.photo-patches.entropy.auroc"):
        assert from_onnx[key] == pytest.approx(reference[key], abs=1e-5), key
    assert from_onnx["examples"] == reference["examples"] == 180
    assert from_onnx["members"] == 1


def test_ood_sets_with_the_same_name_are_refused(
    cli: Callable[..., Any], tiny_vit_artifact: Path
) -> None:
    result = cli(
        "eval",
        tiny_vit_artifact,
        "--data",
        "builtin:digits@val",
        "--ood",
        "builtin:photo-patches",
        "--ood",
        "builtin:photo-patches",
    )
    assert result.code == 1, result.err
    assert result.out == ""
    errors = [line for line in result.err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "photo-patches" in errors[0], result.err
    assert _artifacts_empty()
