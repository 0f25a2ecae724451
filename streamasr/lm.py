"""A word n-gram language model of English transcripts, for CTC beam search.

Interpolated Kneser-Ney (Chen & Goodman 1998, one discount per order), written as an ARPA
file that KenLM loads (KenLM ships inside flashlight-text, the decoder torchaudio wraps). PyPI
has no n-gram estimator that writes ARPA (KenLM's lmplz is a C++ tool outside its Python
module), so the estimate is made here; it is small: the counts of a few hundred thousand words.

In ARPA form an interpolated model is exact: a seen n-gram stores its interpolated
probability, a context stores its interpolation weight as the back-off weight, and an unseen
word gets back-off(h) * p(w | shorter h), which is the interpolated value.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from .text import Tokenizer, normalize_transcript

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
Ngram = tuple[str, ...]


def _adjusted_counts(sentences: Iterable[list[str]], order: int) -> list[Counter[Ngram]]:
    """Kneser-Ney counts per order (index n-1): raw counts for the top order and for n-grams
    that start with <s> (nothing can precede them), else the number of distinct left words."""
    raw: list[Counter[Ngram]] = [Counter() for _ in range(order)]
    for words in sentences:
        padded = [BOS, *words, EOS]
        for i in range(1, len(padded)):
            for n in range(1, min(order, i + 1) + 1):
                raw[n - 1][tuple(padded[i - n + 1 : i + 1])] += 1
    counts: list[Counter[Ngram]] = [Counter() for _ in range(order - 1)] + [raw[-1]]
    for n in range(1, order):
        for gram, c in raw[n - 1].items():
            if gram[0] == BOS:
                counts[n - 1][gram] = c
        for longer in raw[n]:
            if longer[1] != BOS:
                counts[n - 1][longer[1:]] += 1
    return counts


def _discount(counts: Counter[Ngram]) -> float:
    n1 = sum(1 for c in counts.values() if c == 1)
    n2 = sum(1 for c in counts.values() if c == 2)
    return n1 / (n1 + 2 * n2) if n1 and n2 else 0.5


def build_arpa(sentences: Iterable[list[str]], path: str | Path, order: int = 3) -> dict[int, int]:
    """Estimate an interpolated Kneser-Ney model of word lists; write it as ARPA.
    Returns the number of n-grams per order."""
    counts = _adjusted_counts(sentences, order)
    vocab = sorted({g[0] for g in counts[0]} | {EOS, UNK})
    prob: list[dict[Ngram, float]] = [{} for _ in range(order)]
    backoff: list[dict[Ngram, float]] = [{} for _ in range(order)]
    for n in range(1, order + 1):
        grams = counts[n - 1]
        d = _discount(grams)
        totals: defaultdict[Ngram, float] = defaultdict(float)
        types: Counter[Ngram] = Counter()
        for gram, c in grams.items():
            totals[gram[:-1]] += c
            types[gram[:-1]] += 1
        for context, total in totals.items():
            gamma = d * types[context] / total
            if n == 1:
                uniform = gamma / len(vocab)
                for word in vocab:
                    c = grams.get((word,), 0)
                    prob[0][(word,)] = max(c - d, 0) / total + uniform
            else:
                backoff[n - 2][context] = gamma
        if n > 1:
            for gram, c in grams.items():
                context = gram[:-1]
                lower = prob[n - 2][gram[1:]]
                prob[n - 1][gram] = (
                    max(c - d, 0) / totals[context] + backoff[n - 2][context] * lower
                )
    prob[0][(BOS,)] = 0.0  # never predicted; a context only
    backoff[0].setdefault((BOS,), 1.0)
    _write_arpa(path, prob, backoff)
    return {n + 1: len(p) for n, p in enumerate(prob)}


def _write_arpa(path: str | Path, prob: list[dict], backoff: list[dict]) -> None:
    def log10(x: float) -> str:
        return f"{math.log10(x):.6f}" if x > 0 else "-99"

    with open(path, "w", encoding="utf-8") as f:
        f.write("\\data\\\n")
        for n, p in enumerate(prob, start=1):
            f.write(f"ngram {n}={len(p)}\n")
        for n, p in enumerate(prob, start=1):
            f.write(f"\n\\{n}-grams:\n")
            for gram in sorted(p):
                line = f"{log10(p[gram])}\t{' '.join(gram)}"
                if n < len(prob) and gram in backoff[n - 1]:
                    line += f"\t{log10(backoff[n - 1][gram])}"
                f.write(line + "\n")
        f.write("\n\\end\\\n")


LM_FILE, LEXICON_FILE = "lm.arpa", "lexicon.txt"


def build_transcript_lm(texts: Iterable[str], en: Tokenizer, folder: Path, order: int = 3) -> dict:
    """The model folder's word LM of normalized transcripts and its lexicon (each LM word
    spelled in the transcript tokenizer's pieces). Returns n-gram counts per order."""
    sentences = [normalize_transcript(text).split() for text in texts]
    sizes = build_arpa(sentences, folder / LM_FILE, order)
    words = sorted({w for s in sentences for w in s})
    with open(folder / LEXICON_FILE, "w", encoding="utf-8") as f:
        for word in words:
            pieces = en.sp.encode(word, out_type=str)
            if en.sp.unk_id() not in en.sp.piece_to_id(pieces):
                f.write(f"{word}\t{' '.join(pieces)}\n")
    return sizes
