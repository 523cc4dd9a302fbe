"""The small WordPiece vocabulary shipped in the package, for BERT models made by `uqc init`.

It holds special tokens, characters, a few hundred common English and review words and a few
suffixes: enough for tests and toy tasks with no download. Real work imports a checkpoint
that carries its own tokenizer.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def shipped_vocab_path() -> Path:
    return Path(str(resources.files("uqcompress.models") / "assets" / "vocab.txt"))


@cache
def shipped_vocab_size() -> int:
    return sum(1 for line in shipped_vocab_path().read_text(encoding="utf-8").splitlines() if line)


def shipped_tokenizer(model_max_length: int) -> PreTrainedTokenizerBase:
    """A lower-casing BERT WordPiece tokenizer over the shipped vocabulary."""
    from transformers import BertTokenizer

    tokens = [t for t in shipped_vocab_path().read_text(encoding="utf-8").splitlines() if t]
    return BertTokenizer(
        vocab={token: index for index, token in enumerate(tokens)},
        do_lower_case=True,
        model_max_length=model_max_length,
    )
