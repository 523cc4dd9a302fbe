"""DIRECTOR: the teacher's states, the Gaussian losses, seeded sampling and parameter counts."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from uqcompress.errors import ConfigError
from uqcompress.methods.director import (
    build_student,
    gaussian_kl,
    gaussian_nll,
    record_teacher_states,
)
from uqcompress.models.director_model import DirectorModel, DirectorSpec
from uqcompress.models.factory import create_model
from uqcompress.models.families.base import additive_mask
from uqcompress.models.loading import LoadedModel

LABELS = ["a", "b", "c"]


def _batch(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    if loaded.input_kind == "image":
        return {"pixel_values": torch.randn(4, 1, 8, 8, generator=generator)}
    ids = torch.randint(5, 700, (4, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def _teacher(family: str, preset: str = "tiny") -> LoadedModel:
    loaded = create_model(family, LABELS, preset=preset)
    loaded.model.eval()
    return loaded


@pytest.mark.parametrize("family", ["vit", "bert"])
def test_recorded_states_are_the_attention_adds_and_the_head_gives_the_logits(
    family: str,
) -> None:
    teacher = _teacher(family)
    batch = _batch(teacher)
    model: Any = teacher.model
    recorded = record_teacher_states(model, family, 2, batch)
    assert recorded.states.shape[0] == 3  # x_0, x_1, x_2
    with torch.no_grad():
        if family == "vit":
            x0 = model.vit.embeddings(batch["pixel_values"])
            layer = model.vit.layers[0]
            x1 = x0 + layer.attention(layer.layernorm_before(x0))[0]  # pre-LN attention add
        else:
            x0 = model.bert.embeddings(
                input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"]
            )
            mask = additive_mask(batch["attention_mask"], x0.dtype)
            x1 = model.bert.encoder.layer[0].attention(x0, mask)[0]  # LN(x + attention)
        student = build_student(teacher, None, 1, 1, 0)
        logits = student.head(recorded.states[-1])
    assert torch.allclose(recorded.states[0], x0, atol=1e-6)
    assert torch.allclose(recorded.states[1], x1, atol=1e-5)
    assert torch.allclose(logits, recorded.logits, atol=1e-5)
    assert torch.allclose(recorded.logits, model(**batch).logits, atol=1e-6)


@pytest.mark.parametrize("family", ["vit", "bert"])
def test_replace_last_starts_from_the_last_kept_layer(family: str) -> None:
    teacher = _teacher(family, "small")  # 4 layers
    batch = _batch(teacher)
    recorded = record_teacher_states(teacher.model, family, 2, batch)
    student = build_student(teacher, 2, 1, 1, 0)
    with torch.no_grad():
        x0, _ = student.start_state(batch)
    assert len(student.prefix) == 2 and recorded.states.shape[0] == 3
    valid = batch.get("attention_mask", torch.ones(x0.shape[:2]))[:, :, None].bool()
    assert torch.allclose(x0 * valid, recorded.states[0] * valid, atol=1e-5)


def test_gaussian_kl_is_zero_for_identical_and_matches_torch_distributions() -> None:
    generator = torch.Generator().manual_seed(0)
    mean = torch.randn(50, generator=generator)
    std = torch.rand(50, generator=generator) + 0.1
    assert torch.allclose(gaussian_kl(mean, std, mean, std), torch.zeros(50), atol=1e-7)
    other_mean = torch.randn(50, generator=generator)
    other_std = torch.rand(50, generator=generator) + 0.1
    want = torch.distributions.kl_divergence(
        torch.distributions.Normal(mean, std), torch.distributions.Normal(other_mean, other_std)
    )
    assert torch.allclose(gaussian_kl(mean, std, other_mean, other_std), want, atol=1e-6)
    # The NLL of a point is the KL against a point mass up to a constant: minimal at the mean.
    assert gaussian_nll(mean, mean, std).sum() < gaussian_nll(mean, other_mean, std).sum()


@pytest.mark.parametrize("family", ["vit", "bert"])
def test_sampling_is_seeded_and_the_std_is_positive(family: str) -> None:
    teacher = _teacher(family)
    student = build_student(teacher, None, 1, 3, seed=0)
    with torch.no_grad():  # give the std head some spread, so samples differ visibly
        student.transition.std_head[1].bias.fill_(1.0)
    batch = _batch(teacher)
    with torch.no_grad():
        first = student(**batch).member_logits
        again = student(**batch).member_logits
        other = build_student(teacher, None, 1, 3, seed=0)
        other.load_state_dict(student.state_dict())
        other.spec = DirectorSpec(replace_last=2, depth=1, samples=3, seed=1)
        different = other(**batch).member_logits
        x0, mask = student.start_state(batch)
        _, std = student.transition(x0, 0, mask)
    assert first.shape == (4, 3, 3)
    assert torch.equal(first, again)
    assert not torch.allclose(first, different)
    assert not torch.allclose(first[:, 0], first[:, 1])  # samples differ from each other
    assert bool((std > 0).all())


def test_one_sample_with_zero_noise_is_the_deterministic_forward() -> None:
    teacher = _teacher("vit")
    student = build_student(teacher, None, 1, 1, seed=0)
    batch = _batch(teacher)
    with torch.no_grad():
        x0, mask = student.start_state(batch)
        deterministic = student.head(student.rollout(x0, mask, None))
        zero = torch.zeros(student.noise_shape(4, x0.shape[1]))
        sampled = student(noise=zero, **batch).member_logits[:, 0]
    assert torch.allclose(sampled, deterministic, atol=1e-6)


def _counts(family: str, preset: str) -> tuple[int, int]:
    from uqcompress.models.families import family_by_name

    fam = family_by_name(family)
    config = fam.build_config(preset, {}, [str(i) for i in range(10)])
    with torch.device("meta"):  # shapes only: no weights are allocated or initialised
        teacher = fam.classifier_class()(config)
        student = DirectorModel(
            teacher, family, DirectorSpec(int(config.num_hidden_layers), 1, 10, 0)
        )
    return (
        sum(p.numel() for p in teacher.parameters()),
        sum(p.numel() for p in student.parameters()),
    )


@pytest.mark.parametrize(
    ("family", "preset"), [("vit", "small"), ("vit", "base"), ("bert", "base")]
)
def test_the_student_is_smaller_than_its_teacher(family: str, preset: str) -> None:
    teacher, student = _counts(family, preset)
    assert student < teacher, (student, teacher)


def test_bad_director_settings_are_refused() -> None:
    teacher = _teacher("vit")
    with pytest.raises(ConfigError, match=r"--replace-last 3 is outside 1\.\.2"):
        build_student(teacher, 3, 1, 10, 0)
    with pytest.raises(ConfigError, match="--samples 0"):
        build_student(teacher, None, 1, 0, 0)
    with pytest.raises(ConfigError, match="does not support the gpt2 family") as refused:
        DirectorModel(teacher.model, "gpt2", DirectorSpec(2, 1, 1, 0))
    from uqcompress.models.families import FAMILIES

    assert f"supported: {', '.join(FAMILIES)}" in str(refused.value.hint)


def test_noise_input_layout_matches_a_manual_rollout_per_example_and_sample() -> None:
    teacher = _teacher("bert")
    student = build_student(teacher, None, 1, 3, seed=0)
    with torch.no_grad():
        student.transition.std_head[1].bias.fill_(0.5)
    batch = _batch(teacher)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        x0, mask = student.start_state(batch)
        noise = torch.randn(student.noise_shape(4, x0.shape[1]), generator=generator)
        got = student(noise=noise, **batch).member_logits  # [B, S, C]
        for b in range(4):
            for s in range(3):
                steps = noise[b, s][:, None]  # [K, 1, T, d]: example b, sample s
                one_mask = mask[b : b + 1] if mask is not None else None
                want = student.head(student.rollout(x0[b : b + 1], one_mask, steps))
                assert torch.allclose(got[b, s], want[0], atol=1e-5), (b, s)


def test_a_saved_student_loads_with_the_same_trainable_parts(tmp_path: Any) -> None:
    import copy

    from uqcompress.models.director_model import DIRECTOR_KEY, student_trainable
    from uqcompress.models.loading import load_model, resolve_model_source, save_model

    teacher = _teacher("vit")
    student = build_student(teacher, None, 1, 2, seed=0, train_head=False)
    student_trainable(student, train_head=False)
    config = copy.deepcopy(teacher.config)
    setattr(config, DIRECTOR_KEY, student.spec.to_dict())
    student.config = config
    saved = LoadedModel(
        model=student,  # type: ignore[arg-type]
        family=teacher.family,
        config=config,
        labels=teacher.labels,
        preprocessing=teacher.preprocessing,
    )
    save_model(saved, tmp_path / "student")
    loaded: Any = load_model(resolve_model_source(tmp_path / "student")).model
    trainable = {n for n, p in student.named_parameters() if p.requires_grad}
    assert trainable == {n for n, p in loaded.named_parameters() if p.requires_grad}
    assert all(n.startswith("transition.") for n in trainable)
    batch = _batch(teacher)
    with torch.no_grad():
        assert torch.equal(student(**batch).member_logits, loaded(**batch).member_logits)


@pytest.mark.parametrize("pad_left", [False, True])
def test_a_split_batch_draws_the_noise_one_process_draws_for_each_token(
    monkeypatch: pytest.MonkeyPatch, pad_left: bool
) -> None:
    """Two processes holding rows 0-1 (padded to 3 tokens) and 2-4 (to 5) of a batch get, at
    every token, the draw one process gets for the whole batch padded to 5 tokens."""
    from uqcompress.methods import director
    from uqcompress.runtime import distributed

    shapes = [(2, 3), (3, 5)]
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "all_gather_objects", lambda value: shapes)
    whole = torch.randn(4, 5, 5, 6, generator=torch.Generator().manual_seed(7))
    split = director.BatchSplit(pad_left=pad_left)
    for index, (rows, width) in enumerate(shapes):
        monkeypatch.setattr(distributed, "rank", lambda index=index: index)
        x0 = torch.zeros(rows, width, 6)
        got = director._rollout_noise(4, x0, torch.Generator().manual_seed(7), split)
        first = sum(r for r, _ in shapes[:index])
        expected = whole[:, first : first + rows]
        expected = expected[:, :, 5 - width :] if pad_left else expected[:, :, :width]
        assert got.shape == (4, rows, width, 6)
        assert torch.equal(got, expected)
    # no split (validation runs whole batches on every process), or one process: the
    # process's own batch, as one process has always drawn it
    x0 = torch.zeros(5, 5, 6)
    assert torch.equal(
        director._rollout_noise(4, x0, torch.Generator().manual_seed(7), None), whole
    )
    monkeypatch.setattr(distributed, "world_size", lambda: 1)
    assert torch.equal(
        director._rollout_noise(4, x0, torch.Generator().manual_seed(7), split), whole
    )
