"""`uqc svd-ensemble` end to end: train, evaluate as an ensemble, export both forms, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import ok
from uqcompress.artifacts import open_artifact
from uqcompress.export import contract


@pytest.fixture(scope="module")
def vit_sve(tmp_path_factory: pytest.TempPathFactory, briefly_trained_vit: Path) -> Path:
    from uqcompress.steps import sve

    root = tmp_path_factory.mktemp("sve")
    return sve.run(
        briefly_trained_vit,
        sve.SVEConfig(data="builtin:digits@val", val="builtin:digits@val", members=3, epochs=1),
        root / "sve",
    ).artifact.path


def test_svd_ensemble_summary_reports_costs_and_curves(vit_sve: Path) -> None:
    summary = open_artifact(vit_sve, expect_kind="model").manifest.summary
    assert summary["members"] == 3 and summary["method"] == "sve"
    assert summary["sve_targets"] == 12 and summary["sve_rank"] == "full"
    assert 0 < summary["parameter_overhead"] < 1
    assert summary["parameters_extra"] == 2 * summary["parameters_trainable"] // 3
    assert summary["stored_ratio_to_base"] > 1  # full-rank U and V outweigh the dense weights
    assert len(summary["loss_curve"]) == 1 and len(summary["val_acc_curve"]) == 1


def test_svd_ensemble_evaluates_and_exports_in_both_forms(cli, vit_sve: Path) -> None:  # type: ignore[no-untyped-def]
    metrics = json.loads(ok(cli("eval", str(vit_sve), "--data", "builtin:digits@test", "--json")))
    assert metrics["summary"]["members"] == 3 and "disagreement" in metrics["summary"]
    sizes = {}
    for flags in ((), ("--materialize",)):
        exported = Path(ok(cli("export", str(vit_sve), "--data", "builtin:digits@test", *flags)))
        summary = open_artifact(exported, expect_kind="onnx").manifest.summary
        assert summary["members"] == 3
        assert summary["sve_form"] == ("materialized" if flags else "factorised")
        parity = json.loads((exported / "parity.json").read_text())
        assert parity["passed"]
        model = onnx.load(str(exported / contract.ONNX_FILE))
        meta = {p.key: p.value for p in model.metadata_props}
        assert meta[contract.META_MEMBERS] == "3"
        sizes[summary["sve_form"]] = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
    assert sizes["factorised"] < sizes["materialized"]  # M dense copies vs U, V once


def _refused(result, *words: str) -> None:  # type: ignore[no-untyped-def]
    assert result.code == 1, result.err
    assert result.out == ""
    line = result.err.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    for word in words:
        assert word in line


def test_svd_ensemble_bad_inputs(
    cli, tiny_vit_artifact: Path, tmp_path: Path, vit_sve: Path
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "sve"
    base = [
        "svd-ensemble",
        str(tiny_vit_artifact),
        "--data",
        "builtin:digits@val",
        "--out",
        str(out),
    ]
    _refused(cli(*base, "--members", "0"), "--members 0")
    _refused(cli(*base, "--sigma-init", "-0.1"), "--sigma-init")
    _refused(cli(*base, "--targets", "nothing_here"), "matches no linear layer", "q_proj")
    _refused(cli(*base, "--rank", "999"), "--rank 999", "larger than")
    _refused(cli(*base, "--rank", "half"), "--rank")
    _refused(
        cli("svd-ensemble", str(vit_sve), "--data", "builtin:digits@val", "--out", str(out)),
        "Singular Value Ensemble",
    )
    _refused(
        cli("export", str(tiny_vit_artifact), "--materialize", "--out", str(out)), "Singular Value"
    )
    assert not out.exists()


def test_extra_biases_option_and_the_paper_default(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, sentiment_csv: dict[str, Path]
) -> None:
    """issue 26 item 9: by default no per-member bias on a decoder's bias-free projections;
    --extra-biases adds them, counted apart from the paper's overhead; both reload."""
    from uqcompress.artifacts import open_artifact
    from uqcompress.models.loading import load_model, resolve_model_source
    from uqcompress.models.sve_model import SVDLinear

    base = ok(cli("init", "--family", "llama", "--labels", "neg,pos", "--out", str(tmp_path / "b")))
    summaries, counts = [], []
    for flags in ([], ["--extra-biases"]):
        out = tmp_path / ("sve" + "".join(flags))
        args = ["svd-ensemble", base, "--data", str(sentiment_csv["train"]), "--members", "2"]
        path = ok(cli(*args, "--epochs", "1", "--out", str(out), *flags))
        summaries.append(open_artifact(Path(path)).manifest.summary)
        loaded = load_model(resolve_model_source(Path(path)))
        layers = [m for m in loaded.model.modules() if isinstance(m, SVDLinear)]
        counts.append(sum(m.bias is not None for m in layers))
    paper, extra = summaries
    assert counts[0] == 0 and counts[1] > 0
    assert paper["parameters_added_biases"] == 0 < extra["parameters_added_biases"]
    assert paper["parameters_extra"] == extra["parameters_extra"]
    assert paper["parameter_overhead"] == extra["parameter_overhead"]
    assert extra["parameter_overhead_with_added_biases"] > extra["parameter_overhead"]


