"""The torch-free Predictor: equals torch on raw inputs (padding included) and runs where
torch cannot even be imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from tests.process_memory import status
from uqcompress.data import load_data
from uqcompress.errors import ArtifactError
from uqcompress.export.runtime import Predictor
from uqcompress.models.loading import load_model, resolve_model_source

TEXTS = [
    "good",
    "the movie was really very bad and the acting was awful and boring and the story was dull "
    "and it was the worst film",
    "love it",
    "great fun",
    "the story and the acting were excellent, amazing, wonderful: the best movie",
    "poor",
    "hate",
]


def _entropy(p: np.ndarray) -> np.ndarray:
    return -np.sum(p * np.log(p), axis=-1)


def _torch_text_probs(model_path: Path, texts: list[str]) -> np.ndarray:
    loaded = load_model(resolve_model_source(model_path))
    assert loaded.tokenizer is not None
    batch = loaded.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        logits = loaded.model(**batch).logits
    return torch.softmax(logits.double(), dim=-1).numpy()


def _torch_image_probs(model_path: Path, images: np.ndarray) -> np.ndarray:
    loaded = load_model(resolve_model_source(model_path))
    assert loaded.preprocessing is not None
    pixels = torch.from_numpy(loaded.preprocessing.normalise(images))
    with torch.inference_mode():
        logits = loaded.model(pixel_values=pixels).logits
    return torch.softmax(logits.double(), dim=-1).numpy()


def test_text_predictor_equals_torch_with_padding(
    bert_onnx: Path, trained_bert_artifact: Path
) -> None:
    predictor = Predictor(bert_onnx)
    encoded = predictor.encode_texts(TEXTS[:3])
    lengths = encoded["attention_mask"].sum(axis=1)
    assert lengths.max() > 3 * lengths.min()  # one batch mixes very different lengths
    assert (encoded["attention_mask"] == 0).any()

    got = predictor.predict_texts(TEXTS, batch_size=3)
    want = _torch_text_probs(trained_bert_artifact, TEXTS)
    assert got.probs.shape == (len(TEXTS), 2)
    assert got.member_logits.shape == (len(TEXTS), 1, 2)
    assert want.max() > 0.8  # the trained model is confident somewhere: a real comparison
    np.testing.assert_allclose(got.probs, want, atol=1e-4, rtol=0)
    np.testing.assert_allclose(got.entropy, _entropy(want), atol=1e-4, rtol=0)
    np.testing.assert_allclose(got.mutual_info, 0.0, atol=1e-6)
    assert got.labels == [["neg", "pos"][i] for i in want.argmax(axis=1)]
    assert predictor.labels == ["neg", "pos"] and predictor.members == 1


def test_length_buckets_sort_by_length_and_bound_batch_and_padding() -> None:
    from uqcompress.export.runtime import BUCKET_PADDING, length_buckets

    lengths = [int(n) for n in np.random.default_rng(0).integers(3, 60, size=200)]
    buckets = length_buckets(lengths, batch_size=16)
    assert sorted(np.concatenate(buckets).tolist()) == list(range(200))  # each once
    assert max(len(b) for b in buckets) == 16  # full calls where lengths allow
    for bucket in buckets:
        sizes = [lengths[i] for i in bucket]
        assert max(sizes) * len(sizes) <= BUCKET_PADDING * sum(sizes)
    assert len(buckets) < 200 / 4  # merging still happens on mixed lengths
    assert [len(b) for b in length_buckets([5] * 7, batch_size=3)] == [3, 3, 1]
    assert length_buckets([], batch_size=3) == []


def test_texts_share_calls_by_length_and_come_back_in_order(
    bert_onnx: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 40 texts of mixed lengths, batches of 4: three windows of 32, bucketed by length; the
    # outputs equal one text per call, in the order given
    from uqcompress.export.runtime import BUCKET_PADDING

    rng = np.random.default_rng(1)
    words = " ".join(TEXTS).replace(",", "").replace(":", "").split()
    texts = [" ".join(rng.choice(words, size=rng.integers(1, 30))) for _ in range(40)]
    predictor = Predictor(bert_onnx)
    alone = [predictor.predict_texts([t]) for t in texts]
    masks: list[np.ndarray] = []
    real_run = predictor.run

    def recording_run(inputs: dict[str, np.ndarray]) -> Any:
        masks.append(inputs["attention_mask"])
        return real_run(inputs)

    monkeypatch.setattr(predictor, "run", recording_run)
    got = predictor.predict_texts(texts, batch_size=4)
    assert sum(len(m) for m in masks) == 40 and max(len(m) for m in masks) == 4
    assert len(masks) < 40 / 2  # merged, not one call per text
    for mask in masks:
        assert mask.size <= BUCKET_PADDING * mask.sum()
    np.testing.assert_allclose(got.probs, np.concatenate([a.probs for a in alone]), atol=1e-5)
    np.testing.assert_allclose(
        got.member_logits, np.concatenate([a.member_logits for a in alone]), atol=1e-4
    )
    assert got.labels == [a.labels[0] for a in alone]
    assert np.ptp(got.probs[:, 0]) > 0.1  # the texts differ: a wrong order would show


@pytest.mark.parametrize("blank", ["", "  ", "[CLS] [SEP]"])
def test_text_predictor_refuses_a_text_with_no_real_token(bert_onnx: Path, blank: str) -> None:
    """Issue 26 item 11: the ONNX path refuses what torch `encode` refuses, naming the text by
    its place in the whole list (not in its batch)."""
    from uqcompress.errors import DataError

    predictor = Predictor(bert_onnx)
    texts = ["good film"] * 5 + [blank, "bad film"]
    with pytest.raises(DataError, match=r"text 6 \(counting from 1\) has no real token"):
        predictor.predict_texts(texts, batch_size=2)
    with pytest.raises(DataError, match="has no real token"):
        predictor.encode_texts([blank])
    assert predictor.predict_texts(["a"]).probs.shape == (1, 2)


def test_image_predictor_equals_torch(vit_onnx: Path, tiny_vit_artifact: Path) -> None:
    source = load_data("builtin:digits@test").images
    assert source is not None
    images = source.as_pixels(1)[:20]
    predictor = Predictor(vit_onnx)
    got = predictor.predict_pixels(images, batch_size=3)
    want = _torch_image_probs(tiny_vit_artifact, images)
    assert got.probs.shape == (20, 10)
    np.testing.assert_allclose(got.probs.sum(axis=1), 1.0, atol=1e-5)
    # The examples differ by more than the tolerance, so an order or preprocessing slip shows.
    assert want.std(axis=0).max() > 2e-4
    np.testing.assert_allclose(got.probs, want, atol=1e-4, rtol=0)
    np.testing.assert_allclose(got.entropy, _entropy(want), atol=1e-4, rtol=0)
    np.testing.assert_allclose(got.mutual_info, 0.0, atol=1e-6)
    assert got.labels == [str(i) for i in want.argmax(axis=1)]


CHILD = r"""
import json, sys
sys.modules["torch"] = None  # `import torch` now raises ImportError
try:
    import torch  # noqa: F401
    blocked = False
