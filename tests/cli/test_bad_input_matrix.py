"""One test per row of docs/bad-input.md's table: exit 1, one line, nothing written."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from uqcompress.models.factory import create_model
from uqcompress.models.loading import save_model

Case = Callable[[Path, dict[str, Path]], list[str]]


def _copy(tmp: Path, source: Path, name: str) -> Path:
    target = tmp / name
    shutil.copytree(source, target)
    return target


def _edit_manifest(path: Path, edit: Callable[[dict], None]) -> Path:  # type: ignore[type-arg]
    raw = json.loads((path / "manifest.json").read_text())
    edit(raw)
    (path / "manifest.json").write_text(json.dumps(raw))
    return path


def _checkpoint(tmp: Path, name: str) -> Path:
    path = tmp / name
    save_model(create_model("bert", ["neg", "pos"]), path)
    return path


def _tampered(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = _copy(tmp, f["bert"], "tampered")
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    return ["verify", str(path)]


def _truncated(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = _copy(tmp, f["bert"], "truncated")
    (path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes()[:100])
    return ["eval", str(path), "--data", str(f["test"])]


def _unlisted(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = _copy(tmp, f["bert"], "unlisted")
    (path / "extra.json").write_text("{}")
    return ["verify", str(path)]


def _escaping(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = _copy(tmp, f["bert"], "escaping")
    _edit_manifest(path, lambda m: m["files"].update({"../x": {"sha256": "0" * 64, "bytes": 1}}))
    return ["verify", str(path)]


def _newer(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = _copy(tmp, f["bert"], "newer")
    _edit_manifest(path, lambda m: m.update(kind_version=99))
    return ["eval", str(path), "--data", str(f["test"])]


def _no_weights(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = _checkpoint(tmp, "noweights")
    (path / "model.safetensors").unlink()
    return ["import", str(path)]


def _no_tokenizer(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = tmp / "notok"
    create_model("bert", ["neg", "pos"]).model.save_pretrained(path)
    return ["import", str(path)]


def _damaged_weights(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = _checkpoint(tmp, "damaged")
    (path / "model.safetensors").write_bytes(b"garbage")
    return ["import", str(path)]


def _own_code(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = _checkpoint(tmp, "owncode")
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_x.X"}
    (path / "config.json").write_text(json.dumps(config))
    return ["import", str(path)]


def _unsupported_architecture(tmp: Path, f: dict[str, Path]) -> list[str]:
    from transformers import GPT2Config, GPT2ForSequenceClassification

    path = tmp / "gpt2"
    config = GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, num_labels=2)
    GPT2ForSequenceClassification(config).save_pretrained(str(path))
    return ["import", str(path)]


def _deit_with_teacher(tmp: Path, f: dict[str, Path]) -> list[str]:
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher

    path = tmp / "deit-distilled"
    config = DeiTConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        image_size=8,
        patch_size=2,
        num_channels=1,
        num_labels=2,
    )
    DeiTForImageClassificationWithTeacher(config).save_pretrained(str(path))
    return ["import", str(path)]


def _gqa_ratio(tmp: Path, f: dict[str, Path]) -> list[str]:
    from uqcompress.steps import init, score

    base = init.run(init.InitConfig(family="llama", labels=["a", "b"]), tmp / "llama")
    scores = score.run(base.artifact.path, score.ScoreConfig(method="l2"), tmp / "llama-l2")
    return ["prune", str(scores.artifact.path), "--ratio", "0.25", "--scope", "layer"]


def _quantized(tmp: Path, f: dict[str, Path]) -> list[str]:
    from uqcompress.steps import quantize

    done = quantize.run(
        f["vit_onnx"], quantize.QuantizeConfig(data="builtin:digits@test"), tmp / "int8"
    )
    return ["quantize", str(done.artifact.path), "--data", "builtin:digits@test"]


def _csv(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


def _images(tmp: Path, f: dict[str, Path], sizes: tuple[int, int] | None) -> list[str]:
    from PIL import Image

    folder = tmp / "imgs" / "3"
    folder.mkdir(parents=True)
    if sizes is None:
        (folder / "x.png").write_bytes(b"\x89PNG broken")
    else:
        for i, side in enumerate(sizes):
            Image.new("L", (side, side)).save(folder / f"{i}.png")
    return ["eval", str(f["vit"]), "--data", str(tmp / "imgs")]


def _corrupt_among_many(tmp: Path, f: dict[str, Path]) -> list[str]:
    """1,000 JPEGs of mixed sizes, one cut short; found before any batch is built."""
    from PIL import Image

    for i in range(1000):
        folder = tmp / "imgs" / str(i % 2)
        folder.mkdir(parents=True, exist_ok=True)
        side = 8 + i % 5
        Image.new("L", (side, side + 1), color=i % 256).save(folder / f"{i:04d}.jpg")
    bad = tmp / "imgs" / "1" / "0457.jpg"
    bad.write_bytes(bad.read_bytes()[:20])
    return ["finetune", str(f["vit"]), "--data", str(tmp / "imgs"), "--epochs", "1"]


def _bomb(tmp: Path, f: dict[str, Path]) -> list[str]:
    from PIL import Image

    folder = tmp / "imgs" / "3"
    folder.mkdir(parents=True)
    Image.new("1", (15000, 15000)).save(folder / "big.png")  # 27 KB on disk, ~1 s to write
    return ["eval", str(f["vit"]), "--data", str(tmp / "imgs")]


def _bad_saved(tmp: Path, f: dict[str, Path]) -> list[str]:
    """A save_to_disk folder whose state.json is damaged."""
    folder = tmp / "saved"
    folder.mkdir()
    (folder / "state.json").write_text("{not json")
    (folder / "dataset_info.json").write_text("{}")
    return ["eval", str(f["bert"]), "--data", str(folder)]


def _saved_dict(tmp: Path, f: dict[str, Path]) -> list[str]:
    folder = tmp / "splits"
    for split in ("test", "train"):
        (folder / split).mkdir(parents=True)
        (folder / split / "state.json").write_text("{}")
    (folder / "dataset_dict.json").write_text('{"splits": ["test", "train"]}')
    return ["eval", str(f["bert"]), "--data", str(folder)]


def _pair_model(tmp: Path) -> Path:
    """A model whose training recorded text pairs (uqc finetune --text-pair-column)."""
    loaded = create_model("bert", ["neg", "pos"])
    loaded.model.config.uqc_text_input = {"pair": True, "columns": ["premise", "hypothesis"]}
    save_model(loaded, tmp / "pairmodel")
    return tmp / "pairmodel"


def _occupied_out(tmp: Path, f: dict[str, Path]) -> list[str]:
    return [
        "init",
        "--family",
        "bert",
        "--labels",
        "a,b",
        "--seed",
        "7",
        "--out",
        str(_copy(tmp, f["bert"], "occupied")),
    ]


def _force_on_files(tmp: Path, f: dict[str, Path]) -> list[str]:
    (tmp / "precious").mkdir()
    (tmp / "precious" / "thesis.txt").write_text("years")
    return [
        "init",
        "--family",
        "bert",
        "--labels",
        "a,b",
        "--out",
        str(tmp / "precious"),
        "--force",
    ]


def _foreign_site(tmp: Path, f: dict[str, Path]) -> list[str]:
    site = tmp / "site"
    (site / "src").mkdir(parents=True)
    (site / "manifest.json").write_text('{"name": "app"}')
    (site / "index.html").write_text("x")
    return ["init", "--family", "bert", "--labels", "a,b", "--out", str(site), "--force"]


def _artifact_with_own_files(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = _copy(tmp, f["bert"], "withnotes")
    (path / "notes.txt").write_text("mine")
    return ["init", "--family", "bert", "--labels", "a,b", "--out", str(path), "--force"]


def _deep_manifest(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = _copy(tmp, f["bert"], "deep")
    text = (path / "manifest.json").read_text()
    deep = "[" * 100_000 + "]" * 100_000
    (path / "manifest.json").write_text(
        text.replace('"config": {', f'"config": {{"d": {deep}, ', 1)
    )
    return ["verify", str(path)]


def _symlinked(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = _copy(tmp, f["bert"], "symlinked")
    (path / "config.json").rename(tmp / "config.json")
    (path / "config.json").symlink_to(tmp / "config.json")
    return ["verify", str(path)]


def _onnx_edited(tmp: Path, f: dict[str, Path], edit: Callable[[Any], None]) -> Path:
    """A copy of the ONNX export with its graph edited and the manifest re-hashed (forged)."""
    import hashlib

    import onnx

    path = _copy(tmp, f["vit_onnx"], "forged")
    model = onnx.load(str(path / "model.onnx"))
    edit(model)
    onnx.save(model, str(path / "model.onnx"))
    data = (path / "model.onnx").read_bytes()
    _edit_manifest(
        path,
        lambda m: m["files"].update(
            {"model.onnx": {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}
        ),
    )
    return path


def _drop_labels(model: Any) -> None:
    kept = [p for p in model.metadata_props if p.key != "uqc.labels"]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)


def _external_outside(model: Any) -> None:
    tensor = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    tensor.ClearField("raw_data")
    tensor.data_location = 1  # onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="../outside.data")


def _pruned(root: Path, family: str, seed: int) -> Path:
    """A pruned tiny model (built once per session under `root`)."""
    from uqcompress.steps import init, prune, score

    labels = ["neg", "pos"]
    base = init.run(
        init.InitConfig(family=family, labels=labels, seed=seed), root / f"{family}{seed}"
    )
    scores = score.run(
        base.artifact.path, score.ScoreConfig(method="l2"), root / f"{family}{seed}-scores"
    )
    return prune.run(
        scores.artifact.path, prune.PruneConfig(ratio=0.5), out=root / f"{family}{seed}-pruned"
    ).artifact.path


def _circuit_scores(tmp: Path, f: dict[str, Path], members: int) -> Path:
    from uqcompress.steps import score

    cfg = score.ScoreConfig(
        method="greedy-circuit",
        data="builtin:digits@val",
        calib_size=8,
        ratio=0.5,
        members=members,
    )
    return score.run(f["vit"], cfg, tmp / f"circuit{members}").artifact.path


def _uneven_members(tmp: Path, f: dict[str, Path]) -> list[str]:
    from uqcompress.steps import prune, score

    first = score.run(f["vit"], score.ScoreConfig(method="l2"), tmp / "l2").artifact.path
    uneven = prune.run(
        first, prune.PruneConfig(ratio=0.5, scope="global"), out=tmp / "uneven"
    ).artifact.path
    scores = score.run(uneven, score.ScoreConfig(method="random"), tmp / "rnd").artifact.path
    return ["prune", str(scores), "--members", "2"]


def _fuse_families(tmp: Path, f: dict[str, Path]) -> list[str]:
    return ["fuse", str(_pruned(f["root"], "bert", 0)), str(_pruned(f["root"], "vit", 0))]


def _fuse_bases(tmp: Path, f: dict[str, Path]) -> list[str]:
    return ["fuse", str(_pruned(f["root"], "bert", 0)), str(_pruned(f["root"], "bert", 1))]


def _roberta(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = tmp / "roberta"
    save_model(create_model("roberta", ["neg", "pos"]), path)
    return ["mc-dropout", str(path)]


def _other_labels_csv(tmp: Path) -> Path:
    from tests.conftest import write_csv

    return write_csv(tmp / "other.csv", [("good film", "meh"), ("bad film", "ok")] * 4)


def _sve(f: dict[str, Path], *extra: str) -> list[str]:
    return ["svd-ensemble", str(f["bert"]), "--data", str(f["train"]), *extra]


def _i26lead_resealed_input(tmp: Path, f: dict[str, Path]) -> list[str]:
    from uqcompress.steps import eval as eval_step

    model = _copy(tmp, f["bert"], "model")
    evaluation = eval_step.run(
        [model], eval_step.EvalConfig(data=str(f["test"])), tmp / "evaluation"
    ).artifact.path
    _edit_manifest(model, lambda m: m.update(created_utc="2000-01-01T00:00:00+00:00"))
    return ["verify", str(evaluation)]


def _i26nan_model(tmp: Path) -> str:
    """A transformers dir whose classifier holds one NaN weight (every output NaN)."""
    import math

    import torch

    loaded = create_model("bert", ["neg", "pos"])
    with torch.no_grad():
        dict(loaded.model.named_parameters())["classifier.weight"].view(-1)[0] = math.nan
    save_model(loaded, tmp / "nan-model")
    return str(tmp / "nan-model")


def _i26nan_resume(corruption: str) -> Case:
    """`finetune --resume` with a copy of a real checkpoint corrupted as
    tests/resume_checkpoints.py's CORRUPTIONS[corruption] says."""
    from tests.resume_checkpoints import CORRUPTIONS, corrupted

    return lambda t, f: corrupted(f["bert"], f["train"], t, CORRUPTIONS[corruption][0])


