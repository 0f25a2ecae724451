"""Synthetic accents: espeak-ng's phonemes rewritten by a seeded set of accent features.

espeak-ng has seven English accents; two are reserved (../shared/DATA.md) and one is the tuning
accent, so a corpus that wants accents no training voice has must make them. A synthetic accent
`~N` (a Kokoro voice's `kokoro:drawn-7@en-gb~3`) draws, by seed N, a few features from an
inventory common across Englishes (TH-stopping, a trilled or dropped r, vowel mergers and
monophthongs, w/v, final devoicing, h-dropping, ...) and applies them to every utterance the
voice reads: one accent per seed, the same on every line, as a speaker's would be.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass

VOWELS = "aeiouæɐɑɒɔəɚɛɜɪʊʌᵻɨ"
_WORD_END = r"(?=[\s.]|$)"
_AFTER_VOWEL = rf"(?<=[{VOWELS}ː])"
_BEFORE_NON_VOWEL = rf"(?=[^{VOWELS}ˈˌ]|$)"

# feature -> its variants; a variant is its substitutions (regex, replacement), every replacement
# made of symbols Kokoro's vocabulary has (tests/test_corpus.py checks). An accent's substitutions
# apply at once (one pass: a vowel one made is not remade by another), the features' order
# deciding between two that could start at one place: diphthongs and clusters first.
FEATURES: dict[str, tuple[tuple[tuple[str, str], ...], ...]] = {
    "face": ((("eɪ", "eː"),), (("eɪ", "aɪ"),)),
    "goat": ((("[oə]ʊ", "oː"),), (("[oə]ʊ", "ɔ"),)),
    "sh": ((("ʃ", "s"),), (("tʃ", "ʃ"),)),
    "voiceless th": ((("θ", "t"),), (("θ", "f"),), (("θ", "s"),)),
    "voiced th": ((("ð", "d"),), (("ð", "v"),), (("ð", "z"),)),
    "r": (
        (("ɹ", "r"), ("ɚ", "ər")),  # trilled
        (("ɹ", "ɾ"), ("ɚ", "əɾ")),  # tapped
        (("ɹ", "ʁ"), ("ɚ", "əʁ")),  # uvular
        ((f"ɹ{_BEFORE_NON_VOWEL}", ""), ("ɚ", "ə")),  # non-rhotic
    ),
    "trap": ((("æ", "a"),), (("æ", "ɛ"),)),
    "kit": ((("ɪ", "i"),), (("ɪ", "ə"),)),
    "foot": ((("ʊ", "u"),),),
    "strut": ((("ʌ", "a"),), (("ʌ", "ɔ"),), (("ʌ", "ʊ"),)),
    "lot": ((("ɑː?", "a"),), (("ɒ", "ɔ"),)),
    "schwa": ((("ə", "a"),), (("ə", "ɛ"),)),
    "w and v": ((("v", "w"),), (("w", "v"),), (("[vw]", "ʋ"),)),
    "final devoicing": (
        (
            (f"z{_WORD_END}", "s"),
            (f"d{_WORD_END}", "t"),
            (f"ɡ{_WORD_END}", "k"),
            (f"v{_WORD_END}", "f"),
        ),
    ),
    "h": ((("h", ""),),),
    "ng": (((f"ŋ{_WORD_END}", "n"),), (("ŋ", "ŋɡ"),)),
    "t": ((("ɾ", "t"),), ((f"{_AFTER_VOWEL}t{_WORD_END}", "ʔ"),)),
    "l": (((f"l{_WORD_END}", "w"),), ((f"{_AFTER_VOWEL}l{_WORD_END}", "o"),)),
}
FEATURE_PROB = 0.4  # each feature's chance of being in an accent


@dataclass(frozen=True)
class SyntheticAccent:
    """The features one seed drew, each with the variant it took."""

    seed: int
    features: tuple[tuple[str, int], ...]

    @classmethod
    def from_seed(cls, seed: int) -> SyntheticAccent:
        rng = random.Random(seed)
        drawn = []
        for name, variants in FEATURES.items():
            # both draws happen for every feature, so one feature's outcome never shifts another's
            present, variant = rng.random() < FEATURE_PROB, rng.randrange(len(variants))
            if present:
                drawn.append((name, variant))
        return cls(seed, tuple(drawn))

    @functools.cached_property
    def substitutions(self) -> list[tuple[str, str]]:
        return [sub for name, variant in self.features for sub in FEATURES[name][variant]]

    @functools.cached_property
    def _pattern(self) -> re.Pattern[str] | None:
        subs = self.substitutions
        return (
            re.compile("|".join(f"(?P<s{i}>{p})" for i, (p, _) in enumerate(subs)))
            if subs
            else None
        )

    def apply(self, ipa: str) -> str:
        """espeak-ng's IPA for a line, read in this accent."""
        if self._pattern is None:
            return ipa
        return self._pattern.sub(lambda m: self.substitutions[int(m.lastgroup[1:])][1], ipa)

    def __str__(self) -> str:
        return f"~{self.seed}: " + ", ".join(
            f"{name} {' '.join(f'{p}>{r or 0}' for p, r in FEATURES[name][variant])}"
            for name, variant in self.features
        )