except ImportError:
    blocked = True
import numpy as np
from uqcompress.export.runtime import Predictor

bert_dir, vit_dir, texts_json = sys.argv[1], sys.argv[2], sys.argv[3]
texts = json.loads(texts_json)
rng = np.random.default_rng(0)
images = rng.integers(0, 256, size=(6, 1, 8, 8)).astype(np.float32)
text = Predictor(bert_dir).predict_texts(texts, batch_size=2)
image = Predictor(vit_dir).predict_pixels(images, batch_size=4)
print(json.dumps({
    "blocked": blocked,
    "text_probs": text.probs.tolist(),
    "text_labels": text.labels,
    "image_probs": image.probs.tolist(),
    "images": images.tolist(),
    "torch_after": repr(sys.modules.get("torch")),
    "torch_absent": sys.modules.get("torch") is None,
    "transformers_loaded": "transformers" in sys.modules,
}))
"""


def test_predictor_runs_without_torch(
    bert_onnx: Path, vit_onnx: Path, trained_bert_artifact: Path, tiny_vit_artifact: Path
) -> None:
    texts = TEXTS[:5]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(bert_onnx), str(vit_onnx), json.dumps(texts)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    assert child["blocked"] is True
    assert child["torch_absent"] is True, child["torch_after"]
    assert child["transformers_loaded"] is False

    text_probs = np.asarray(child["text_probs"])
    want_text = _torch_text_probs(trained_bert_artifact, texts)
    np.testing.assert_allclose(text_probs, want_text, atol=1e-4, rtol=0)
    assert child["text_labels"] == [["neg", "pos"][i] for i in want_text.argmax(axis=1)]

    images = np.asarray(child["images"], dtype=np.float32)
    assert images.max() > 200 and images.min() < 50  # the 0..255 scale, not 0..1
    want_image = _torch_image_probs(tiny_vit_artifact, images)
    np.testing.assert_allclose(np.asarray(child["image_probs"]), want_image, atol=1e-4, rtol=0)


def _plain_onnx(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_onnx_without_uqc_metadata_is_refused(tmp_path: Path) -> None:
    path = _plain_onnx(tmp_path / "plain.onnx")
    with pytest.raises(ArtifactError, match="uqc"):
        Predictor(path)
    directory = tmp_path / "dir"
    directory.mkdir()
    _plain_onnx(directory / "model.onnx")
    with pytest.raises(ArtifactError, match="uqc"):
        Predictor(directory)


def test_directory_without_model_onnx_is_refused(tmp_path: Path, bert_onnx: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((bert_onnx / "tokenizer.json").read_bytes())
    with pytest.raises(ArtifactError, match=r"model\.onnx"):
        Predictor(tmp_path)
    with pytest.raises(ArtifactError, match=r"model\.onnx"):
        Predictor(tmp_path / "missing")


def _with_metadata(source: Path, target: Path, key: str, edit: Any) -> Path:
    """A copy of an ONNX export whose metadata value `key` went through `edit` (a JSON
    object edited in place, or a plain string replaced)."""
    import shutil

    shutil.copytree(source, target)
    model = onnx.load(str(target / "model.onnx"))
    for prop in model.metadata_props:
        if prop.key == key:
            if callable(edit):
                value = json.loads(prop.value)
                edit(value)
                prop.value = json.dumps(value)
            else:
                prop.value = edit
    onnx.save(model, str(target / "model.onnx"))
    return target


@pytest.mark.parametrize(
    ("fixture", "key", "edit", "needle"),
    [
        (
            "bert_onnx",
            "uqc.preprocessing",
            lambda p: p.update(pad_token_id=100000),
            "pad_token_id is 100000 in uqc.preprocessing, outside the vocabulary (0..",
        ),
        (
            "bert_onnx",
            "uqc.preprocessing",
            lambda p: p.update(pad_token_id=-1),
            "pad_token_id is -1 in uqc.preprocessing, outside the vocabulary",
        ),
        (
            "bert_onnx",
            "uqc.preprocessing",
            lambda p: p.update(max_length=4096),
            "max_length is 4096 in uqc.preprocessing, above the graph's position table (128",
        ),
        (
            "vit_onnx",
            "uqc.preprocessing",
            lambda p: p.update(image_size=p["image_size"] * 2),
            "image_size is 16 in uqc.preprocessing; the graph takes 8x8 images",
        ),
        (
            "vit_onnx",
            "uqc.preprocessing",
            lambda p: p.update(num_channels=3),
            "num_channels is 3 in uqc.preprocessing; the graph takes 1",
        ),
        ("vit_onnx", "uqc.aggregation", "median_logits", "uqc.aggregation is 'median_logits'"),
    ],
)
def test_metadata_that_contradicts_the_graph_is_refused_at_load(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    fixture: str,
    key: str,
    edit: Any,
    needle: str,
) -> None:
    """issue 26 item 22: such metadata gave an ONNX Runtime traceback on the first batch (or
    was taken as it is); the Predictor refuses it when it loads, in one line."""
    forged = _with_metadata(request.getfixturevalue(fixture), tmp_path / "forged", key, edit)
    with pytest.raises(ArtifactError) as caught:
        Predictor(forged)
    assert needle in caught.value.message
    assert "does not follow the uqc export contract" in caught.value.message
    assert "\n" not in caught.value.message


def test_a_deferred_session_opens_on_the_first_run_and_is_checked_then(
    vit_onnx: Path, tmp_path: Path
) -> None:
    """`open_session=False` (what `uqc export` uses to free torch's weights before ONNX
    Runtime loads the graph's): inputs encode without a session; the first run opens it,
    checks the graph against the contract as an eager load does, and answers the same."""
    eager = Predictor(vit_onnx)
    lazy = Predictor(vit_onnx, open_session=False)
    size, channels = int(lazy.preprocessing["image_size"]), int(lazy.preprocessing["num_channels"])
    pixels = np.random.default_rng(0).uniform(0, 255, size=(3, channels, size, size))
    inputs = lazy.encode_pixels(pixels)
    assert lazy._session is None  # encoding needed no session
    got = lazy.run(inputs)
    assert lazy._session is not None
    np.testing.assert_array_equal(got.probs, eager.run(eager.encode_pixels(pixels)).probs)

    forged = _with_metadata(
        vit_onnx, tmp_path / "forged", "uqc.preprocessing", lambda p: p.update(image_size=16)
    )
    deferred = Predictor(forged, open_session=False)  # the metadata alone is consistent
    big = np.random.default_rng(0).uniform(0, 255, size=(1, channels, 16, 16))
    with pytest.raises(ArtifactError) as caught:
        deferred.run(deferred.encode_pixels(big))
    assert "the graph takes 8x8 images" in caught.value.message


def test_a_session_opens_holding_its_weights_once(tmp_path: Path) -> None:
    """ONNX Runtime pre-packs each MatMul weight and frees the initializer it came from;
    under glibc's moving allocation threshold those freed blocks stayed in the heap (a
    graph of 109 MiB of weights shaped as a decoder's: +187 MiB of RSS in a fresh process,
    +118 MiB with `_freed_memory_returned`)."""
    import onnxruntime as ort
    from onnx import numpy_helper

    from uqcompress.export.runtime import _freed_memory_returned

    generator = np.random.default_rng(0)
    weights, nodes, name = [], [], "x"
    for index, (rows, cols) in enumerate([(896, 896), (896, 4864), (4864, 896)] * 3):
        array = generator.standard_normal((rows, cols), dtype=np.float32)
        weights.append(numpy_helper.from_array(array, f"w{index}"))
        nodes.append(helper.make_node("MatMul", [name, f"w{index}"], [f"y{index}"]))
        name = f"y{index}"
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 896])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["b", 896])],
        weights,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    path = tmp_path / "chain.onnx"
    onnx.save(model, str(path))
    size = sum(w.raw_data.__len__() for w in weights)
    del model, graph, weights
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    # a first session's one-time costs (ONNX Runtime's own set-up), paid before measuring
    small = tmp_path / "small.onnx"
    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 896])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 896])],
    ), opset_imports=[helper.make_opsetid("", 18)], ir_version=9), str(small))  # fmt: skip
    ort.InferenceSession(str(small), options, providers=["CPUExecutionProvider"])
    before = status("VmRSS")
    with _freed_memory_returned():
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    held = status("VmRSS") - before
    assert held < 1.2 * size, held / size
    out = session.run(None, {"x": np.ones((1, 896), np.float32)})[0]
    assert out.shape == (1, 896)
