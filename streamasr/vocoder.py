"""Re-synthesis through a parametric vocoder: training voices made to sound like statistical
parametric speech (HTS, clustergen) without ever hearing such a voice.

Each utterance is analysed by WORLD (f0 by DIO refined by StoneMask, CheapTrick spectral
envelope, D4C aperiodicity) and synthesized again from what a parametric synthesizer would have
kept of it: the envelope as a few cepstral dimensions, its variance around the utterance's mean
shrunk and its course smoothed over time (the over-smoothing of generated parameters), and a
smoothed f0 contour. Two vocoders speak it: WORLD itself (`world`: band aperiodicity, a smooth
mixed excitation) or the classic HTS one (`mlsa`: a mel-cepstrum through SPTK's MLSA filter,
excited by a pulse train where voiced and noise where not: buzzier). The draw of these per
utterance comes from a generator seeded by (seed, utterance id), so a corpus is the same for any
number of jobs and resumed runs.
"""

from __future__ import annotations

import importlib
import json
import logging
import random
import shutil
import tempfile
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import soundfile as sf
from numpy.lib.stride_tricks import sliding_window_view
from tqdm import tqdm

from .audio import audio_duration_ms
from .corpus import BuildSummary, CorpusError, write_manifest
from .voices import Voice, VoiceError

log = logging.getLogger(__name__)

FRAME_MS = 5.0  # WORLD's analysis hop


@dataclass(frozen=True)
class VocoderDraw:
    """What a parametric synthesizer keeps of an utterance."""

    envelope_dims: int = 40  # coded spectral envelope dimensions
    variance_scale: float = 1.0  # envelope deviation from the utterance mean is scaled by this
    smooth_frames: int = 1  # moving average of the coded envelope over this many 5 ms frames
    f0_median_frames: int = 1  # median filter of the voiced f0 contour
    vocoder: str = "world"  # or "mlsa"

    @classmethod
    def draw(cls, rng: random.Random, vocoder: str = "world") -> VocoderDraw:
        """The training range; `HELD_OUT` lies beyond it on every axis."""
        return cls(
            envelope_dims=rng.randint(28, 48),
            variance_scale=round(rng.uniform(0.7, 1.0), 3),
            smooth_frames=rng.choice((1, 3, 5)),
            f0_median_frames=rng.choice((1, 5, 9)),
            vocoder=vocoder,
        )


# A setting outside the training draw, for a tuning set that asks whether the model learned the
# kind of sound rather than the settings it heard.
HELD_OUT = VocoderDraw(envelope_dims=24, variance_scale=0.6, smooth_frames=7, f0_median_frames=9)


