"""Weight decay: `--weight-decay` on every training step, and never on biases, norm weights
or SVE singular values (one grouping, `train.parameter_groups`)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from uqcompress.artifacts import open_artifact
from uqcompress.engine.train import TrainConfig, no_decay_names, parameter_groups, train
from uqcompress.methods.hydra import fuse
from uqcompress.methods.sve import build_sve
from uqcompress.models.factory import create_model
from uqcompress.models.grouped import GroupedLinear
from uqcompress.models.surgery import prune_heads
from uqcompress.models.sve_model import SVDLinear

LABELS = ["a", "b", "c"]
TRAINING_COMMANDS = ("finetune", "svd-ensemble", "distill-director")


def _grouped_names(model: nn.Module, weight_decay: float) -> tuple[set[str], set[str]]:
    """(decayed, not decayed) parameter names of the optimiser groups."""
    names = {id(p): n for n, p in model.named_parameters()}
    decayed: set[str] = set()
    kept: set[str] = set()
    for group in parameter_groups(model, weight_decay):
        target = decayed if group["weight_decay"] > 0 else kept
        target |= {names[id(p)] for p in group["params"]}
    return decayed, kept


def test_tiny_bert_decays_weight_matrices_only() -> None:
    model = create_model("bert", LABELS, preset="tiny").model
    decayed, kept = _grouped_names(model, 0.01)
    everything = {n for n, p in model.named_parameters() if p.requires_grad}
    assert decayed | kept == everything and not decayed & kept
    norms = {
        f"{name}.{p}"
        for name, module in model.named_modules()
        if isinstance(module, nn.LayerNorm)
        for p, _ in module.named_parameters(recurse=False)
    }
    assert norms and any(n.endswith("LayerNorm.weight") for n in norms)
    assert norms <= kept
    assert {n for n in everything if n.endswith(".bias")} <= kept
    linears = {
        f"{name}.weight" for name, module in model.named_modules() if isinstance(module, nn.Linear)
    }
    assert "classifier.weight" in linears and linears <= decayed
    assert "bert.embeddings.word_embeddings.weight" in decayed
    # Nothing else: a kept parameter is a norm's, a bias, or 1-D.
    assert kept == norms | {n for n in everything if n.endswith(".bias")}


def test_sve_singular_values_and_biases_are_never_decayed() -> None:
    base = create_model("bert", LABELS, preset="tiny")
    model: Any = build_sve(base, 2, "default", None, 0.01, 0).model
    decayed, kept = _grouped_names(model, 0.01)
    singular = {n for n, _ in model.named_parameters() if n.endswith(".singular_values")}
    assert singular and singular <= kept
    biases = {n for n, p in model.named_parameters() if p.requires_grad and n.endswith(".bias")}
    assert biases <= kept
    # The member heads' weight matrices are the only decayed SVE parameters.
    assert decayed == {"inner.classifier.weight"}
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert not (decayed | kept) & frozen  # frozen parameters are in no group


def test_hydra_member_layer_norms_are_norms() -> None:
    base = create_model("vit", LABELS, preset="tiny")
    members = []
    for keep in ([[0, 1], [2]], [[3], [0, 1]]):
        member = copy.deepcopy(base)
        prune_heads(member, keep)
        members.append(member)
    model = fuse(members).model
    norm_weights = {
        f"{name}.weight"
        for name, module in model.named_modules()
        if type(module).__name__ == "MemberLayerNorm"
    }
    assert norm_weights  # [M, d] weights: 2-D, so only the module type keeps them undecayed
    assert norm_weights <= no_decay_names(model)
    grouped = {
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, GroupedLinear)
    }
    assert grouped and not grouped & no_decay_names(model)


def test_zero_gradient_training_leaves_singular_values_but_decays_weights() -> None:
    """With a zero gradient AdamW's step is decay alone: p <- p (1 - lr wd). The singular
    values (the pretrained spectrum) and biases must come out bitwise unchanged; the heads'
    weight matrices shrink by exactly the product of those factors."""
    from torch.utils.data import DataLoader

    base = create_model("vit", LABELS, preset="tiny")
    model: Any = build_sve(base, 2, "default", None, 0.01, 0).model
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in trainable.items()}

    def zero_loss(net: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        # Every trainable parameter gets a gradient of exactly 0 (a None gradient would skip
        # the parameter, decay included, and prove nothing).
        return sum((p * 0.0).sum() for p in net.parameters() if p.requires_grad)  # type: ignore[return-value]

    rows = [{"labels": torch.tensor(i % 3)} for i in range(8)]
    cfg = TrainConfig(epochs=1, lr=0.1, batch_size=4, weight_decay=0.5, warmup_ratio=0.0)
    train(model, DataLoader(rows, batch_size=4), cfg, loss_fn=zero_loss)  # type: ignore[arg-type]
    after = dict(model.named_parameters())
    singular = [n for n in trainable if n.endswith(".singular_values")]
    assert singular
    for name in singular + [n for n in trainable if n.endswith(".bias")]:
        assert torch.equal(after[name], before[name]), name
    # Two steps, both at the full lr (a 1-step warm-up, then (total - step) / (total - 1)).
    shrink = (1 - 0.1 * 0.5) ** 2
    head = "inner.classifier.weight"
    assert torch.allclose(after[head], before[head] * shrink, atol=1e-7)
    assert not torch.equal(after[head], before[head])


def test_zero_weight_decay_is_one_group_without_decay() -> None:
    model = create_model("bert", LABELS, preset="tiny").model
    groups = parameter_groups(model, 0.0)
    assert all(g["weight_decay"] == 0.0 for g in groups)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_modules_may_declare_their_own_no_decay_parameters() -> None:
    assert "singular_values" in SVDLinear.NO_WEIGHT_DECAY

    class Scaled(nn.Module):
        NO_WEIGHT_DECAY = ("scale",)

        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(2, 2))
            self.weight = nn.Parameter(torch.ones(2, 2))

    outer = nn.Sequential(Scaled())
    assert no_decay_names(outer) == {"0.scale"}


@pytest.mark.parametrize("command", TRAINING_COMMANDS)
@pytest.mark.parametrize("value", ["-0.1", "nan", "inf"])
def test_bad_weight_decay_is_refused_on_every_training_step(
    cli: Callable[..., Any],
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
    command: str,
    value: str,
    _artifacts_root: Path,
) -> None:
    args = [command, str(tiny_bert_artifact), "--data", str(sentiment_csv["train"])]
    result = cli(*args, "--weight-decay", value)
    assert result.code == 1, result.err
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --weight-decay"), result.err
    assert "(fix: " in lines[0] and result.out == ""
    assert not _artifacts_root.exists() or not any(_artifacts_root.iterdir())


def test_finetune_weight_decay_zero_runs_and_changes_the_id(
    cli: Callable[..., Any], tiny_bert_artifact: Path, sentiment_csv: dict[str, Path]
) -> None:
    args = ["finetune", str(tiny_bert_artifact), "--data", str(sentiment_csv["train"])]
    args += ["--epochs", "1"]
    plain = cli(*args)
    off = cli(*args, "--weight-decay", "0")
    assert plain.code == 0 and off.code == 0, off.err
    a, b = open_artifact(Path(plain.out.strip())), open_artifact(Path(off.out.strip()))
    assert a.manifest.config["weight_decay"] == 0.01 and b.manifest.config["weight_decay"] == 0.0
    assert a.id != b.id  # the value changes the weights, so it is in the id


def test_svd_ensemble_records_its_weight_decay(
    tmp_path: Path, tiny_bert_artifact: Path, sentiment_csv: dict[str, Path]
) -> None:
    from uqcompress.steps import sve

    cfg = sve.SVEConfig(
        data=str(sentiment_csv["train"]), members=2, epochs=1, batch_size=32, weight_decay=0.0
    )
    artifact = sve.run(tiny_bert_artifact, cfg, tmp_path / "sve").artifact
    assert artifact.manifest.config["weight_decay"] == 0.0


def test_every_training_command_takes_weight_decay_and_recipes_can_set_it(
    tmp_path: Path,
) -> None:
    from uqcompress.recipe.commands import command
    from uqcompress.recipe.parse import load_recipe

    for name in TRAINING_COMMANDS:
        param = command(name).params["weight_decay"]
        assert param.flag == "--weight-decay" and param.kind is float
    recipe = tmp_path / "wd.toml"
    recipe.write_text(
        '[steps.base]\nrun = "init"\nfamily = "vit"\n\n'
        '[steps.tuned]\nrun = "finetune"\nmodel = "@base"\ndata = "builtin:digits@train"\n'
        "weight_decay = 0.05\n\n"
        '[steps.sve]\nrun = "svd-ensemble"\nmodel = "@tuned"\ndata = "builtin:digits@train"\n'
        "weight_decay = 0\n",
        encoding="utf-8",
    )
    steps = {s.name: s for s in load_recipe(recipe).steps}
    tuned = command("finetune").argv({**steps["tuned"].values, "model": "M"})
    assert tuned[tuned.index("--weight-decay") + 1] == "0.05"
    built = command("svd-ensemble").argv({**steps["sve"].values, "model": "M"})
    assert float(built[built.index("--weight-decay") + 1]) == 0.0
