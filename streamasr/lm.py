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
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from .text import Tokenizer, normalize_transcript

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
WORD_BOOST = 8.0  # `--words`' default bonus, log10 of LM probability (README, Use)
_LETTERS = re.compile(r"[a-z]+(?:'[a-z]+)?")
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


def build_arpa(
    sentences: Iterable[list[str]],
    path: str | Path,
    order: int = 3,
    prior: Mapping[str, float] | None = None,
) -> dict[int, int]:
    """Estimate an interpolated Kneser-Ney model of word lists; write it as ARPA.
    Returns the number of n-grams per order.

    The unigrams' interpolation mass (what the discount frees: the chance of a word not seen
    in this position) goes to a base distribution over the vocabulary, uniform without a
    `prior` (word -> relative frequency in general text). With one, the prior's words join the
    vocabulary and those the sentences lack are weighted by it (`_base_distribution`): an open
    vocabulary whose unseen words rank by how common they are."""
    counts = _adjusted_counts(sentences, order)
    seen = {g[0] for g in counts[0]} | {EOS, UNK}
    vocab = sorted(seen | set(prior or ()))
    base = _base_distribution(seen, vocab, prior)
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
                for word in vocab:
                    c = grams.get((word,), 0)
                    prob[0][(word,)] = max(c - d, 0) / total + gamma * base[word]
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


def _base_distribution(
    seen: set[str], vocab: list[str], prior: Mapping[str, float] | None
) -> dict[str, float]:
    """Uniform over the vocabulary; with a prior, its words not seen in training take the share
    of the prior's mass that falls on them, each in proportion to its frequency, and the seen
    words (and </s>, <unk>) share the rest evenly, as they shared all of it without one."""
    new = [word for word in vocab if word not in seen] if prior else []
    if not new:
        return dict.fromkeys(vocab, 1 / len(vocab))
    total = sum(prior.get(word, 0.0) for word in vocab)
    base = {word: prior[word] / total for word in new}
    rest = (1 - sum(base.values())) / (len(vocab) - len(new))
    return {word: base.get(word, rest) for word in vocab}


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


def english_word_frequencies(n: int) -> dict[str, float]:
    """The n most common English words and their frequencies in general text (wordfreq's
    large list: Wikipedia, subtitles, news, books, web text, ...), words of letters (and an
    apostrophe) only: wordfreq writes every digit as 0."""
    try:
        import wordfreq
    except ImportError:
        raise ImportError(
            "an open vocabulary needs wordfreq: pip install 'streamasr[lm]'"
        ) from None
    words = wordfreq.top_n_list("en", n, wordlist="large")
    return {
        word: wordfreq.word_frequency(word, "en", wordlist="large")
        for word in words
        if _LETTERS.fullmatch(word)
    }


def build_transcript_lm(
    texts: Iterable[str],
    en: Tokenizer,
    folder: Path,
    order: int = 3,
    prior: Mapping[str, float] | None = None,
) -> tuple[dict[int, int], int, list[str]]:
    """The model folder's word LM of normalized transcripts and its lexicon (each LM word
    spelled in the transcript tokenizer's pieces); `prior`: general word frequencies that open
    the vocabulary (`build_arpa`). Returns the n-gram counts per order, the lexicon's size and
    the words it lacks because the pieces cannot spell them (characters the tokenizer never saw;
    the LM keeps them, the search never reaches them)."""
    sentences = [normalize_transcript(text).split() for text in texts]
    prior = {w: f for w, f in (prior or {}).items() if normalize_transcript(w) == w and w}
    sizes = build_arpa(sentences, folder / LM_FILE, order, prior)
    words = sorted({w for s in sentences for w in s} | set(prior))
    spelled, unspelled = 0, []
    with open(folder / LEXICON_FILE, "w", encoding="utf-8") as f:
        for word in words:
            pieces = spell(word, en)
            if pieces is None:
                unspelled.append(word)
            else:
                f.write(f"{word}\t{' '.join(pieces)}\n")
                spelled += 1
    return sizes, spelled, unspelled


def spell(word: str, en: Tokenizer) -> list[str] | None:
    """A word in the transcript tokenizer's pieces (a lexicon entry); None if a piece is unknown."""
    pieces = en.sp.encode(word, out_type=str)
    return None if en.sp.unk_id() in en.sp.piece_to_id(pieces) else pieces


def boost_arpa(src: str | Path, dst: str | Path, boost: Mapping[str, float]) -> None:
    """Copy an ARPA LM with `boost[w]` (log10) added to w's probability in every context: to each
    n-gram that ends in w, and so to every back-off path, which ends in w's unigram. A word the
    LM lacks enters as a unigram as likely as its rarest word, before the boost. Probabilities
    stay at most 1 (KenLM refuses more) and are not renormalized: the boost is a bonus in the
    search, as word boosting is in other CTC decoders."""
    lines = Path(src).read_text(encoding="utf-8").splitlines()
    if "\\1-grams:" not in lines:
        raise ValueError(f"{src}: no \\1-grams: section (not an ARPA file)")
    start = lines.index("\\1-grams:") + 1
    unigrams = [line.split("\t") for line in lines[start : lines.index("", start)]]
    known = {fields[1] for fields in unigrams}
    rarest = min(float(fields[0]) for fields in unigrams if fields[1] not in (BOS, UNK))
    new = [word for word in boost if word not in known]

    def boosted(line: str) -> str:
        fields = line.split("\t")
        word = fields[1].rsplit(" ", 1)[-1] if len(fields) > 1 else None
        if word not in boost:
            return line
        return "\t".join([f"{min(0.0, float(fields[0]) + boost[word]):.6f}", *fields[1:]])

    out = []
    for i, line in enumerate(lines):
        if line.startswith("ngram 1="):
            line = f"ngram 1={int(line.split('=')[1]) + len(new)}"
        if i == start:
            out += [f"{min(0.0, rarest + boost[word]):.6f}\t{word}\t0" for word in new]
        out.append(boosted(line))
    Path(dst).write_text("\n".join(out) + "\n", encoding="utf-8")


def parse_word_boosts(text: str) -> dict[str, float]:
    """`--words FILE`: a word or phrase per line, optionally followed by its bonus (log10 of LM
    probability, default WORD_BOOST); blank lines and lines from # on are skipped. Words are
    normalized as transcripts are; a word named twice keeps its last bonus."""
    boost = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        bonus = WORD_BOOST
        if len(fields) > 1:
            try:
                bonus = float(fields[-1])
                fields = fields[:-1]
            except ValueError:
                pass
        if not math.isfinite(bonus):
            raise ValueError(f"line {number}: the bonus must be a finite number")
        for word in normalize_transcript(" ".join(fields)).split():
            boost[word] = bonus
    if not boost:
        raise ValueError("no words in it")
    return boost
