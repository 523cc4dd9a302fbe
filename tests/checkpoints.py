"""Tiny checkpoints of every family as a user brings them: `save_pretrained` by transformers
itself, with a tokenizer of the family's own type trained offline with `tokenizers` (a
byte-level BPE for RoBERTa, a SentencePiece Unigram for XLM-RoBERTa, WordPiece for the BERT
kind) or the family's image processor. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import FILLER, NEGATIVE, POSITIVE, sentiment_rows

DECODER_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
TEXT_FAMILIES = ("bert", "roberta", "xlm-roberta", "distilbert", "electra", *DECODER_FAMILIES)
IMAGE_FAMILIES = ("vit", "deit", "dinov2")

# The tokenizer model each text family's checkpoints ship.
TOKENIZER_MODEL = {
    "bert": "wordpiece",
    "distilbert": "wordpiece",
    "electra": "wordpiece",
    "roberta": "bpe",
    "xlm-roberta": "unigram",
    **{family: "bpe" for family in DECODER_FAMILIES},
}
# Decoders pad on this side in their checkpoints' tokenizer config (uqc pads as it says).
PADDING_SIDE = {"llama": "left", "mistral": "left", "qwen2": "right", "qwen3": "right"}


def _corpus() -> list[str]:
    """Sentences covering every word of the sentiment task (tests/conftest.py)."""
    words = POSITIVE + NEGATIVE + FILLER
    return [text for text, _ in sentiment_rows(200, seed=11)] + [" ".join(words)] * 3


def family_tokenizer(family: str) -> Any:
    """A trained tokenizer of `family`'s type, wrapped in its transformers class."""
    import transformers
    from tokenizers import (
        BertWordPieceTokenizer,
        ByteLevelBPETokenizer,
        SentencePieceUnigramTokenizer,
        processors,
    )

    kind = TOKENIZER_MODEL[family]
    if kind == "wordpiece":
        wordpiece = BertWordPieceTokenizer(lowercase=True)
        special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        wordpiece.train_from_iterator(_corpus(), vocab_size=300, special_tokens=special)
        cls = {
            "bert": transformers.BertTokenizerFast,
            "distilbert": transformers.DistilBertTokenizerFast,
            "electra": transformers.ElectraTokenizerFast,
        }[family]
        return cls(tokenizer_object=wordpiece._tokenizer)
    roberta_special = dict(
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )
    special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's ids 0..4
    if family in DECODER_FAMILIES:  # byte-level BPE, no special tokens added to a text
        bpe = ByteLevelBPETokenizer()
        end = "<|endoftext|>"
        bpe.train_from_iterator(_corpus(), vocab_size=400, min_frequency=1, special_tokens=[end])
        cls = (
            transformers.Qwen2TokenizerFast
            if family.startswith("qwen")
            else (transformers.PreTrainedTokenizerFast)
        )
        tokenizer = cls(tokenizer_object=bpe, eos_token=end, pad_token=end, unk_token=None)
        tokenizer.padding_side = PADDING_SIDE[family]
        return tokenizer
    if kind == "bpe":
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(_corpus(), vocab_size=400, min_frequency=1, special_tokens=special)
        bpe.post_processor = processors.RobertaProcessing(
            ("</s>", bpe.token_to_id("</s>")), ("<s>", bpe.token_to_id("<s>"))
        )
        return transformers.RobertaTokenizerFast(tokenizer_object=bpe, **roberta_special)
    unigram = SentencePieceUnigramTokenizer()
    unigram.train_from_iterator(
        _corpus(), vocab_size=120, special_tokens=special, unk_token="<unk>"
    )
    unigram.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", unigram.token_to_id("<s>")), ("</s>", unigram.token_to_id("</s>"))],
    )
    return transformers.XLMRobertaTokenizer(tokenizer_object=unigram, **roberta_special)


def _image_processor(family: str, size: int) -> Any:
    """The family's image processor class, as its checkpoints ship it, for `size` pixels."""
    import transformers

    name = {"vit": "ViTImageProcessor", "deit": "DeiTImageProcessor", "dinov2": "BitImageProcessor"}
    return getattr(transformers, name[family])(
        do_resize=False,
        do_center_crop=False,
        size={"height": size, "width": size},
        image_mean=[0.5],
        image_std=[0.5],
    )


def save_family_checkpoint(
    family: str, directory: Path, labels: tuple[str, ...], seed: int = 0
) -> Path:
    """A tiny, untrained classifier of `family`, written by transformers' `save_pretrained`
    with its tokenizer or image processor: what `uqc import` gets from a user."""
    import torch

    from uqcompress.models.families import family_by_name

    family_impl = family_by_name(family)
    overrides: dict[str, Any] = {}
    tokenizer = None
    if family in TEXT_FAMILIES:
        tokenizer = family_tokenizer(family)
        overrides = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
        if family in ("roberta", "xlm-roberta"):  # positions start after the padding index
            overrides["max_position_embeddings"] = 128 + tokenizer.pad_token_id + 1
    config = family_impl.build_config("tiny", overrides, list(labels))
    config.architectures = [family_impl.classifier_class().__name__]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = family_impl.classifier_class()(config)
    model.save_pretrained(str(directory))
    if tokenizer is not None:
        tokenizer.model_max_length = 128
        tokenizer.save_pretrained(str(directory))
    else:
        _image_processor(family, int(config.image_size)).save_pretrained(str(directory))
    return directory
