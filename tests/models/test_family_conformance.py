"""Family conformance: every step of uqc, run through the CLI on a tiny model of each family.

A family (a transformer architecture uqc can compress) conforms when a tiny model of it goes
through the whole tool: fine-tune, score heads with every method, prune (evenly, unevenly, and
down to an empty layer), prune members and fuse them into a Hydra model (exact vs its members),
build a Singular Value Ensemble, distil a DIRECTOR student, calibrate, export to ONNX with
parity, quantize an export to float16, and predict on the exports. Every assertion reads what
a user sees: exit codes, the path on stdout, the JSONL of `uqc predict`, the artifacts' files
(manifest.json, parity.json, scores.safetensors), and the ONNX Runtime Predictor's outputs.

Adding a family = one entry in `FAMILIES` (`imported=False`: built by `uqc init` with the
shipped vocabulary; an imported family also needs its tokenizer in tests/checkpoints.py). The
artifacts of one family are built once per module (`Chain`, lazily: a test run alone builds
only what it needs) and shared by its tests.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

METHODS = ("random", "l2", "taylor", "hies", "headmap", "greedy-circuit")
DATA_METHODS = ("taylor", "hies", "headmap", "greedy-circuit")
SEARCHED = ("headmap", "greedy-circuit")  # searched sets of heads, kept as searched by prune
CALIB_SIZE = "8"
CIRCUIT_RATIO = "0.5"
PRUNE_PARITY_ATOL = 1e-5  # pruned vs gated: the same function up to float round-off
FUSE_PARITY_ATOL = 1e-4  # Hydra vs its members run one by one
EXPORT_ATOL = 1e-4  # ONNX vs PyTorch, `uqc export --atol`'s default
OUTPUTS = ("member_logits", "probs", "entropy", "mutual_info")  # every export's, in order


@dataclass(frozen=True)
class Family:
    """How the conformance chain meets one family: a tiny model and data it can learn from."""

    labels: tuple[str, ...]
    # `uqc init` arguments besides --labels and --out (a tiny preset: seconds per step)
    init: tuple[str, ...]
    # `uqc finetune` arguments for the base: trained, so parity compares non-uniform outputs
    finetune: tuple[str, ...]
    # (training data, held-out data) as `--data` values; may ask for session fixtures
    data: Callable[[pytest.FixtureRequest], tuple[str, str]]
    # Start from a checkpoint transformers saved, with a tokenizer of the family's own type
    # (tests/checkpoints.py), imported by `uqc import`, instead of `uqc init`.
    imported: bool = False
    # Heads pruning removes together: grouped-query attention's units (2 in the tiny
    # decoders: 4 query heads over 2 key/value heads), 1 elsewhere.
    unit: int = 1


def _sentiment_csv(request: pytest.FixtureRequest) -> tuple[str, str]:
    files = request.getfixturevalue("sentiment_csv")
    return str(files["train"]), str(files["test"])


def _digits(request: pytest.FixtureRequest) -> tuple[str, str]:
    return "builtin:digits@val", "builtin:digits@test"


def _text(family: str, unit: int = 1, imported: bool = True) -> Family:
    return Family(
        labels=("neg", "pos"),
        init=("--family", family, "--preset", "tiny"),
        finetune=("--epochs", "8", "--lr", "3e-3", "--batch-size", "16"),
        data=_sentiment_csv,
        imported=imported,
        unit=unit,
    )


def _image(family: str) -> Family:
    return Family(
        labels=tuple(str(d) for d in range(10)),
        init=("--family", family, "--preset", "tiny"),
        finetune=("--epochs", "3", "--lr", "3e-3"),
        data=_digits,
    )


FAMILIES: dict[str, Family] = {
    "bert": _text("bert", imported=False),  # `uqc init`, with the shipped WordPiece vocabulary
    **{name: _text(name) for name in ("roberta", "xlm-roberta", "distilbert", "electra")},
    **{name: _text(name, unit=2) for name in ("llama", "qwen2", "qwen3", "mistral")},
    **{name: _image(name) for name in ("vit", "deit", "dinov2")},
}


# --------------------------------------------------------------------------- reading artifacts


def manifest(path: Path) -> dict[str, Any]:
    return dict(json.loads((path / "manifest.json").read_text()))


def summary(path: Path) -> dict[str, Any]:
    return dict(manifest(path)["summary"])


def parity(path: Path) -> dict[str, Any]:
    return dict(json.loads((path / "parity.json").read_text()))


def assert_parity(path: Path, atol: float, temperature: float = 1.0) -> None:
    """The artifact's parity.json says the check passed, every contract output within atol
    (a model calibrated at T < 1: its logit outputs within atol / T, the rest within atol)."""
    report = parity(path)
    assert report["passed"] is True, report
    diffs = report["max_abs_diff"]
    # every contract output; an ONNX export also the `logits` Hugging Face loaders read
    assert set(OUTPUTS) <= set(diffs) <= {*OUTPUTS, "logits"}, diffs
    for output, diff in diffs.items():
        scaled = output in ("member_logits", "logits") and temperature < 1.0
        bound = atol / temperature if scaled else atol
        assert math.isfinite(diff) and 0.0 <= diff <= bound, (output, diff, bound)


def head_scores(path: Path) -> np.ndarray:
    """`[L, H]` (or `[M, L, H]`) head scores of a scores artifact; NaN where a head is absent."""
    return load_file(str(path / "scores.safetensors"))["score"]


# --------------------------------------------------------------------------- the chain


class Chain:
    """One family's artifacts, each built by one `uqc` command on first use and then shared."""

    def __init__(self, name: str, family: Family, data: tuple[str, str], root: Path) -> None:
        self.name, self.family, self.root = name, family, root
        self.train, self.held_out = data
        self.cli: Callable[..., Any] | None = None  # bound per test (the fixture is per test)
        self.built: dict[str, Path] = {}  # --out name -> artifact, each built once

    def uqc(self, *args: object) -> Any:
        assert self.cli is not None
        return self.cli(*[str(a) for a in args])

    def step(self, out: str, *args: object) -> Path:
        """`uqc ARGS --out ROOT/OUT` the first time OUT is asked for: must exit 0 and print
        exactly the path it wrote."""
        if out not in self.built:
            path = self.root / out
            result = self.uqc(*args, "--out", path)
            assert result.code == 0, f"uqc {' '.join(map(str, args))}: {result.err}"
            assert result.out.strip() == str(path), result.out
            assert (path / "manifest.json").is_file()
            self.built[out] = path
        return self.built[out]

    # ---- the base model

    @property
    def init(self) -> Path:
        if self.family.imported:
            from tests.checkpoints import save_family_checkpoint

            checkpoint = self.root / "checkpoint"
            if not checkpoint.exists():
                save_family_checkpoint(self.name, checkpoint, self.family.labels)
            return self.step("init", "import", checkpoint)
        labels = ",".join(self.family.labels)
        return self.step("init", "init", *self.family.init, "--labels", labels)

    @property
    def base(self) -> Path:
        return self.step("base", "finetune", self.init, "--data", self.train, *self.family.finetune)

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, heads per layer) of the tiny base model."""
        info = summary(self.base)
        return int(info["layers"]), int(info["heads"])

    @property
    def half(self) -> int:
        """Heads a layer keeps at --ratio 0.5 (prune removes round(ratio * H))."""
        heads = self.shape[1]
        return heads - round(0.5 * heads)

    # ---- scores and pruning

    def scores(self, method: str, model: str = "base") -> Path:
        source = getattr(self, model)
        extra: list[object] = []
        if method in DATA_METHODS:
            extra += ["--data", self.train, "--calib-size", CALIB_SIZE]
        if method in SEARCHED:
            extra += ["--ratio", CIRCUIT_RATIO]
        return self.step(f"scores-{method}-{model}", "score", source, "--method", method, *extra)

    def pruned(self, method: str) -> Path:
        """Half the heads of every layer removed, ranked by `method`'s scores."""
        return self.step(
            f"pruned-{method}", "prune", self.scores(method), "--ratio", "0.5", "--scope", "layer"
        )

    @property
    def uneven(self) -> Path:
        """Global pruning keeping L * H/2 + one unit of heads: no even split over L layers
        exists."""
        layers, heads = self.shape
        keep = layers * (heads // 2) + self.family.unit
        ratio = (layers * heads - keep) / (layers * heads)
        return self.step(
            "uneven", "prune", self.scores("hies"), "--ratio", ratio, "--scope", "global"
        )

    @property
    def emptied(self) -> Path:
        """Global pruning keeping L - 1 units of heads with no floor: some layer is left with
        none."""
        layers, heads = self.shape
        keep = (layers - 1) * self.family.unit
        ratio = (layers * heads - keep) / (layers * heads)
        args = ("--ratio", ratio, "--scope", "global", "--min-heads-per-layer", "0")
        return self.step("emptied", "prune", self.scores("l2"), *args)

    # ---- ensembles

    @property
    def members(self) -> Path:
        return self.step(
            "members", "prune", self.scores("taylor"), "--members", "2", "--select", "partition"
        )

    @property
    def hydra(self) -> Path:
        return self.step("hydra", "fuse", self.members)

    @property
    def uneven_hydra(self) -> Path:
        """Members with different heads per layer, one of them with an empty layer."""
        return self.step("uneven-hydra", "fuse", self.uneven, self.emptied, self.pruned("l2"))

    @property
    def sve(self) -> Path:
        args = ("--data", self.train, "--members", "2", "--epochs", "1")
        return self.step("sve", "svd-ensemble", self.base, *args)

    @property
    def director(self) -> Path:
        args = ("--data", self.train, "--samples", "2", "--epochs", "1")
        return self.step("director", "distill-director", self.base, *args)

    @property
    def calibrated(self) -> Path:
        args = ("--data", self.held_out, "--abstain-coverage", "0.9")
        return self.step("calibrated", "calibrate", self.uneven_hydra, *args)

    # ---- deployment

    def onnx(self, model: str) -> Path:
        source = getattr(self, model)
        return self.step(f"{model}-onnx", "export", source, "--data", self.held_out)

    def predict(self, model: Path) -> list[dict[str, Any]]:
        result = self.uqc("predict", model, "--data", self.held_out)
        assert result.code == 0, result.err
        return [json.loads(line) for line in result.out.splitlines()]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_chain(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Chain:
    name = request.param
    family = FAMILIES[name]
    return Chain(name, family, family.data(request), tmp_path_factory.mktemp(f"family-{name}"))


@pytest.fixture
def chain(family_chain: Chain, cli: Callable[..., Any]) -> Chain:
    family_chain.cli = cli
    return family_chain


# --------------------------------------------------------------------------- the steps


def test_init_and_finetune_make_a_model_of_the_family(chain: Chain) -> None:
    for path in (chain.init, chain.base):
        assert manifest(path)["kind"] == "model"
        info = summary(path)
        assert info["family"] == chain.name
        assert info["labels"] == list(chain.family.labels)
    layers, heads = chain.shape
    assert layers >= 2 and heads >= 2  # uneven and emptied layers need both
    trained = summary(chain.base)
    assert trained["trained"] is True
    assert all(math.isfinite(loss) for loss in trained["loss_curve"])
    if chain.family.imported:  # the family's own tokenizer came along and stays
        from tests.checkpoints import TOKENIZER_MODEL

        model = json.loads((chain.base / "tokenizer.json").read_text())["model"]["type"]
        expected = {"wordpiece": "WordPiece", "bpe": "BPE", "unigram": "Unigram"}
        assert model == expected[TOKENIZER_MODEL[chain.name]]


@pytest.mark.parametrize("method", METHODS)
def test_score_rates_every_head(chain: Chain, method: str) -> None:
    path = chain.scores(method)
    assert manifest(path)["kind"] == "scores"
    assert summary(path)["method"] == method
    score = head_scores(path)
    assert score.shape == chain.shape
    assert np.isfinite(score).all()
    if method in SEARCHED:  # a searched set of heads, kept as searched by prune
        layers, _ = chain.shape
        kept = summary(path)["kept_heads"]
        assert [len(k) for k in kept] == [chain.half] * layers


@pytest.mark.parametrize("method", METHODS)
def test_prune_removes_half_the_heads_of_every_layer(chain: Chain, method: str) -> None:
    path = chain.pruned(method)
    layers, heads = chain.shape
    assert manifest(path)["kind"] == "model"
    info = summary(path)
    assert info["heads_per_layer"] == [chain.half] * layers
    assert info["heads_before"] == layers * heads and info["heads_after"] == layers * chain.half
    assert info["parameters_after"] < info["parameters_before"]
    assert [len(k) for k in info["kept_heads"]] == info["heads_per_layer"]
    assert_parity(path, PRUNE_PARITY_ATOL)


def test_prune_globally_leaves_uneven_layers(chain: Chain) -> None:
    layers, heads = chain.shape
    info = summary(chain.uneven)
    counts = info["heads_per_layer"]
    assert len(counts) == layers and sum(counts) == layers * (heads // 2) + chain.family.unit
    assert len(set(counts)) > 1 and min(counts) >= 1  # uneven, every layer keeps its floor
    assert [len(k) for k in info["kept_heads"]] == counts
    assert_parity(chain.uneven, PRUNE_PARITY_ATOL)


def test_prune_can_empty_a_layer(chain: Chain) -> None:
    layers, _ = chain.shape
    info = summary(chain.emptied)
    counts = info["heads_per_layer"]
    assert len(counts) == layers and sum(counts) == (layers - 1) * chain.family.unit
    assert 0 in counts
    assert [len(k) for k in info["kept_heads"]] == counts
    assert_parity(chain.emptied, PRUNE_PARITY_ATOL)


@pytest.mark.parametrize("method", METHODS)
def test_a_pruned_model_is_scored_for_the_heads_it_has(chain: Chain, method: str) -> None:
    counts = summary(chain.uneven)["heads_per_layer"]
    score = head_scores(chain.scores(method, model="uneven"))
    assert score.shape == (len(counts), max(counts))
    for layer, count in enumerate(counts):  # NaN exactly where a layer has no head
        assert np.isfinite(score[layer, :count]).all()
        assert np.isnan(score[layer, count:]).all()


def test_members_fuse_into_a_hydra_exact_vs_its_members(chain: Chain) -> None:
    layers, _ = chain.shape
    members = summary(chain.members)
    assert manifest(chain.members)["kind"] == "members"
    assert members["members"] == 2 and members["heads_per_member"] == layers * chain.half
    for first, second in zip(*members["kept_heads"], strict=True):  # partition: no shared head
        assert not set(first) & set(second)
    assert manifest(chain.hydra)["kind"] == "model"
    info = summary(chain.hydra)
    assert info["method"] == "hydra" and info["members"] == 2
    assert info["family"] == chain.name
    assert info["exact"] is True and info["fusion_exactness_max_logit_diff"] < FUSE_PARITY_ATOL
    assert info["kept_heads"] == members["kept_heads"]
    assert_parity(chain.hydra, FUSE_PARITY_ATOL)


def test_uneven_members_with_an_empty_layer_fuse_exactly(chain: Chain) -> None:
    info = summary(chain.uneven_hydra)
    assert info["method"] == "hydra" and info["members"] == 3
    assert info["exact"] is True
    member_counts = [[len(layer) for layer in member] for member in info["kept_heads"]]
    assert member_counts[0] == summary(chain.uneven)["heads_per_layer"]
    assert 0 in member_counts[1]  # the emptied member
    assert info["head_slots_per_layer"] == [max(c) for c in zip(*member_counts, strict=True)]
    assert_parity(chain.uneven_hydra, FUSE_PARITY_ATOL)


def test_svd_ensemble_trains_members_on_shared_factors(chain: Chain) -> None:
    assert manifest(chain.sve)["kind"] == "model"
    info = summary(chain.sve)
    assert info["method"] == "sve" and info["members"] == 2
    assert info["family"] == chain.name
    assert info["sve_targets"] > 0  # the family's linears were found and decomposed
    assert 0 < info["parameters_trainable"] < info["parameters_base"]
    assert len(info["loss_curve"]) == 1 and math.isfinite(info["loss_curve"][0])


def test_distill_director_replaces_every_block(chain: Chain) -> None:
    layers, _ = chain.shape
    assert manifest(chain.director)["kind"] == "model"
    info = summary(chain.director)
    assert info["method"] == "director" and info["members"] == 2 and info["samples"] == 2
    assert info["family"] == chain.name
    assert info["replace_last"] == layers
    assert len(info["distill_loss_per_step"]) == layers
    assert all(math.isfinite(v) for v in info["distill_loss_per_step"])


def test_calibrate_fits_a_temperature_and_an_abstention_rule(chain: Chain) -> None:
    info = summary(chain.calibrated)
    assert info["method"] == "hydra" and info["members"] == 3  # still the fused ensemble
    assert info["temperature"] > 0 and math.isfinite(info["temperature"])
    assert info["nll_after"] <= info["nll_before"] + 1e-6  # T = 1 was a candidate
    assert info["abstain_coverage_target"] == 0.9
    assert 0.9 <= info["abstain_coverage"] <= 1.0  # at least the target (ties are answered)


@pytest.mark.parametrize("model", ["uneven", "calibrated", "sve", "director"])
def test_export_matches_pytorch(chain: Chain, model: str) -> None:
    path = chain.onnx(model)
    assert manifest(path)["kind"] == "onnx"
    members = summary(getattr(chain, model)).get("members", 1)  # a pruned model: one
    assert summary(path)["members"] == members
    report = parity(path)
    assert report["examples"] > 0 and report["argmax_agreement"] == 1.0
    calibration = summary(path).get("calibration") or {}
    assert_parity(path, EXPORT_ATOL, float(calibration.get("temperature", 1.0)))


def test_fp16_quantize_loads_and_keeps_the_outputs(chain: Chain) -> None:
    """`uqc quantize --mode fp16` on the family's export: the graph loads (a decoder's int64
    last-token indices cross from the float16 body to the float32 tail; declared float, it
    did not), its weights are float16, its outputs float32 and within 1e-2 of the fp32 ones."""
    import onnx

    from uqcompress.export import contract
    from uqcompress.export.runtime import Predictor

    fp32 = chain.onnx("uneven")
    fp16 = chain.step("uneven-fp16", "quantize", fp32, "--mode", "fp16", "--data", chain.held_out)
    halves = onnx.load(str(fp16 / contract.ONNX_FILE)).graph.initializer
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in halves)
    want, got = _probe(Predictor(fp32)), _probe(Predictor(fp16))
    for key in OUTPUTS:
        assert got[key].dtype == np.float32 and got[key].shape == want[key].shape
    assert np.abs(got["probs"] - want["probs"]).max() < 1e-2


def _probe(predictor: Any) -> dict[str, np.ndarray]:
    """The contract outputs of a few examples: padded texts, or random 0..255 images."""
    if predictor.input_kind == "text":
        texts = ["good great fun", "the movie was really very bad and boring", "dull"]
        got = predictor.predict_texts(texts)
    else:
        p = predictor.preprocessing
        shape = (3, int(p["num_channels"]), int(p["image_size"]), int(p["image_size"]))
        pixels = np.random.default_rng(3).uniform(0, 255, size=shape)
        got = predictor.predict_pixels(pixels.astype(np.float32))
    return {
        name: getattr(got, name) for name in ("member_logits", "probs", "entropy", "mutual_info")
    }


@pytest.mark.parametrize("model", ["calibrated", "sve", "director"])
def test_predict_on_the_export(chain: Chain, model: str) -> None:
    labels = list(chain.family.labels)
    records = chain.predict(chain.onnx(model))
    assert len(records) > 0 and [r["index"] for r in records] == list(range(len(records)))
    for record in records:
        probs = record["probs"]
        assert list(probs) == labels  # every class, in the model's label order
        assert math.isclose(sum(probs.values()), 1.0, abs_tol=1e-5)
        assert all(0.0 <= p <= 1.0 for p in probs.values())
        assert record["label"] == max(labels, key=lambda name: probs[name])
        assert 0.0 <= record["entropy"] <= math.log(len(labels)) + 1e-5
        assert record["mutual_info"] >= -1e-6
        if model == "calibrated":  # calibrated with an abstention rule
            assert isinstance(record["abstain"], bool)
        else:
            assert "abstain" not in record
    if model == "calibrated":
        # the torch model and its export say the same thing
        torch_records = chain.predict(chain.calibrated)
        assert len(torch_records) == len(records)
        for a, b in zip(records, torch_records, strict=True):
            assert a["label"] == b["label"]
            for label in labels:
                assert a["probs"][label] == pytest.approx(b["probs"][label], abs=EXPORT_ATOL)
        # every flag follows the calibrated rule (abstain when 1 - max prob > threshold), except
        # where the score is within round-off of the threshold (ONNX and torch may differ there)
        info = summary(chain.calibrated)
        assert info["abstain_score"] == "msp"
        threshold = info["abstain_threshold"]
        for run in (records, torch_records):
            for record in run:
                score = 1.0 - max(record["probs"].values())
                if abs(score - threshold) > EXPORT_ATOL:
                    assert record["abstain"] == (score > threshold), (record, threshold)
        # held-out data = the calibration data: torch answers the fraction calibrate reported
        answered = sum(not r["abstain"] for r in torch_records) / len(torch_records)
        assert answered == pytest.approx(info["abstain_coverage"], abs=1e-9)