def _i26data_saved(tmp: Path, edit: Callable[[Path, dict[str, Any]], None]) -> Path:
    """A save_to_disk folder (sentences, labels) whose state.json `edit` changes."""
    import datasets

    datasets.disable_progress_bars()
    rows = [{"text": "good film", "label": "pos"}, {"text": "bad film", "label": "neg"}]
    path = tmp / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    state = json.loads((path / "state.json").read_text())
    edit(path, state)
    (path / "state.json").write_text(json.dumps(state))
    return path


def _i26data_escaping_state(tmp: Path, f: dict[str, Path]) -> list[str]:
    def edit(path: Path, state: dict[str, Any]) -> None:
        state["_data_files"] = [{"filename": "../outside/data-00000-of-00001.arrow"}]

    return ["eval", str(f["bert"]), "--data", str(_i26data_saved(tmp, edit))]


def _i26data_empty_tokenizer(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = _checkpoint(tmp, "emptytok")
    (path / "tokenizer.json").write_text("{}")
    return ["import", str(path)]


def _i26data_negative_resize(tmp: Path, f: dict[str, Path]) -> list[str]:
    path = tmp / "negresize"
    save_model(create_model("vit", ["a", "b"]), path)
    config = json.loads((path / "preprocessor_config.json").read_text())
    config["size"] = {"height": -8, "width": -8}
    (path / "preprocessor_config.json").write_text(json.dumps(config))
    return ["import", str(path)]


def _i26msgs_recipe(tmp: Path, steps: str) -> list[str]:
    path = tmp / "models.toml"
    path.write_text(
        '# a recipe\n[steps.init]\nrun = "init"\nfamily = "vit"\nlabels = ["a", "b"]\n' + steps,
        encoding="utf-8",
    )
    return ["run", str(path)]


def _i26msgs_forged(tmp: Path, f: dict[str, Path], text: bool, key: str, value: Any) -> list[str]:
    """`uqc predict` on a copy of a (text or image) ONNX export whose metadata `key` is
    edited: a dict of preprocessing fields to set, or a string; the manifest re-hashed."""
    import hashlib

    import onnx

    source = f["vit_onnx"]
    if text:  # one tiny BERT export per session, beside the matrix's other shared inputs
        from uqcompress.steps import export

        source = f["root"].parent / "i26msgs-bert-onnx"
        if not source.exists():
            export.run(f["bert"], export.ExportConfig(), source)
    path = _copy(tmp, source, "forged")
    model = onnx.load(str(path / "model.onnx"))
    for prop in model.metadata_props:
        if prop.key == key:
            prop.value = (
                value if isinstance(value, str) else json.dumps({**json.loads(prop.value), **value})
            )
    onnx.save(model, str(path / "model.onnx"))
    data = (path / "model.onnx").read_bytes()
    _edit_manifest(
        path,
        lambda m: m["files"].update(
            {"model.onnx": {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}
        ),
    )
    return ["predict", str(path), "--data", str(f["test"]) if text else "builtin:digits@test"]


def _i26paths_mistyped(tmp: Path, f: dict[str, Path]) -> list[str]:
    (tmp / "art").mkdir()
    return ["eval", str(tmp / "art" / "nope"), "--data", str(f["test"])]


def _i26paths_out_is_data(tmp: Path, f: dict[str, Path]) -> list[str]:
    data = tmp / "t.csv"
    shutil.copy(f["test"], data)
    return ["predict", str(f["bert"]), "--data", str(data), "--out", str(data), "--force"]


def _i26hydra_blank_text_csv(tmp: Path) -> Path:
    """A CSV whose second row's text is whitespace only: no real token once tokenised."""
    path = tmp / "blank.csv"
    path.write_text('text,label\ngood film,pos\n"   ",neg\n', encoding="utf-8")
    return path


def _i26hydra_bert_onnx(f: dict[str, Path]) -> Path:
    """The untrained tiny BERT exported to ONNX once per session (beside the matrix members)."""
    from uqcompress.steps import export

    out = f["root"].parent / "i26hydra-bert-onnx"
    if not out.exists():
        export.run(f["bert"], export.ExportConfig(format="onnx"), out)
    return out


def _i26lead_demo_over_theirs(tmp: Path, f: dict[str, Path]) -> list[str]:
    folder = tmp / "mine"
    folder.mkdir()
    _copy(folder, f["bert"], "model-seed0")  # the user's own artifact at a demo path
    return ["demo", "--quick", "--out", str(folder)]


ROWS: dict[str, tuple[Case, str]] = {
    "missing path": (
        lambda t, f: ["eval", str(t / "nope"), "--data", str(f["test"])],
        "does not exist",
    ),
    "neither artifact nor model": (
        lambda t, f: (t / "plain").mkdir() or ["eval", str(t / "plain"), "--data", str(f["test"])],
        "neither a uqc artifact",
    ),
    "checkpoint without weights": (_no_weights, "no weights"),
    "text model without tokenizer": (_no_tokenizer, "no tokenizer files"),
    "damaged checkpoint weights": (_damaged_weights, "cannot load the model"),
    "checkpoint with its own code": (_own_code, "auto_map"),
    "checkpoint of an unsupported architecture": (
        _unsupported_architecture,
        "holds a 'gpt2' model, which uqc does not support; supported families: bert, roberta",
    ),
    "DeiT checkpoint with a distillation classifier": (
        _deit_with_teacher,
        "is a DeiTForImageClassificationWithTeacher checkpoint",
    ),
    "pruning that would break grouped-query attention": (
        _gqa_ratio,
        "--ratio 0.25 removes 1 of 4 query heads in layer 0, which is not a whole number",
    ),
    "hub id offline": (lambda t, f: ["import", "some-org/some-model"], "HF_HUB_OFFLINE"),
    "wrong kind": (
        lambda t, f: ["finetune", str(f["eval"]), "--data", str(f["test"])],
        "is an eval artifact; this step needs model",
    ),
    "tampered file": (_tampered, "does not match its recorded sha256"),
    "truncated file": (_truncated, "has 100 bytes"),
    "unlisted file": (_unlisted, "not listed in its manifest"),
    "path outside the directory": (_escaping, "outside the artifact directory"),
    "newer kind_version": (_newer, "kind_version 99"),
    "unknown data spec": (
        lambda t, f: ["eval", str(f["bert"]), "--data", "foo.txt"],
        "unknown data spec",
    ),
    "unknown builtin": (
        lambda t, f: ["eval", str(f["bert"]), "--data", "builtin:nope"],
        "unknown built-in dataset",
    ),
    "unknown split": (
        lambda t, f: ["eval", str(f["bert"]), "--data", "builtin:digits@dev"],
        "unknown split 'dev'",
    ),
    "missing column": (
        lambda t, f: [
            "eval",
            str(f["bert"]),
            "--data",
            _csv(t, "c.csv", "sentence,label\nok,pos\n"),
        ],
        "no column 'text'",
    ),
    "wrong kind of data": (
        lambda t, f: ["eval", str(f["bert"]), "--data", "builtin:digits"],
        "holds image examples",
    ),
    "unknown labels": (
        lambda t, f: ["eval", str(f["bert"]), "--data", _csv(t, "u.csv", "text,label\nok,maybe\n")],
        "'maybe' that the model does not know",
    ),
    "label ids out of range": (
        lambda t, f: ["eval", str(f["bert"]), "--data", _csv(t, "r.csv", "text,label\nok,7\n")],
        "outside the model's 2 classes",
    ),
    "strings and ints": (
        lambda t, f: [
            "eval",
            str(f["bert"]),
            "--data",
            _csv(t, "m.jsonl", '{"text":"a","label":1}\n{"text":"b","label":"pos"}\n'),
        ],
        "mixes integer and string labels",
    ),
    "fractional labels": (
        lambda t, f: ["eval", str(f["bert"]), "--data", _csv(t, "f.csv", "text,label\na,0.5\n")],
        "fractional labels",
    ),
    "empty dataset": (
        lambda t, f: ["eval", str(f["bert"]), "--data", _csv(t, "e.csv", "text,label\n")],
        "no rows",
    ),
    "extra fields": (
        lambda t, f: [
            "eval",
            str(f["bert"]),
            "--data",
            _csv(t, "x.csv", "text,label\nok,pos\nhi,pos,x\n"),
        ],
        "row 3 has 3 fields",
    ),
    "not utf-8": (
        lambda t, f: (
            (t / "l.csv").write_bytes("text,label\ncafé,pos\n".encode("latin-1"))
            and ["eval", str(f["bert"]), "--data", str(t / "l.csv")]
        ),
        "not UTF-8",
    ),
    "corrupt image": (lambda t, f: _images(t, f, None), "cannot read image"),
    "a corrupt image among 1,000": (_corrupt_among_many, "imgs/1/0457.jpg ("),
    "two columns of one name": (
        lambda t, f: [
            "eval",
            str(f["bert"]),
            "--data",
            _csv(t, "d.csv", "text,text,label\na,b,pos\n"),
        ],
        "two columns named 'text' (columns 1 and 2)",
    ),
    "unknown Hub data set offline": (
        lambda t, f: ["eval", str(f["bert"]), "--data", "hf:uqc-test/not-there/cfg@train"],
        "is not in the local datasets cache",
    ),
    "missing pair column": (
        lambda t, f: [
            "eval",
            str(f["bert"]),
            "--data",
            str(f["test"]),
            "--text-pair-column",
            "hypothesis",
        ],
        "no column 'hypothesis'; its columns are text, label",
    ),
    "unreadable save_to_disk folder": (_bad_saved, "as a datasets save_to_disk directory"),
    "a DatasetDict folder": (_saved_dict, "is a DatasetDict saved with save_to_disk (splits: "),
    "single texts for a pair model": (
        lambda t, f: ["eval", str(_pair_model(t)), "--data", str(f["test"])],
        "the model was fine-tuned on text pairs (premise, hypothesis)",
    ),
    "decompression-bomb image": (_bomb, "is 15000x15000 pixels (225,000,000), more than"),
    "occupied --out": (_occupied_out, "already holds a different model artifact"),
    "--force on other files": (_force_on_files, "--force only replaces artifacts"),
    "--out inside an input": (
        lambda t, f: [
            "finetune",
            str(_copy(t, f["bert"], "in")),
            "--data",
            str(f["train"]),
            "--out",
            str(t / "in" / "sub"),
        ],
        "overlaps the input",
    ),
    "--force onto a folder with another program's manifest.json": (
        _foreign_site,
        "--force only replaces artifacts",
    ),
    "--force onto an artifact holding files it does not list": (
        _artifact_with_own_files,
        "notes.txt, which its manifest does not list",
    ),
    "--out inside another artifact": (
        lambda t, f: [
            "init",
            "--family",
            "bert",
            "--labels",
            "a,b",
            "--out",
            str(_copy(t, f["eval"], "other") / "sub"),
        ],
        "is inside the artifact",
    ),
    "--out the working directory": (
        lambda t, f: ["init", "--family", "bert", "--labels", "a,b", "--out", "."],
        "is the working directory or a folder that contains it",
    ),
    "a manifest field of the wrong type": (
        lambda t, f: [
            "verify",
            str(
                _edit_manifest(_copy(t, f["bert"], "listkind"), lambda m: m.update(kind=["model"]))
            ),
        ],
        "kind must be a string, not a list",
    ),
    "a manifest nested 100k levels deep": (_deep_manifest, "nests too deeply"),
    "a symlink inside an artifact": (
        _symlinked,
        "symlinked is a symlink; an artifact holds only regular files",
    ),
    "ONNX metadata without uqc.labels": (
        lambda t, f: [
            "predict",
            str(_onnx_edited(t, f, _drop_labels)),
            "--data",
            "builtin:digits@test",
        ],
        "does not follow the uqc export contract: its metadata has no uqc.labels",
    ),
    "ONNX external data outside the artifact": (
        lambda t, f: [
            "predict",
            str(_onnx_edited(t, f, _external_outside)),
            "--data",
            "builtin:digits@test",
        ],
        "which is outside the artifact directory",
    ),
    "predict --out a file that exists": (
        lambda t, f: [
            "predict",
            str(f["bert"]),
            "--data",
            str(f["test"]),
            "--out",
            _csv(t, "old.jsonl", "{}\n"),
        ],
        "already exists",
    ),
    "predict --out a folder": (
        lambda t, f: ["predict", str(f["bert"]), "--data", str(f["test"]), "--out", str(t)],
        "is a folder; predict writes one JSONL file",
    ),
    "out-of-range value": (
        lambda t, f: ["finetune", str(f["bert"]), "--data", str(f["train"]), "--epochs", "0"],
        "--epochs 0 must be at least 1",
    ),
    "non-finite float option": (
        lambda t, f: _sve(f, "--sigma-init", "inf"),
        "--sigma-init inf is not a finite number",
    ),
    "training --weight-decay negative": (
        lambda t, f: [
            "finetune",
            str(f["bert"]),
            "--data",
            str(f["train"]),
            "--weight-decay",
            "-0.1",
        ],
        "--weight-decay -0.1 must be a finite number, 0 or more",
    ),
    "training --optimizer unknown": (
        lambda t, f: ["finetune", str(f["bert"]), "--data", str(f["train"]), "--optimizer", "lion"],
        "unknown --optimizer 'lion'",
    ),
    "training --ema-every without --ema": (
        lambda t, f: ["finetune", str(f["bert"]), "--data", str(f["train"]), "--ema-every", "5"],
        "this run has no --ema",
    ),
    "svd-ensemble on data with other labels than the model's": (
        lambda t, f: [*_sve(f, "--data", str(_other_labels_csv(t))), "--members", "2"],
        "pass --heads fresh",
    ),
    "--threads far above the cores": (
        lambda t, f: ["eval", str(f["bert"]), "--data", str(f["test"]), "--threads", "100000"],
        "--threads 100000 is more than",
    ),
    "impossible --set": (
        lambda t, f: ["init", "--family", "vit", "--num-labels", "2", "--set", "hidden_size=0"],
        "hidden_size=0",
    ),
    "unknown init --set key": (
        lambda t, f: ["init", "--family", "bert", "--labels", "a,b", "--set", "num_hidden_layer=1"],
        "--set num_hidden_layer: unknown bert config key",
    ),
    "cuda without gpu": (
        lambda t, f: ["eval", str(f["bert"]), "--data", str(f["test"]), "--device", "cuda"],
        "no CUDA device",
    ),
    "bad gate": (
        lambda t, f: ["eval", str(f["bert"]), "--data", str(f["test"]), "--gate", "auroc>=1"],
        "unknown metric 'auroc'",
    ),
    "prune ratio out of range": (
        lambda t, f: ["prune", str(f["bert"]), "--scores", str(f["scores"]), "--ratio", "1.0"],
        "outside [0, 1)",
    ),
    "prune removes too many": (
        lambda t, f: [
            "prune",
            str(f["bert"]),
            "--scores",
            str(f["scores"]),
            "--ratio",
            "0.9",
            "--scope",
            "global",
        ],
        "lets at most 6 go",
    ),
    "scores of another model": (
        lambda t, f: ["prune", str(f["vit"]), "--scores", str(f["scores"]), "--ratio", "0.5"],
        "were computed for model",
    ),
    "circuit scores for members without their ratio": (
        lambda t, f: ["prune", str(_circuit_scores(t, f, 2)), "--members", "2"],
        "searched for --ratio 0.5, not no --ratio",
    ),
    "circuit scores with --select gumbel": (
        lambda t, f: [
            "prune",
            str(_circuit_scores(t, f, 2)),
            "--members",
            "2",
            "--ratio",
            "0.5",
            "--select",
            "gumbel",
        ],
        "circuit scores are searched head sets",
    ),
    "one circuit for several members": (
        lambda t, f: ["prune", str(_circuit_scores(t, f, 1)), "--members", "2", "--ratio", "0.5"],
        "hold 1 searched circuit(s)",
    ),
    "headmap members without a pool each": (
        lambda t, f: [
            "score",
            str(f["vit"]),
            "--method",
            "headmap",
            "--data",
            "builtin:digits@val",
            "--ratio",
            "0.5",
            "--members",
            "2",
        ],
        "would search the same lowest-loss examples for every member",
    ),
    "--calib-pool with another method": (
        lambda t, f: [
            "score",
            str(f["vit"]),
            "--method",
            "hies",
            "--data",
            "builtin:digits@val",
            "--calib-pool",
            "64",
        ],
        "--calib-pool is used by --method headmap only",
    ),
    "members from an unevenly pruned model": (
        _uneven_members,
        "keeps the same number of heads in every layer",
    ),
    "unknown score method": (
        lambda t, f: ["score", str(f["bert"]), "--method", "magic"],
        "unknown --method 'magic'",
    ),
    "empty calibration set": (
        lambda t, f: [
            "score",
            str(f["bert"]),
            "--method",
            "taylor",
            "--data",
            _csv(t, "h.csv", "text,label\n"),
        ],
        "no rows",
    ),
    "same model twice": (
        lambda t, f: ["eval", str(f["bert"]), str(f["bert"]), "--data", str(f["test"])],
        "more than once",
    ),
    "fuse without members": (
        lambda t, f: ["fuse", str(f["bert"])],
        "fuse takes a members artifact",
    ),
    "fuse members of different families": (_fuse_families, "different families"),
    "fuse members of different base models": (_fuse_bases, "different base models"),
    "svd-ensemble --members 0": (lambda t, f: _sve(f, "--members", "0"), "--members 0"),
    "svd-ensemble negative --sigma-init": (
        lambda t, f: _sve(f, "--sigma-init", "-1"),
        "--sigma-init -1.0 must be 0 or more",
    ),
    "svd-ensemble --targets matching nothing": (
        lambda t, f: _sve(f, "--targets", "nope"),
        "matches no linear layer; this model has: bert.encoder.layer.N.attention",
    ),
    "svd-ensemble --rank too large": (
        lambda t, f: _sve(f, "--rank", "64"),
        "--rank 64 is larger than",
    ),
    "mc-dropout --samples 0": (
        lambda t, f: ["mc-dropout", str(f["bert"]), "--samples", "0"],
        "--samples 0 must be at least 1",
    ),
    "mc-dropout --rate outside [0, 1)": (
        lambda t, f: ["mc-dropout", str(f["bert"]), "--rate", "1"],
        "--rate 1.0 is outside [0, 1)",
    ),
    "mc-dropout of a model trained without dropout": (
        lambda t, f: ["mc-dropout", str(f["vit"])],
        "has hidden_dropout_prob 0 (it trained without dropout)",
    ),
    "mc-dropout of an unsupported family": (
        _roberta,
        "is a roberta model; MC Dropout supports the bert and vit families",
    ),
    "lambda-std without mse": (
        lambda t, f: [
            "distill-director",
            str(f["bert"]),
            "--data",
            str(f["train"]),
            "--lambda-std",
            "0.5",
        ],
        "--lambda-std applies only to --loss mse",
    ),
    "--select-best without --val": (
        lambda t, f: [
            "finetune",
            str(f["bert"]),
            "--data",
            str(f["train"]),
            "--select-best",
            "nll",
        ],
        "--select-best nll needs validation data to score the epochs",
    ),
    "--patience without a metric": (
        lambda t, f: _sve(f, "--patience", "2"),
        "--patience stops on a validation metric, but this run has none (no --val)",
    ),
    "--grad-accum 0": (
        lambda t, f: [
            "distill-director",
            str(f["bert"]),
            "--data",
            str(f["train"]),
            "--grad-accum",
            "0",
        ],
        "--grad-accum 0 must be at least 1",
    ),
    "--resume without a checkpoint": (
        lambda t, f: [
            "finetune",
            str(f["bert"]),
            "--data",
            str(f["train"]),
            "--resume",
            "--out",
            str(t / "resumed"),
        ],
        "--resume: no checkpoint of this run in",
    ),
    "calibrate --abstain-coverage outside (0, 1]": (
        lambda t, f: [
            "calibrate",
            str(f["bert"]),
            "--data",
            str(f["test"]),
            "--abstain-coverage",
            "1.5",
        ],
        "--abstain-coverage 1.5 must be in (0, 1]",
    ),
    "quantize a model artifact (not ONNX)": (
        lambda t, f: ["quantize", str(f["bert"]), "--data", str(f["test"])],
        "is a model artifact, not an ONNX export",
    ),
    "quantize --mode static without --data": (
        lambda t, f: ["quantize", str(f["vit_onnx"]), "--mode", "static"],
        "--mode static calibrates its activation ranges on --data",
    ),
    "quantize an already quantized artifact": (_quantized, "is already quantized (dynamic)"),
    "quantize an unknown --mode": (
        lambda t, f: ["quantize", str(f["vit_onnx"]), "--mode", "int4", "--data", str(f["test"])],
        "unknown --mode 'int4'",
    ),
    "a recipe value that looks like an option": (
        lambda t, f: ["run", _recipe(t), "--set", "steps.init.family=--help"],
        "steps.init.family: '--help' starts with '-' like a command-line option",
    ),
    "a --set key that does not exist": (
        lambda t, f: ["run", _recipe(t), "--set", "vars.tarin=x.csv"],
        "--set vars.tarin: no variable 'tarin' in [vars] (it has: test, train)",
    ),
    # issue 26 (lead)
    "demo --out DIR holding a user's artifact at a demo path": (
        _i26lead_demo_over_theirs,
        "holds model-seed0, an artifact uqc demo did not write there",
    ),
    "--workers above 4 x the cores": (
        lambda t, f: [
            "eval",
            str(f["vit"]),
            "--data",
            "builtin:digits@test",
            "--workers",
            "100000",
        ],
        "--workers 100000 is more than",
    ),
    "init --set num_hidden_layers=100000": (
        lambda t, f: [
            *("init", "--family", "bert", "--labels", "a,b", "--out", str(t / "huge")),
            *("--set", "num_hidden_layers=100000"),
        ],
        "num_hidden_layers=100000 is more than 256",
    ),
    "verify an artifact whose input was resealed": (
        _i26lead_resealed_input,
        "was made from a model input that has changed since",
    ),
    "quantize a path that does not exist": (
        lambda t, f: ["quantize", str(t / "nope"), "--data", str(f["test"])],
        "nope does not exist",
    ),
    # issue 26 (nan)
    "eval of a model with NaN outputs": (
        lambda t, f: ["eval", _i26nan_model(t), "--data", str(f["test"])],
        "computes NaN or infinite outputs for example 0",
    ),
    "calibrate a model with NaN outputs": (
        lambda t, f: ["calibrate", _i26nan_model(t), "--data", str(f["test"])],
        "computes NaN or infinite outputs for example 0",
    ),
    "predict with a model with NaN outputs": (
        lambda t, f: ["predict", _i26nan_model(t), "--data", str(f["test"])],
        "its weights hold 1 non-finite value (in classifier.weight)",
    ),
    "score --method hies of a model with NaN outputs": (
        lambda t, f: ["score", _i26nan_model(t), "--method", "hies", "--data", str(f["test"])],
        "scores (score) of",
    ),
    "--resume with a checkpoint epoch beyond the run": (
        _i26nan_resume("epoch far beyond the run"),
        "has loop.epoch 1000000, outside [0, 2] for this run",
    ),
    "--resume with a checkpoint scheduler last_epoch -5": (
        _i26nan_resume("scheduler last_epoch -5"),
        "has scheduler last_epoch -5, but it is at step 8",
    ),
    "--resume with a checkpoint weight of another shape": (
        _i26nan_resume("model weight of another shape"),
        "of shape [3, 5], this run",
    ),
    "--resume with a checkpoint without optimizer state": (
        _i26nan_resume("optimizer state emptied"),
        "has no optimizer state for its 8 steps",
    ),
    "--resume with a checkpoint with a bad RNG state": (
        _i26nan_resume("torch RNG state of another type"),
        "has an rng_torch that is not torch's CPU generator state",
    ),
    "--resume with a checkpoint torch will not unpickle": (
        _i26nan_resume("a pickle torch will not load"),
        "cannot be read (torch refused to unpickle it: Unsupported global",
    ),
    "export a model whose weights are NaN": (
        lambda t, f: ["export", _i26nan_model(t), "--format", "onnx"],
        "cannot be exported: its weights hold 1 non-finite value (in classifier.weight)",
    ),
    "finetune a model whose starting weights are NaN": (
        lambda t, f: ["finetune", _i26nan_model(t), "--data", str(f["train"])],
        "the starting weights of",
    ),
    # issue 26 (data)
    "a save_to_disk folder whose state.json names a file outside it": (
        _i26data_escaping_state,
        "names '../outside/data-00000-of-00001.arrow', which is outside the data folder",
    ),
    "a JSON Lines line holding null (crashed datasets, exit 139)": (
        lambda t, f: [
            "eval",
            str(f["bert"]),
            "--data",
            _csv(t, "null.jsonl", 'null\n{"text":"a","label":"pos"}\n'),
        ],
        "null.jsonl line 1: holds null, not a JSON object",
    ),
    "a JSON Lines line that is not valid JSON": (
        lambda t, f: [
            "eval",
            str(f["bert"]),
            "--data",
            _csv(t, "bad.jsonl", '{"text":"a","label":"pos"}\n{"text":"b"} x\n'),
        ],
        "bad.jsonl line 2: not valid JSON (Extra data at column 14)",
    ),
    "a tokenizer.json of {}": (
        _i26data_empty_tokenizer,
        "emptytok/tokenizer.json is broken: it has no 'model' or 'added_tokens'",
    ),
    "a negative resize in preprocessor_config.json": (
        _i26data_negative_resize,
        "is not a valid image-processor config: size.height is -8; a side must be 1..8192",
    ),
    "--text-column X --text-pair-column X": (
        lambda t, f: [
            "eval",
            str(f["bert"]),
            "--data",
            str(f["test"]),
            "--text-column",
            "text",
            "--text-pair-column",
            "text",
        ],
        "--text-column and --text-pair-column both name the column 'text'",
    ),
    "a .parquet file that is not Parquet (no stray datasets log line)": (
        lambda t, f: ["eval", str(f["bert"]), "--data", _csv(t, "bad.parquet", "PAR1garbage")],
        "cannot read",
    ),
    "a .json list with a null item": (
        lambda t, f: [
            "eval",
            str(f["bert"]),
            "--data",
            _csv(t, "list.json", '[{"text": "a", "label": "pos"},\n null]'),
        ],
        "list.json line 2: item 2 holds null, not a JSON object",
    ),
    "a JSON object as a text cell": (
        lambda t, f: [
            "eval",
            str(f["bert"]),
            "--data",
            _csv(t, "obj.jsonl", '{"text":"a","label":"pos"}\n{"text":{"a":1},"label":"neg"}\n'),
        ],
        "obj.jsonl line 2: the 'text' cell holds a JSON object ({'a': 1}), not text",
    ),
    "a label 1e300": (
        lambda t, f: [
            "eval",
            str(f["bert"]),
            "--data",
            _csv(t, "big.csv", "text,label\ngood film,1e300\nbad film,0\n"),
        ],
        "has a label out of range (1e+300)",
    ),
    # issue 26 (msgs)
    "a recipe step given model and models": (
        lambda t, f: _i26msgs_recipe(
            t, '[steps.e]\nrun = "eval"\nmodel = "@init"\nmodels = ["@init"]\ndata = "x.csv"\n'
        ),
        "steps.e.model: model and models are the same key (one input of uqc eval)",
    ),
    "a recipe step of one model given several": (
        lambda t, f: _i26msgs_recipe(
            t, '[steps.q]\nrun = "quantize"\nmodels = ["@init", "@init"]\n'
        ),
        "steps.q.models: uqc quantize takes one model, got 2",
    ),
    "ONNX metadata: pad_token_id outside the vocabulary": (
        lambda t, f: _i26msgs_forged(t, f, True, "uqc.preprocessing", {"pad_token_id": 99999}),
        "pad_token_id is 99999 in uqc.preprocessing, outside the vocabulary (0..710)",
    ),
    "ONNX metadata: max_length above the position table": (
        lambda t, f: _i26msgs_forged(t, f, True, "uqc.preprocessing", {"max_length": 512}),
        "max_length is 512 in uqc.preprocessing, above the graph's position table (128",
    ),
    "ONNX metadata: image_size other than the graph's": (
        lambda t, f: _i26msgs_forged(t, f, False, "uqc.preprocessing", {"image_size": 32}),
        "image_size is 32 in uqc.preprocessing; the graph takes 8x8 images",
    ),
    "ONNX metadata: num_channels other than the graph's": (
        lambda t, f: _i26msgs_forged(t, f, False, "uqc.preprocessing", {"num_channels": 3}),
        "num_channels is 3 in uqc.preprocessing; the graph takes 1",
    ),
    "ONNX metadata: an unknown uqc.aggregation": (
        lambda t, f: _i26msgs_forged(t, f, False, "uqc.aggregation", "median_logits"),
        "uqc.aggregation is 'median_logits'; uqc reads only 'mean_probs'",
    ),
    "export --opset outside the supported range": (
        lambda t, f: ["export", str(f["vit"]), "--opset", "99", "--out", str(t / "x")],
        "--opset 99 is outside the supported range 18..23",
    ),
    # issue 26 (paths)
    "a mistyped local model path (art/nope, art exists)": (
        _i26paths_mistyped,
        "does not exist (no such directory)",
    ),
    "prune a path that does not exist": (
        lambda t, f: ["prune", str(t / "nope"), "--ratio", "0.5", "--out", str(t / "x")],
        "nope does not exist (no such directory)",
    ),
    # issue 26 (quant)
    "quantize --exclude that matches every node": (
        lambda t, f: ["quantize", str(f["vit_onnx"]), "--exclude", ".*", "--data", str(f["test"])],
        "--exclude '.*' keeps every MatMul/Gemm/Gather/Conv layer outside the float32 tail",
    ),
    "quantize --max-auroc-drop without --ood": (
        lambda t, f: [
            "quantize",
            str(f["vit_onnx"]),
            "--max-auroc-drop",
            "0.05",
            "--data",
            str(f["test"]),
        ],
        "--max-auroc-drop 0.05 bounds the OOD AUROC drop, but no --ood data is given",
    ),
    "predict --out FILE --force where FILE is its --data": (
        _i26paths_out_is_data,
        "overlaps the input",
    ),
    # issue 26 (hydra)
    "eval on a CSV row whose text is whitespace only": (
        lambda t, f: ["eval", str(f["bert"]), "--data", str(_i26hydra_blank_text_csv(t))],
        "example 2 of 2 has no real token",
    ),
    "predict an ONNX export on a CSV row whose text is whitespace only": (
        lambda t, f: [
            "predict",
            str(_i26hydra_bert_onnx(f)),
            "--data",
            str(_i26hydra_blank_text_csv(t)),
        ],
        "has no real token",
    ),
    "quantize --calib-size above its bound": (
        lambda t, f: ["quantize", str(f["vit_onnx"]), "--calib-size", "100000", "--data", "x"],
        "--calib-size 100000 is more than 4,096",
    ),
    "predict --out with a file name over 255 bytes": (
        lambda t, f: [
            "predict",
            str(f["bert"]),
            "--data",
            str(f["test"]),
            "--out",
            str(t / ("p" * 300)),
        ],
        "File name too long",
    ),
}


def _recipe(tmp: Path) -> str:
    path = tmp / "recipe.toml"
    path.write_text(
        '# a recipe\n[vars]\ntrain = "builtin:digits@train"\ntest = "builtin:digits@test"\n'
        '[steps.init]\nrun = "init"\nfamily = "vit"\n',
        encoding="utf-8",
    )
    return str(path)


@pytest.fixture
def inputs(
    tiny_bert_artifact: Path,
    tiny_vit_artifact: Path,
    vit_onnx: Path,
    sentiment_csv: dict[str, Path],
    session_root: Path,
) -> dict[str, Path]:
    from uqcompress.steps import eval as eval_step

    evaluation = eval_step.run(
        [tiny_bert_artifact],
        eval_step.EvalConfig(data=str(sentiment_csv["test"])),
        session_root / "matrix-eval",
    ).artifact.path
    from uqcompress.steps import score as score_step

    scores = score_step.run(
        tiny_bert_artifact, score_step.ScoreConfig(method="l2"), session_root / "matrix-scores"
    ).artifact.path
    return {
        "bert": tiny_bert_artifact,
        "vit": tiny_vit_artifact,
        "vit_onnx": vit_onnx,
        "eval": evaluation,
        "scores": scores,
        "root": session_root / "matrix-members",
        **sentiment_csv,
    }


@pytest.mark.parametrize("row", list(ROWS))
def test_bad_input_row(
    row: str,
    cli,
    tmp_path: Path,
    inputs: dict[str, Path],  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
    _artifacts_root: Path,
) -> None:
    if row == "cuda without gpu":
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is visible here")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))  # an empty cache
    work = tmp_path / "work"
    work.mkdir()
    build, needle = ROWS[row]
    args = build(work, inputs)
    before = sorted(p.name for p in work.rglob("*"))
    result = cli(*args)
    assert result.code == 1, result.err
    assert result.out == ""
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.err
    assert needle in lines[0]
    assert "(fix: " in lines[0]
    assert not _artifacts_root.exists() or not any(_artifacts_root.iterdir())
    assert sorted(p.name for p in work.rglob("*")) == before  # nothing written, no temp dirs


def test_missing_onnxruntime_row(
    cli,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
    tiny_vit_artifact: Path,
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    result = cli("export", str(tiny_vit_artifact), "--format", "onnx")
    assert result.code == 1
    assert "uqcompress[cpu]" in result.err and "uqcompress[gpu]" in result.err
