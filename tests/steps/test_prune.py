"""`uqc score | uqc prune` pipelines, the pruned artifact downstream, and prune's bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ok
from uqcompress.artifacts import open_artifact


def _score(cli, model: Path, *args: str) -> str:  # type: ignore[no-untyped-def]
    result = cli("score", str(model), *args)
    assert result.code == 0, result.err
    return result.out.strip()


@pytest.mark.parametrize("method", ["taylor", "hies", "headmap", "greedy-circuit", "random", "l2"])
def test_score_pipe_prune_for_bert_with_every_method(
    cli,
    method: str,
    trained_bert_artifact: Path,
    sentiment_csv: dict[str, Path],  # type: ignore[no-untyped-def]
) -> None:
    extra = ["--ratio", "0.5"] if method in ("headmap", "greedy-circuit") else []
    scores = _score(
        cli,
        trained_bert_artifact,
        "--method",
        method,
        "--data",
        str(sentiment_csv["train"]),
        "--calib-size",
        "16",
        *extra,
    )
    artifact = open_artifact(Path(scores), expect_kind="scores")
    assert artifact.manifest.summary["layers"] == 2 and artifact.manifest.summary["heads"] == 4
    pruned = cli("prune", "-", "--ratio", "0.5", stdin=scores + "\n")
    assert pruned.code == 0, pruned.err
    summary = open_artifact(Path(pruned.out.strip())).manifest.summary
    assert summary["heads_before"] == 8 and summary["heads_after"] == 4
    assert summary["parameters_after"] < summary["parameters_before"]
    assert summary["max_logit_diff_vs_gated"] < 1e-5
    assert cli("eval", pruned.out.strip(), "--data", str(sentiment_csv["test"])).code == 0


def test_vit_pipeline_global_scope_finetune_and_export(cli, tiny_vit_artifact: Path) -> None:  # type: ignore[no-untyped-def]
    scores = _score(
        cli,
        tiny_vit_artifact,
        "--method",
        "hies",
        "--data",
        "builtin:digits@val",
        "--calib-size",
        "16",
    )
    pruned = cli("prune", scores, "--ratio", "0.5", "--scope", "global")
    assert pruned.code == 0, pruned.err
    path = pruned.out.strip()
    summary = open_artifact(Path(path)).manifest.summary
    assert sum(summary["heads_per_layer"]) == 4
    tuned = cli("finetune", path, "--data", "builtin:digits@val", "--epochs", "1")
    assert tuned.code == 0, tuned.err
    assert open_artifact(Path(tuned.out.strip())).manifest.summary["heads"] == 4
    exported = cli("export", tuned.out.strip(), "--format", "onnx", "--json")
    assert exported.code == 0, exported.err
    assert json.loads(exported.out)["summary"]["parity_max_abs_probs"] <= 1e-4
    st = cli("export", path, "--format", "safetensors", "--json")
    assert "uqcompress" in json.loads(st.out)["summary"]["loads_with"]


def test_prune_with_scores_option_and_empty_layers(cli, tiny_vit_artifact: Path) -> None:  # type: ignore[no-untyped-def]
    scores = _score(cli, tiny_vit_artifact, "--method", "l2")
    result = cli(
        "prune",
        str(tiny_vit_artifact),
        "--scores",
        scores,
        "--ratio",
        "0.75",
        "--scope",
        "global",
        "--min-heads-per-layer",
        "0",
        "--json",
    )
    assert result.code == 0, result.err
    payload = json.loads(result.out)
    assert sum(payload["summary"]["heads_per_layer"]) == 2


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--ratio", "1.0"], "outside [0, 1)"),
        (["--ratio", "-0.1"], "outside [0, 1)"),
        (["--ratio", "0.9", "--scope", "global"], "lets at most 6 go"),
        (["--ratio", "0.9"], "lets at most 6 go"),  # the default scope is global
        (["--ratio", "0.9", "--scope", "layer"], "at most 3 heads per layer"),
        (["--ratio", "0.5", "--scope", "diagonal"], "unknown --scope"),
        (["--members", "2", "--mlp-ratio", "0"], "--mlp-ratio 0.0 is outside (0, 1]"),
        (["--members", "2", "--mlp-ratio", "1.5"], "--mlp-ratio 1.5 is outside (0, 1]"),
        (["--ratio", "0.5", "--mlp-ratio", "0.5"], "narrows the MLPs of ensemble members"),
    ],
)
def test_prune_bad_values(cli, tiny_vit_artifact: Path, args: list[str], needle: str) -> None:  # type: ignore[no-untyped-def]
    scores = _score(cli, tiny_vit_artifact, "--method", "random")
    result = cli("prune", scores, *args)
    assert result.code == 1, result.err
    assert needle in result.err and result.out == ""


def test_scores_of_another_model_are_refused(cli, tiny_vit_artifact: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    other = cli("init", "--family", "vit", "--num-labels", "10", "--seed", "9").out.strip()
    scores = _score(cli, Path(other), "--method", "l2")
    result = cli("prune", str(tiny_vit_artifact), "--scores", scores, "--ratio", "0.5")
    assert result.code == 1 and "computed for model" in result.err


def test_score_bad_input(cli, tiny_vit_artifact: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    unknown = cli("score", str(tiny_vit_artifact), "--method", "magic")
    assert unknown.code == 1 and "unknown --method" in unknown.err
    no_data = cli("score", str(tiny_vit_artifact), "--method", "hies")
    assert no_data.code == 1 and "needs --data" in no_data.err
    no_ratio = cli(
        "score", str(tiny_vit_artifact), "--method", "circuit", "--data", "builtin:digits@val"
    )
    assert no_ratio.code == 1 and "--ratio" in no_ratio.err
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = cli("score", str(tiny_vit_artifact), "--method", "taylor", "--data", str(empty))
    assert nothing.code == 1 and "holds no" in nothing.err


def test_circuit_ratio_must_match(cli, tiny_vit_artifact: Path) -> None:  # type: ignore[no-untyped-def]
    scores = _score(
        cli,
        tiny_vit_artifact,
        "--method",
        "circuit",
        "--data",
        "builtin:digits@val",
        "--calib-size",
        "16",
        "--ratio",
        "0.5",
    )
    result = cli("prune", scores, "--ratio", "0.25")
    assert result.code == 1 and "searched for --ratio 0.5" in result.err


def test_hies_explains_attention_without_probabilities(
    cli,
    tiny_vit_artifact: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """With sdpa attention, transformers returns no probabilities: HIES must say so, not crash."""
    from contextlib import nullcontext

    from uqcompress.models import head_gates

    # HIES looks eager_attention up on head_gates when it runs
    monkeypatch.setattr(head_gates, "eager_attention", lambda loaded: nullcontext())
    result = cli(
        "score",
        str(tiny_vit_artifact),
        "--method",
        "hies",
        "--data",
        "builtin:digits@val",
        "--calib-size",
        "8",
    )
    assert result.code == 1, result.err
    assert "returned no attention probabilities" in result.err
    assert result.out == ""


@pytest.mark.parametrize("family", ["vit", "llama"])  # a plain and a gated (SwiGLU) MLP
def test_members_with_an_mlp_ratio_keep_their_own_neurons_and_equal_the_gated_base(
    cli,  # type: ignore[no-untyped-def]
    tiny_vit_artifact: Path,
    tiny_llama_artifact: Path,
    sentiment_csv: dict[str, Path],
    family: str,
) -> None:
    from uqcompress.models.loading import load_model, resolve_model_source
    from uqcompress.models.surgery import KEPT_NEURONS_KEY

    model = tiny_vit_artifact if family == "vit" else tiny_llama_artifact
    data = "builtin:digits@val" if family == "vit" else str(sentiment_csv["train"])
    scores = _score(cli, model, "--method", "l2", "--data", data, "--calib-size", "8")
    members = Path(
        ok(cli("prune", scores, "--members", "2", "--select", "partition", "--mlp-ratio", "0.5"))
    )
    summary = json.loads((members / "manifest.json").read_text())["summary"]
    base = load_model(resolve_model_source(model))
    inner = base.family.sizes(base.config).intermediate
    assert summary["mlp_ratio"] == 0.5 and summary["mlp_width"] == inner // 2
    assert summary["max_logit_diff_vs_gated"] < 1e-5  # each member against the gated base
    kept = [
        getattr(load_model(resolve_model_source(members / f"member{m}")).config, KEPT_NEURONS_KEY)
        for m in range(2)
    ]
    for layer in range(len(kept[0])):  # a half each of 2: every neuron in exactly one member
        assert sorted(kept[0][layer] + kept[1][layer]) == list(range(inner))
