"""`uqc distill-director` end to end: distil, evaluate S samples, export with a noise input."""

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
def vit_student(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from uqcompress.steps import director, finetune, init

    root = tmp_path_factory.mktemp("director")
    base = init.run(
        init.InitConfig(family="vit", labels=[str(d) for d in range(10)]), root / "init"
    )
    teacher = finetune.run(
        base.artifact.path,
        finetune.FinetuneConfig(data="builtin:digits@val", epochs=3, lr=3e-3),
        root / "teacher",
    )
    return director.run(
        teacher.artifact.path,
        director.DirectorConfig(
            data="builtin:digits@val", val="builtin:digits@val", samples=3, epochs=4, lr=3e-3
        ),
        root / "student",
    ).artifact.path


def test_distillation_lowers_its_loss_and_reports_sizes(vit_student: Path) -> None:
    manifest = open_artifact(vit_student, expect_kind="model").manifest
    summary = manifest.summary
    assert summary["method"] == "director" and summary["members"] == 3
    curve = summary["distill_loss_curve"]
    assert len(curve) == 4 and curve[-1] < curve[0]  # numbers from this run, not constants
    assert len(summary["distill_loss_per_step"]) == 2  # one per replaced layer
    assert summary["parameters_teacher"] > 0 and summary["parameters_ratio_to_teacher"] > 0
    assert 0 <= summary["val_acc"] <= 1 and 0 <= summary["val_ece"] <= 1
    assert any("deterministic" in w for w in manifest.warnings)  # --loss kl on a plain ViT


def test_student_evaluates_as_samples_and_exports_with_a_noise_input(
    cli, vit_student: Path
) -> None:  # type: ignore[no-untyped-def]
    from uqcompress.export.runtime import Predictor

    metrics = json.loads(
        ok(cli("eval", str(vit_student), "--data", "builtin:digits@test", "--json"))
    )
    assert metrics["summary"]["members"] == 3 and "disagreement" in metrics["summary"]
    again = json.loads(
        ok(
            cli(
                "eval",
                str(vit_student),
                "--data",
                "builtin:digits@test",
                "--json",
                "--force",
                "--out",
                str(vit_student.parent / "eval-again"),
            )
        )
    )
    assert again["summary"]["nll"] == metrics["summary"]["nll"]  # seeded: reproducible
    more = cli(
        "eval", str(vit_student), "--data", "builtin:digits@test", "--samples", "5", "--json"
    )
    assert json.loads(ok(more))["summary"]["members"] == 5
    exported = Path(ok(cli("export", str(vit_student), "--data", "builtin:digits@test")))
    parity = json.loads((exported / "parity.json").read_text())
    assert parity["passed"]
    model = onnx.load(str(exported / contract.ONNX_FILE))
    assert [i.name for i in model.graph.input] == ["pixel_values", contract.NOISE_INPUT]
    predictor = Predictor(exported)
    images = np.random.default_rng(0).uniform(0, 255, size=(4, 1, 8, 8)).astype(np.float32)
    first, second = predictor.predict_pixels(images), predictor.predict_pixels(images)
    assert first.member_logits.shape == (4, 3, 10)
    assert np.array_equal(first.probs, second.probs)  # noise from a seeded NumPy generator
    inputs = predictor.encode_pixels(images)
    other = predictor.run({**inputs, contract.NOISE_INPUT: predictor.draw_noise(inputs, seed=5)})
    assert not np.allclose(other.member_logits, first.member_logits)


def _refused(result, *words: str) -> None:  # type: ignore[no-untyped-def]
    assert result.code == 1, result.err
    assert result.out == ""
    line = result.err.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    for word in words:
        assert word in line


def test_distill_director_bad_inputs(cli, tiny_vit_artifact: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "student"
    base = ["distill-director", str(tiny_vit_artifact), "--data", "builtin:digits@val"]
    _refused(cli(*base, "--samples", "0", "--out", str(out)), "--samples 0")
    _refused(cli(*base, "--replace-last", "5", "--out", str(out)), "--replace-last 5", "1..2")
    _refused(cli(*base, "--loss", "l1", "--out", str(out)), "--loss 'l1'")
    evaluate = ["eval", str(tiny_vit_artifact), "--data", "builtin:digits@val"]
    _refused(cli(*evaluate, "--samples", "3", "--out", str(out)), "DIRECTOR students")
    assert not out.exists()


def test_bert_student_replacing_the_last_block_exports_with_parity(  # type: ignore[no-untyped-def]
    cli, trained_bert_artifact: Path, sentiment_csv
) -> None:
    args = ["distill-director", str(trained_bert_artifact), "--data", str(sentiment_csv["train"])]
    student = ok(cli(*args, "--replace-last", "1", "--samples", "2", "--epochs", "1"))
    summary = open_artifact(Path(student), expect_kind="model").manifest.summary
    assert summary["replace_last"] == 1 and len(summary["distill_loss_per_step"]) == 1
    exported = Path(ok(cli("export", student)))
    parity = json.loads((exported / "parity.json").read_text())
    assert parity["passed"] and parity["padded_batches"] > 0  # noise follows the padded length


def test_a_teacher_of_an_unsupported_family_is_refused(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from transformers import GPT2Config, GPT2ForSequenceClassification

    teacher = tmp_path / "gpt2"
    config = GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=50, num_labels=2)
    GPT2ForSequenceClassification(config).save_pretrained(str(teacher))
    out = tmp_path / "student"
    result = cli(
        "distill-director", str(teacher), "--data", "builtin:digits@val", "--out", str(out)
    )
    from uqcompress.models.families import FAMILIES

    _refused(result, "'gpt2' model", ", ".join(FAMILIES))
    assert not out.exists()


def test_a_student_is_not_fine_tuned_without_its_teacher(
    cli, vit_student: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "tuned"
    result = cli("finetune", str(vit_student), "--data", "builtin:digits@val", "--out", str(out))
    _refused(result, "DIRECTOR student", "distill-director")
    assert not out.exists()


def test_a_bfloat16_teacher_distils_a_float32_transition(
    tmp_path: Path, sentiment_csv: dict[str, Path], tiny_llama_artifact: Path
) -> None:
    """--dtype bfloat16: the frozen teacher and its copies in bfloat16 (half the memory),
    the transition and the training head in float32; the losses follow the float32 run's."""
    from safetensors import safe_open

    from uqcompress.steps import director

    base = tiny_llama_artifact
    runs = {}
    for dtype in ("float32", "bfloat16"):
        cfg = director.DirectorConfig(
            data=str(sentiment_csv["train"]), epochs=2, batch_size=8, samples=2, dtype=dtype
        )
        runs[dtype] = director.run(base, cfg, tmp_path / dtype).artifact
    half = runs["bfloat16"].manifest.summary
    assert half["dtype"] == "bfloat16"
    full = runs["float32"].manifest.summary["loss_curve"]
    assert half["loss_curve"] == pytest.approx(full, rel=0.02)
    with safe_open(str(runs["bfloat16"].path / "model.safetensors"), "pt") as f:
        names = list(f.keys())  # safe_open is not iterable
        kinds = {k: f.get_slice(k).get_dtype() for k in names}
    assert {v for k, v in kinds.items() if k.startswith("transition.")} == {"F32"}
    assert {v for k, v in kinds.items() if k.startswith("embeddings.")} == {"BF16"}