def _moving(frames: np.ndarray, size: int, reduce) -> np.ndarray:
    """`reduce` over a centred window of `size` frames along axis 0, edges repeated."""
    if size <= 1:
        return frames
    pad = [(size // 2, size - 1 - size // 2)] + [(0, 0)] * (frames.ndim - 1)
    windows = sliding_window_view(np.pad(frames, pad, mode="edge"), size, axis=0)
    return reduce(windows, axis=-1)


def _package(name: str):
    try:
        with warnings.catch_warnings():  # pyworld 0.3.5 and pysptk import pkg_resources
            warnings.simplefilter("ignore", UserWarning)
            return importlib.import_module(name)
    except ImportError as err:
        raise CorpusError(
            f"vocoding needs `pip install -e '.[tts]'` ({err.name} missing)"
        ) from None


def _oversmooth(frames: np.ndarray, draw: VocoderDraw) -> np.ndarray:
    """Cepstral frames as generated parameters: less variance about their mean, smoothed."""
    mean = frames.mean(axis=0, keepdims=True)
    frames = mean + (frames - mean) * draw.variance_scale
    return np.ascontiguousarray(_moving(frames, draw.smooth_frames, np.mean))


def vocode(audio: np.ndarray, sample_rate: int, draw: VocoderDraw) -> np.ndarray:
    """One utterance analysed and re-synthesized under `draw`, at the input's length and peak."""
    pw = _package("pyworld")
    x = np.ascontiguousarray(audio, dtype=np.float64)
    f0, times = pw.dio(x, sample_rate, frame_period=FRAME_MS)
    f0 = pw.stonemask(x, f0, times, sample_rate)
    envelope = pw.cheaptrick(x, f0, times, sample_rate)
    smooth_f0 = np.where(f0 > 0, _moving(f0, draw.f0_median_frames, np.median), 0.0)

    if draw.vocoder == "mlsa":
        sptk = _package("pysptk")
        from pysptk.synthesis import MLSADF, Synthesizer

        order, alpha = draw.envelope_dims - 1, sptk.util.mcepalpha(sample_rate)
        cepstrum = _oversmooth(sptk.sp2mc(envelope, order=order, alpha=alpha), draw)
        hop = round(sample_rate * FRAME_MS / 1000)
        period = np.where(smooth_f0 > 0, sample_rate / np.maximum(smooth_f0, 1.0), 0.0)
        # seeded Gaussian noise where unvoiced: SPTK's M-sequence carries state between calls
        pulses = sptk.excite(period, hop, gaussian=True, seed=1)
        synthesizer = Synthesizer(MLSADF(order=order, alpha=alpha), hop)
        y = synthesizer.synthesis(pulses, sptk.mc2b(cepstrum, alpha))
    else:
        fft_size = pw.get_cheaptrick_fft_size(sample_rate)
        coded = pw.code_spectral_envelope(envelope, sample_rate, draw.envelope_dims)
        envelope = pw.decode_spectral_envelope(_oversmooth(coded, draw), sample_rate, fft_size)
        bands = pw.code_aperiodicity(pw.d4c(x, f0, times, sample_rate), sample_rate)
        aperiodicity = pw.decode_aperiodicity(np.ascontiguousarray(bands), sample_rate, fft_size)
        y = pw.synthesize(smooth_f0, envelope, aperiodicity, sample_rate, FRAME_MS)
    y = y[: len(x)]  # both synthesize whole 5 ms frames, one more than the input fills
    peak = np.abs(y).max()
    y = y * (np.abs(x).max() / peak) if peak > 0 else y
    return y.astype(np.float32)


def _vocode_row(task: tuple[dict, Path, Path, str, int, str, VocoderDraw | None]) -> dict | None:
    """Vocode one source row into out_dir (skipped when already there); its manifest row, or
    None (logged) when its audio cannot be read or analysed."""
    try:
        return _vocode_one(*task)
    except (OSError, RuntimeError, ValueError) as err:
        log.warning("%s/%s failed: %s", task[1], task[0].get("id"), err)
        return None


def _vocode_one(
    row: dict,
    source_dir: Path,
    out_dir: Path,
    split: str,
    seed: int,
    vocoder: str,
    fixed: VocoderDraw | None,
) -> dict:
    rid = f"{source_dir.name}-{row['id']}"
    if fixed is not None:
        draw = replace(fixed, vocoder=vocoder)
    else:
        draw = VocoderDraw.draw(random.Random(f"{seed}:{rid}"), vocoder)
    audio = f"wav/{split}/{rid}.flac"
    target = out_dir / audio
    if not target.exists():
        source = Path(row["audio"])
        x, sample_rate = sf.read(source if source.is_absolute() else source_dir / source)
        y = vocode(x if x.ndim == 1 else x.mean(axis=1), sample_rate, draw)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(suffix=".flac", dir=target.parent, delete=False) as f:
            sf.write(f.name, y, sample_rate, subtype="PCM_16")
        shutil.move(f.name, target)
    out = {key: value for key, value in row.items() if key not in ("id", "audio", "duration_ms")}
    out = {"id": rid, "audio": audio, **out, "voice": f"{vocoder}:{row.get('voice', 'unknown')}"}
    out["duration_ms"] = round(audio_duration_ms(target), 1)
    out["vocoder"] = asdict(draw)
    return out


def read_source(manifest: Path, limit: int | None, seed: int) -> list[dict]:
    """Rows of a source manifest, `limit` of them drawn by `seed`; refuses reserved voices."""
    if not manifest.is_file():
        raise CorpusError(f"{manifest}: no such manifest")
    rows = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines() if line]
    for row in rows:
        try:
            voice = Voice.parse(str(row.get("voice", "")))
        except VoiceError:
            raise CorpusError(
                f"{manifest}: row {row.get('id')} names no training voice ({row.get('voice')!r})"
            ) from None
        if voice.is_reserved:
            raise CorpusError(f"{manifest}: {voice} is reserved for evaluation and cannot be used")
    if limit is not None and limit < len(rows):
        chosen = random.Random(f"{seed}:{manifest.parent.name}").sample(range(len(rows)), limit)
        rows = [rows[i] for i in sorted(chosen)]
    return rows


def vocode_corpus(
    sources: list[tuple[Path, list[dict]]],
    out_dir: Path,
    split: str,
    seed: int,
    jobs: int,
    summary: BuildSummary,
    fixed: VocoderDraw | None = None,
    vocoder: str = "world",
) -> Path:
    """Vocode every source row into out_dir/SPLIT.jsonl (in parallel, resuming), counted into
    summary; the manifest."""
    tasks = [
        (row, manifest.parent, out_dir, split, seed, vocoder, fixed)
        for manifest, rows in sources
        for row in rows
    ]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        done = pool.map(_vocode_row, tasks, chunksize=8)
        rows = list(tqdm(done, total=len(tasks), desc=split, unit="utt", dynamic_ncols=True))
    manifest = out_dir / f"{split}.jsonl"
    write_manifest(manifest, rows, summary)
    return manifest
