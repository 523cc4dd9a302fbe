"""packaging/build_runtime.py: the `uqcompress-runtime` wheel, installed alone in a fresh venv
(no torch, transformers or accelerate there), predicts what the toolchain's Predictor does."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "packaging"))
import build_runtime  # noqa: E402

CHILD = r"""
import importlib.util, json, sys
absent = {m: importlib.util.find_spec(m) is None for m in ("torch", "transformers", "accelerate")}
try:
    import torch  # noqa: F401
    torch_fails = False
except ModuleNotFoundError:
    torch_fails = True
import numpy as np
import uqcompress
from uqcompress.export.runtime import Predictor

bert, vit, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
images = np.random.default_rng(0).integers(0, 256, size=(5, 1, 8, 8)).astype(np.float32)
print(json.dumps({
    "absent": absent,
    "torch_fails": torch_fails,
    "package": uqcompress.__file__,
    "text": Predictor(bert).predict_texts(texts, batch_size=2).probs.tolist(),
    "image": Predictor(vit).predict_pixels(images, batch_size=2).probs.tolist(),
    "images": images.tolist(),
}))
"""

TEXTS = ["a wonderful, moving film", "dull and far too long", "fine", "the worst plot ever"]


def test_runtime_wheel_alone_predicts_like_the_toolchain(
    tmp_path: Path, bert_onnx: Path, vit_onnx: Path
) -> None:
    from uqcompress.export.runtime import Predictor

    wheel = build_runtime.build(tmp_path / "dist")
    with __import__("zipfile").ZipFile(wheel) as archive:
        shipped = {n for n in archive.namelist() if n.endswith(".py")}
    assert set(build_runtime.RUNTIME_MODULES) <= shipped
    assert "uqcompress/steps/export.py" not in shipped  # the toolchain stays out

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{wheel}[cpu]"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    proc = subprocess.run(
        [str(python), "-c", CHILD, str(bert_onnx), str(vit_onnx), json.dumps(TEXTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # not the repository: the installed package, not the checkout
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    assert child["absent"] == {"torch": True, "transformers": True, "accelerate": True}
    assert child["torch_fails"] is True
    assert str(env_dir) in child["package"]
    np.testing.assert_allclose(
        child["text"], Predictor(bert_onnx).predict_texts(TEXTS).probs, atol=1e-6
    )
    images = np.asarray(child["images"], dtype=np.float32)
    np.testing.assert_allclose(
        child["image"], Predictor(vit_onnx).predict_pixels(images).probs, atol=1e-6
    )
