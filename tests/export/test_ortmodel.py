"""An ONNX export loads in optimum's ORTModelFor*Classification (the real optimum-onnx, in a
venv of its own: it needs transformers 4) and gives the Predictor's probabilities."""

from __future__ import annotations

import json
import site
import subprocess
import venv
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import ok
from uqcompress.export.graph import _outputs

HERE = Path(__file__).parent
CHILD = r"""
import json, sys
import numpy as np
from optimum.onnxruntime import ORTModelForImageClassification, ORTModelForSequenceClassification
from transformers import AutoTokenizer, pipeline
import transformers

text_dirs, image_dir = json.loads(sys.argv[1]), sys.argv[2]
texts, pixels = json.loads(sys.argv[3]), sys.argv[4]
def softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).tolist()
text, top = [], []
for text_dir in text_dirs:
    model = ORTModelForSequenceClassification.from_pretrained(text_dir)
    tokenizer = AutoTokenizer.from_pretrained(text_dir)
    encoded = tokenizer(texts, return_tensors="np", padding=True, truncation=True)
    text.append(softmax(model(**encoded).logits))
    classify = pipeline("text-classification", model=model, tokenizer=tokenizer)
    top.append([r["label"] for r in classify(texts, truncation=True)])  # as long inputs need
image_model = ORTModelForImageClassification.from_pretrained(image_dir)
image_logits = image_model(pixel_values=np.load(pixels)).logits
print(json.dumps({
    "transformers": transformers.__version__,
    "text": text,
    "top": top,
    "image": softmax(image_logits),
}))
"""

TEXTS = ["a wonderful, moving film", "dull " * 400, "fine", "the worst plot ever"]


def test_the_logits_output_is_log_mean_probs_for_an_ensemble() -> None:
    member_logits = torch.randn(4, 3, 5) * 4
    member_logits[0, :, 0] = -200.0  # a probability that underflows to 0: still finite
    out = _outputs(member_logits)
    probs, logits = out[1], out[4]
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(torch.softmax(logits, -1), probs, atol=1e-6, rtol=0)
    single = torch.randn(4, 1, 5)
    torch.testing.assert_close(_outputs(single)[4], single[:, 0])  # M = 1: the logits


@pytest.fixture(scope="module")
def optimum_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env_dir = tmp_path_factory.mktemp("optimum") / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    found = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True,
        text=True,
        check=True,
    )
    # after its own site-packages: the project's venv for torch, onnxruntime, numpy, ...
    project = next(p for p in site.getsitepackages() if p.endswith("site-packages"))
    (Path(found.stdout.strip()) / "zz_project_venv.pth").write_text(project + "\n")
    install = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "-r",
            str(HERE / "optimum-requirements.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    return python


def test_optimum_ortmodel_loads_exports_and_agrees_with_the_predictor(
    optimum_python: Path,
    bert_onnx: Path,
    vit_onnx: Path,
    trained_bert_artifact: Path,
    tmp_path: Path,
    cli: Any,
) -> None:
    from uqcompress.export.runtime import Predictor

    # a Hydra of 2 members too: ORTModel reads its `logits` (log of the members' mean probs)
    scores = ok(cli("score", trained_bert_artifact, "--method", "random", "--members", "2"))
    members = ok(cli("prune", scores, "--members", "2"))
    hydra = Path(ok(cli("export", ok(cli("fuse", members)), "--format", "onnx")))
    assert Predictor(hydra).members == 2
    for export in (bert_onnx, hydra, vit_onnx):
        summary = json.loads((export / "manifest.json").read_text())["summary"]
        assert summary["loads_with"].startswith("optimum.onnxruntime.ORTModelFor")
        assert (export / "config.json").is_file()
    image = Predictor(vit_onnx)
    pixels = np.random.default_rng(0).integers(0, 256, (3, 1, 8, 8)).astype(np.float32)
    encoded = image.encode_pixels(pixels)["pixel_values"]
    np.save(tmp_path / "pixels.npy", encoded)
    proc = subprocess.run(
        [
            str(optimum_python),
            "-c",
            CHILD,
            json.dumps([str(bert_onnx), str(hydra)]),
            str(vit_onnx),
            json.dumps(TEXTS),
            str(tmp_path / "pixels.npy"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    assert child["transformers"].startswith("4.")  # optimum's own transformers, not ours
    for export, probs, top in zip((bert_onnx, hydra), child["text"], child["top"], strict=True):
        text = Predictor(export).predict_texts(TEXTS)
        assert np.ptp(text.probs[:, 0]) > 1e-3  # the texts are told apart
        np.testing.assert_allclose(probs, text.probs, atol=1e-5)
        assert top == text.labels
    np.testing.assert_allclose(child["image"], image.predict_pixels(pixels).probs, atol=1e-5)
