"""engine/modality.py: the one place text and image models differ in their inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from uqcompress.engine.modality import IMAGE, TEXT, modality_of, synthetic_batch
from uqcompress.export import contract
from uqcompress.models.tiny import tiny_bert, tiny_vit


def test_the_contracts_input_names_are_the_modalities() -> None:
    assert contract.TEXT_INPUTS == ("input_ids", "attention_mask", "token_type_ids")
    assert contract.IMAGE_INPUTS == ("pixel_values",)
    assert modality_of("text") is TEXT and modality_of("image") is IMAGE
    with pytest.raises(KeyError):
        modality_of("audio")


def test_text_example_inputs_are_seeded_ids_with_a_full_mask() -> None:
    loaded = tiny_bert()
    inputs = TEXT.example_inputs(loaded, 3, 7)
    assert tuple(inputs) == TEXT.inputs
    ids = inputs["input_ids"]
    assert ids.shape == (3, 7) and ids.dtype == torch.long
    assert int(ids.min()) >= 5 and int(ids.max()) < loaded.config.vocab_size
    assert bool((inputs["attention_mask"] == 1).all())
    assert bool((inputs["token_type_ids"] == 0).all())
    torch.testing.assert_close(TEXT.example_inputs(loaded, 3, 7)["input_ids"], ids)
    # the model runs on them, one row of logits per example
    with torch.inference_mode():
        assert loaded.model(**inputs).logits.shape == (3, len(loaded.labels))


def test_image_example_inputs_match_the_models_image_size() -> None:
    loaded = tiny_vit()
    inputs = IMAGE.example_inputs(loaded, 2, tokens=999)  # tokens do not apply to images
    size, channels = loaded.config.image_size, loaded.config.num_channels
    assert tuple(inputs) == IMAGE.inputs
    assert inputs["pixel_values"].shape == (2, channels, size, size)


def test_varying_axes_name_the_batch_and_for_text_the_sequence() -> None:
    assert TEXT.varying_axes("B", "T") == ({0: "B", 1: "T"}, {0: "B", 3: "T"})
    assert IMAGE.varying_axes("B", "T") == ({0: "B"}, {0: "B"})


def test_synthetic_batches_pad_texts_of_mixed_lengths_and_scale_images() -> None:
    text = synthetic_batch(tiny_bert(), count=6)
    mask = text["attention_mask"].numpy()
    assert set(text) >= {"input_ids", "attention_mask"}
    assert len(set(mask.sum(axis=1).tolist())) > 1  # mixed lengths: some rows are padded
    image = synthetic_batch(tiny_vit(), count=4)
    assert image["pixel_values"].shape[0] == 4
    assert np.isfinite(image["pixel_values"].numpy()).all()


def test_flops_do_not_depend_on_the_token_values() -> None:
    """model_flops counts on the modality's seeded ids; a count on other ids is the same."""
    from torch.utils.flop_counter import FlopCounterMode

    from uqcompress.engine.flops import TEXT_TOKENS, _cpu_attention_flops, model_flops
    from uqcompress.models.outputs import member_logits

    loaded = tiny_bert()
    tokens = min(TEXT_TOKENS, loaded.max_length or TEXT_TOKENS)
    ids = torch.full((1, tokens), 5, dtype=torch.long)
    other = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    other["token_type_ids"] = torch.zeros_like(ids)
    mapping = {}
    cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_sdpa is not None:
        mapping[cpu_sdpa] = _cpu_attention_flops
    with (
        torch.inference_mode(),
        FlopCounterMode(display=False, custom_mapping=mapping) as counter,
    ):
        member_logits(loaded.model.eval(), other)
    counted = model_flops(loaded)
    assert counted > 0
    assert counted == int(counter.get_total_flops())