def test_bfloat16_base_trains_float32_singular_values(
    tmp_path: Path, sentiment_csv: dict[str, Path], tiny_llama_artifact: Path
) -> None:
    """--dtype bfloat16: U, V and the frozen base in bfloat16 (half the memory), the
    singular values and biases trained in float32; what it learns stays close to the same
    run in float32."""
    import torch
    from safetensors import safe_open

    from uqcompress.steps import sve

    base = tiny_llama_artifact
    runs = {}
    for dtype in ("float32", "bfloat16"):
        cfg = sve.SVEConfig(data=str(sentiment_csv["train"]), members=2, epochs=1, dtype=dtype)
        runs[dtype] = sve.run(base, cfg, tmp_path / dtype).artifact
    half = runs["bfloat16"]
    assert half.manifest.summary["dtype"] == "bfloat16"
    assert half.manifest.config["dtype"] == "bfloat16"
    with safe_open(str(half.path / "model.safetensors"), "pt") as f:
        names = list(f.keys())  # safe_open is not iterable
        kinds = {key.rsplit(".", 1)[-1]: f.get_slice(key).get_dtype() for key in names}
        sigma = f.get_tensor(next(k for k in names if k.endswith("singular_values")))
    assert kinds["singular_values"] == "F32" and kinds["u"] == "BF16" and kinds["v"] == "BF16"
    with safe_open(str(runs["float32"].path / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        reference = f.get_tensor(next(k for k in names if k.endswith("singular_values")))
    assert torch.allclose(sigma, reference, rtol=0.05, atol=1e-3)
    losses = [runs[d].manifest.summary["loss_curve"][0] for d in ("float32", "bfloat16")]
    assert abs(losses[0] - losses[1]) < 0.05


def test_the_default_lr_and_epochs_follow_the_heads_and_keep_the_post_hoc_id(  # type: ignore[no-untyped-def]
    cli, briefly_trained_vit: Path, sentiment_csv, tmp_path: Path
) -> None:
    """--lr and --epochs left out: 1e-3 and 3 when the members copy a trained head (the id is
    the one an explicit --lr 1e-3 --epochs 3 gives, as when those were every SVE's defaults),
    1e-2 and 6 when they get fresh heads: --heads fresh, or auto on a model whose head was
    never trained (an imported checkpoint without a classifier, or such a transformers folder
    itself); an explicit value wins."""
    from uqcompress.models.factory import create_model
    from uqcompress.steps.sve import FINETUNE_EPOCHS, FINETUNE_LR, POST_HOC_EPOCHS, POST_HOC_LR

    def defaults(plan: dict) -> tuple[float, int]:  # type: ignore[type-arg]
        return plan["config"]["lr"], plan["config"]["epochs"]

    def planned(model: object, data: str, *extra: str) -> dict:  # type: ignore[type-arg]
        result = cli("svd-ensemble", model, "--data", data, *extra, "--dry-run", "--json")
        assert result.code == 0, result.err
        return dict(json.loads(result.out))

    digits = "builtin:digits@val"
    post_hoc = planned(briefly_trained_vit, digits)
    assert defaults(post_hoc) == (POST_HOC_LR, POST_HOC_EPOCHS) == (1e-3, 3)
    explicit = planned(briefly_trained_vit, digits, "--lr", "1e-3", "--epochs", "3")
    assert explicit["id"] == post_hoc["id"]
    fresh = planned(briefly_trained_vit, digits, "--heads", "fresh")
    assert defaults(fresh) == (FINETUNE_LR, FINETUNE_EPOCHS) == (1e-2, 6)
    chosen = planned(briefly_trained_vit, digits, "--heads", "fresh", "--lr", "5e-3")
    assert defaults(chosen) == (5e-3, FINETUNE_EPOCHS)
    chosen = planned(briefly_trained_vit, digits, "--heads", "fresh", "--epochs", "2")
    assert defaults(chosen) == (FINETUNE_LR, 2)

    loaded = create_model("bert", ["neg", "pos"], seed=3)
    assert loaded.tokenizer is not None
    headless, classifier = tmp_path / "headless", tmp_path / "classifier"
    loaded.model.bert.save_pretrained(headless)  # a BertModel: no classifier weights
    loaded.tokenizer.save_pretrained(headless)
    loaded.model.save_pretrained(classifier)  # a BertForSequenceClassification
    loaded.tokenizer.save_pretrained(classifier)
    text = str(sentiment_csv["train"])
    imported = ok(cli("import", headless, "--out", tmp_path / "imported"))
    assert defaults(planned(imported, text)) == (FINETUNE_LR, FINETUNE_EPOCHS)
    assert defaults(planned(headless, text)) == (FINETUNE_LR, FINETUNE_EPOCHS)
    assert defaults(planned(classifier, text)) == (POST_HOC_LR, POST_HOC_EPOCHS)


def test_a_config_that_misnames_its_head_is_said_when_the_defaults_followed_it(  # type: ignore[no-untyped-def]
    cli, sentiment_csv, tmp_path: Path
) -> None:
    """The defaults are decided before loading, from config.json; a folder whose config
    names a classifier it does not hold gets fresh heads (the weights decide) and a warning
    that --lr/--epochs were the copied-head defaults."""
    from uqcompress.models.factory import create_model
    from uqcompress.steps.sve import POST_HOC_EPOCHS, POST_HOC_LR

    loaded = create_model("bert", ["neg", "pos"], seed=3)
    assert loaded.tokenizer is not None
    folder = tmp_path / "misnamed"
    loaded.model.bert.save_pretrained(folder)  # no classifier weights ...
    loaded.tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["BertForSequenceClassification"]  # ... but says it has one
    (folder / "config.json").write_text(json.dumps(config))
    result = cli("svd-ensemble", folder, "--data", sentiment_csv["train"], "--members", "2")
    path = ok(result)
    manifest = open_artifact(Path(path)).manifest
    assert manifest.summary["heads"] == "fresh"
    assert (manifest.config["lr"], manifest.config["epochs"]) == (POST_HOC_LR, POST_HOC_EPOCHS)
    assert "are the defaults for copied heads" in result.err and "got fresh heads" in result.err
