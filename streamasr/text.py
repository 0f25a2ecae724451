"""Text normalization and sentencepiece tokenizers.

Transcripts are normalized to lowercase words of letters, digits and apostrophes: the TTS
voices say no punctuation, so the model is not asked to guess it. WER uses the same
normalization. Translations keep case and punctuation (BLEU is computed on detokenized,
cased text).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

_NOT_WORD = re.compile(r"[^a-z0-9' ]+")
_SPACES = re.compile(r"\s+")


def normalize_transcript(text: str) -> str:
    """'A man, in an "orange" hat.' -> 'a man in an orange hat'."""
    text = _NOT_WORD.sub(" ", text.lower().replace("-", " "))
    text = " ".join(word.strip("'") for word in text.split())
    return _SPACES.sub(" ", text).strip()


class Tokenizer:
    """A sentencepiece model with the ids the model needs (blank/pad, bos, eos)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.sp = spm.SentencePieceProcessor(model_file=str(self.path))

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    @property
    def bos_id(self) -> int:
        return self.sp.bos_id()

    @property
    def eos_id(self) -> int:
        return self.sp.eos_id()

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode(list(ids))

    def encode_words(self, words: Iterable[str]) -> tuple[list[int], list[int]]:
        """Words -> piece ids and the position just after each word's pieces (its unit end)."""
        ids: list[int] = []
        ends: list[int] = []
        for word in words:
            ids += self.encode(word)
            ends.append(len(ids))
        return ids, ends

    def starts_word(self, token_id: int) -> bool:
        """True when the token opens a new word (sentencepiece's '▁' prefix)."""
        return self.sp.id_to_piece(token_id).startswith("\u2581")


def train_tokenizer(lines: Iterable[str], model_prefix: str | Path, vocab_size: int) -> Tokenizer:
    """Train a unigram sentencepiece model; id 0 is pad (also the CTC blank), 1 bos, 2 eos."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(list(lines)),
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        pad_id=0,
        bos_id=1,
        eos_id=2,
        unk_id=3,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return Tokenizer(f"{model_prefix}.model")
