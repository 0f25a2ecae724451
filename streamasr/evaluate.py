"""Wait-k evaluation: the user's Session over a manifest, quality and latency per k.

Quality: WER (jiwer, normalized transcripts), BLEU and chrF (sacrebleu, detokenized, cased).
Latency: SimulEval's word-level AL, LAAL, DAL, AP, StartOffset, EndOffset, ATD from `delay_ms`,
their compute-aware twins from `elapsed_ms`, the transcript's emission delay per word
(emitted - word end in the audio) and its partial-caption twin (shown from - word end), and the
real-time factor.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import jiwer
import numpy as np
import sacrebleu
import torch
import torchaudio.functional as AF
from tqdm import tqdm

from .audio import in_room, load_audio, ms_to_samples
from .bundle import Bundle
from .decoding import BeamOptions, CtcBeamSearch, TranslationSearch, ctc_greedy_tokens
from .features import LogMel
from .manifest import Utterance, read_manifest
from .metrics import corpus_latency, instance_latency
from .runner import run_stream
from .session import Event, Session, SessionOptions
from .sources import FileSource
from .text import normalize_transcript


@dataclass(frozen=True)
class Instance:
    id: str
    wait_k: int | str
    transcript: str
    translation: str
    text_ref: str | None
    translation_ref: str | None
    source_ms: float
    delays_ms: list[float]
    elapsed_ms: list[float]
    transcript_word_ms: list[float]
    compute_ms: float
    emission_delays_ms: list[float]  # per matched transcript word: emitted - word end
    shown_word_ms: list[float]  # per transcript word: shown from (partial_captions)
    shown_delays_ms: list[float]  # per matched transcript word: shown from - word end
    partial_changes: int  # words the partial captions showed, then replaced or withdrew
    full_context_transcript: str  # the same model and search without chunking
    voice: str | None = None  # the manifest's speaker, if it names one


@dataclass(frozen=True)
class FullContext:
    """One full-context pass over a file: the model's offline transcript and reference word ends."""

    transcript: str
    word_ends_ms: list[float]  # end of each reference word, by CTC forced alignment


@dataclass(frozen=True)
class Playback:
    """What each file goes through before the session hears it: `lead_silence_ms` of digital
    silence before it (a sentence after a pause, as in a live stream; part of the source, so
    latencies count from the start of the silence), then, with `room` (RT60 in seconds,
    direct-to-reverberant ratio in dB), a synthetic room of its own (`audio.in_room`)."""

    lead_silence_ms: int = 0
    room: tuple[float, float] | None = None

    def audio(self, utt: Utterance) -> np.ndarray:
        lead = np.zeros(ms_to_samples(self.lead_silence_ms), dtype=np.float32)
        audio = np.concatenate([lead, load_audio(utt.audio)])
        return audio if self.room is None else in_room(audio, *self.room, seed=utt.id)

    def describe(self) -> str:
        """', each after N ms of silence, in a room of ...' (empty for the files as they are)."""
        text = f", each after {self.lead_silence_ms} ms of silence" if self.lead_silence_ms else ""
        if self.room is not None:
            text += f", in a room of RT60 {self.room[0]:g} s, DRR {self.room[1]:g} dB"
        return text


def ctc_log_probs(bundle: Bundle, audio: np.ndarray, chunk_frames: int) -> torch.Tensor:
    """(1, T, V) CTC log-probs of a whole file: under the chunk mask they equal the streaming
    encoder's (tested); chunk_frames=-1 is full context."""
    feats = bundle.stats.normalize(LogMel(bundle.config.feature_config())(torch.from_numpy(audio)))
    with torch.inference_mode():
        _, log_probs = bundle.model.encode_transcript(
            feats[None], torch.tensor([feats.shape[0]]), chunk_frames
        )
        return log_probs


def full_context_pass(
    bundle: Bundle, audio: np.ndarray, text: str | None, beam: BeamOptions | None
) -> FullContext:
    """The whole utterance at once: its transcript (the same search as the session's) and
    the reference words' end times by forced alignment."""
    log_probs = ctc_log_probs(bundle, audio, chunk_frames=-1)
    search = bundle.beam_search(beam)
    if search is not None:
        transcript = " ".join(search.decode(log_probs[0]))
    else:
        transcript = bundle.en.decode(ctc_greedy_tokens(log_probs[0]))
    return FullContext(transcript, word_ends_ms(bundle, log_probs, text or ""))


@dataclass(frozen=True)
class TuneResult:
    options: BeamOptions | None  # None: greedy search
    wer: float
    delay_ms: float | None  # mean emission delay of correct words (beam settings only)
    search_s: float | None = None  # wall time of the search over all utterances (beam only)


def tune_beam(
    bundle: Bundle,
    utterances: list[Utterance],
    chunk_ms: int,
    grid: list[BeamOptions],
    playback: Playback = Playback(),
) -> list[TuneResult]:
    """WER of greedy search and of each beam setting on streaming log-probs (computed once),
    and each setting's emission delay: the search is stepped chunk by chunk as in a session,
    a word counting as emitted at the end of its chunk's audio. `playback` (default: the files
    as they are) is what each file goes through first, e.g. a synthetic room."""
    chunk_frames = bundle.config.chunk_frames(chunk_ms)
    refs, log_probs, ends = [], [], []
    for utt in tqdm(utterances, desc="encode", unit="utt"):
        lp = ctc_log_probs(bundle, playback.audio(utt), chunk_frames)
        log_probs.append(lp[0])
        refs.append(normalize_transcript(utt.text or ""))
        ends.append(word_ends_ms(bundle, lp, utt.text or ""))
    greedy = [normalize_transcript(bundle.en.decode(ctc_greedy_tokens(lp))) for lp in log_probs]
    rows = [TuneResult(None, 100 * jiwer.wer(refs, greedy), None)]
    for options in tqdm(grid, desc="search", unit="setting"):
        search = bundle.beam_search(options)
        started = time.perf_counter()
        timed = [
            _stream_search(search, lp, chunk_frames, bundle.config.frame_ms) for lp in log_probs
        ]
        search_s = time.perf_counter() - started
        hyps, delays = [], []
        for words_ms, ref, ref_ends in zip(timed, refs, ends):
            words = [word for word, _ in words_ms]
            hyps.append(" ".join(words))
            delays += emission_delays(words, [ms for _, ms in words_ms], ref.split(), ref_ends)
        mean_delay = sum(delays) / len(delays) if delays else None
        rows.append(TuneResult(options, 100 * jiwer.wer(refs, hyps), mean_delay, search_s))
    return rows


def _stream_search(
    search: CtcBeamSearch, log_probs: torch.Tensor, chunk_frames: int, frame_ms: int
) -> list[tuple[str, float]]:
    """(T, V) log-probs searched chunk by chunk as a session would: each word with the audio
    read when it was emitted (its chunk's end)."""
    search.begin()
    timed = []
    for t in range(0, log_probs.shape[0], chunk_frames):
        chunk_end_ms = min(t + chunk_frames, log_probs.shape[0]) * frame_ms
        timed += [(word, chunk_end_ms) for word in search.step(log_probs[t : t + chunk_frames])]
    return timed + [(word, log_probs.shape[0] * frame_ms) for word in search.end()]


def word_ends_ms(bundle: Bundle, log_probs: torch.Tensor, text: str) -> list[float]:
    """End time of each reference word, by CTC forced alignment on (1, T, V) log-probs."""
    words = normalize_transcript(text).split()
    tokens_per_word = [bundle.en.encode(w) for w in words]
    targets = torch.tensor([[t for toks in tokens_per_word for t in toks]], dtype=torch.int32)
    if targets.shape[1] == 0 or targets.shape[1] > log_probs.shape[1]:
        return []
    labels, _ = AF.forced_align(log_probs, targets, blank=0)
    spans = AF.merge_tokens(labels[0], torch.zeros(labels.shape[1]))
    ends, index = [], 0
    for toks in tokens_per_word:
        index += len(toks)
        ends.append(spans[index - 1].end * bundle.config.frame_ms)
    return ends


def emission_delays(
    hyp_words: list[str], hyp_ms: list[float], ref_words: list[str], ref_end_ms: list[float]
) -> list[float]:
    """Emission delay of each hypothesis word that matches its aligned reference word."""
    if not hyp_words or not ref_words or len(ref_end_ms) != len(ref_words):
        return []
    out = jiwer.process_words(" ".join(ref_words), " ".join(hyp_words))
    delays = []
    for chunk in out.alignments[0]:
        if chunk.type == "equal":
            for offset in range(chunk.ref_end_idx - chunk.ref_start_idx):
                delays.append(
                    hyp_ms[chunk.hyp_start_idx + offset] - ref_end_ms[chunk.ref_start_idx + offset]
                )
    return delays


def partial_captions(events: list[Event]) -> tuple[list[float], int]:
    """What a reader of the partial captions (a segment's committed words, then its latest
    partial) saw. Per committed transcript word, in order: the delay_ms from which they showed it
    in its place without a change until it was committed (its commit's, when they did not show it
    before); and how many times they replaced or withdrew a word they showed."""
    shown: list[float] = []
    changes = 0
    segment, committed, display, since = None, [], [], []  # since: when each display word came
    for (seg, delay_ms), chunk in itertools.groupby(events, key=lambda e: (e.segment, e.delay_ms)):
        if seg != segment:
            segment, committed, display, since = seg, [], [], []
        partial = None  # this chunk's tentative words, when it changed them
        for e in chunk:
            if e.type == "transcript":
                for word in e.text.split():
                    i = len(committed)
                    shown.append(since[i] if i < len(display) and display[i] == word else delay_ms)
                    committed.append(word)
                partial = []  # committed words clear the partial; a partial event follows them
            elif e.type == "partial":
                partial = e.text.split()
        if partial is not None:
            new = committed + partial
            changes += sum(1 for i, w in enumerate(display) if i >= len(new) or new[i] != w)
            since = [
                since[i] if i < len(display) and display[i] == w else delay_ms
                for i, w in enumerate(new)
            ]
            display = new
    return shown, changes


def run_instance(
    bundle: Bundle,
    utt: Utterance,
    audio: np.ndarray,
    options: SessionOptions,
    offline: FullContext,
) -> Instance:
    """One utterance streamed through a fresh Session with `options` (translating only when the
    utterance has a reference translation)."""
    source = FileSource(utt.audio, audio=audio)
    options = replace(options, translate=utt.translation is not None, partials=True)
    session = Session(bundle, options, stream=utt.id, clock="virtual")
    events: list[Event] = []
    run_stream(session, source, events.extend)
    hyp_words = [w.text for w in session.transcript_words]
    hyp_ms = [w.delay_ms for w in session.transcript_words]
    shown, changes = partial_captions(events)
    # a word is shown at its commit at the latest (greedy words carry their last piece's time)
    shown = [min(s, ms) for s, ms in zip(shown, hyp_ms, strict=True)]
    ref_words = normalize_transcript(utt.text or "").split()
    return Instance(
        id=utt.id,
        wait_k="inf" if options.wait_k is None else options.wait_k,
        transcript=" ".join(hyp_words),
        translation=" ".join(w.text for w in session.translation_words),
        text_ref=utt.text,
        translation_ref=utt.translation,
        source_ms=source.duration_ms,
        delays_ms=[w.delay_ms for w in session.translation_words],
        elapsed_ms=[w.elapsed_ms for w in session.translation_words],
        transcript_word_ms=hyp_ms,
        compute_ms=sum(session.chunk_compute_ms),
        emission_delays_ms=emission_delays(hyp_words, hyp_ms, ref_words, offline.word_ends_ms),
        shown_word_ms=shown,
        partial_changes=changes,
        shown_delays_ms=emission_delays(hyp_words, shown, ref_words, offline.word_ends_ms),
        full_context_transcript=offline.transcript,
        voice=utt.voice,
    )


def transcript_wer(instances: list[Instance]) -> dict:
    """WER % of the streamed and of the full-context transcripts over the instances with a
    reference transcript (None without any), and how many those are."""
    with_text = [i for i in instances if i.text_ref is not None]
    refs = [normalize_transcript(i.text_ref) for i in with_text]
    hyps = [normalize_transcript(i.transcript) for i in with_text]
    offline = [normalize_transcript(i.full_context_transcript) for i in with_text]
    return {
        "utterances": len(with_text),
        "wer": 100 * jiwer.wer(refs, hyps) if refs else None,
        "wer_full_context": 100 * jiwer.wer(refs, offline) if refs else None,
    }


def wer_by_voice(instances: list[Instance]) -> dict[str, dict]:
    """transcript_wer per voice named in the manifest, voices sorted by name."""
    voices = sorted({i.voice for i in instances if i.voice is not None})
    return {v: transcript_wer([i for i in instances if i.voice == v]) for v in voices}


def first_words_wrong(instances: list[Instance]) -> dict:
    """How many utterances begin with a wrong (or missing) word, streamed and in full context:
    the sentence's start is where streaming loses most (a quarter to a half of the word errors
    streaming adds, with run 11's weights; model card)."""

    def first(text: str | None) -> list[str]:
        return normalize_transcript(text or "").split()[:1]

    refs = [(i, first(i.text_ref)) for i in instances]
    with_text = [(i, ref) for i, ref in refs if ref]
    return {
        "utterances": len(with_text),
        "streaming": sum(first(i.transcript) != ref for i, ref in with_text),
        "full_context": sum(first(i.full_context_transcript) != ref for i, ref in with_text),
    }


def summarize(instances: list[Instance], wait_k: int | str) -> dict:
    wer = transcript_wer(instances)
    run: dict = {
        "wait_k": wait_k,
        "wer": wer["wer"],
        "wer_full_context": wer["wer_full_context"],
        "bleu": None,
        "chrf": None,
    }
    with_translation = [i for i in instances if i.translation_ref is not None]
    if with_translation:
        hyp_de = [i.translation for i in with_translation]
        ref_de = [[i.translation_ref for i in with_translation]]
        run["bleu"] = sacrebleu.corpus_bleu(hyp_de, ref_de).score
        run["chrf"] = sacrebleu.corpus_chrf(hyp_de, ref_de).score
    run.update(
        corpus_latency(
            [(i.delays_ms, i.source_ms, i.translation_ref, i.elapsed_ms) for i in with_translation]
        )
    )
    run["asr_delay_ms"] = _delay_stats([d for i in instances for d in i.emission_delays_ms])
    run["asr_partial_delay_ms"] = _delay_stats([d for i in instances for d in i.shown_delays_ms])
    words = sum(len(i.shown_word_ms) for i in instances)
    changes = sum(i.partial_changes for i in instances)
    run["asr_partial_changes_per_word"] = changes / words if words else None
    audio_ms = sum(i.source_ms for i in instances)
    run["rtf"] = sum(i.compute_ms for i in instances) / audio_ms if audio_ms else None
    return run


def _delay_stats(delays: list[float]) -> dict:
    if not delays:
        return {"mean": None, "p50": None, "p90": None}
    return {
        "mean": statistics.fmean(delays),
        "p50": float(np.percentile(delays, 50)),
        "p90": float(np.percentile(delays, 90)),
    }


PARTIAL_FILE = "instances.partial.jsonl"  # in an eval's --out folder while it runs


class InstanceLog:
    """The instances an eval has finished, each appended and flushed as it completes, so that an
    eval stopped midway resumes where it stopped. The first line holds the eval's settings: a
    log of other settings is started afresh, never mixed in."""

    def __init__(self, path: Path, settings: dict):
        self.path = path
        self.done: dict[tuple[str, str], Instance] = {}
        header = json.dumps(settings, sort_keys=True)
        if path.is_file():
            lines = path.read_text(encoding="utf-8").splitlines()
            for line in lines[1:] if lines[:1] == [header] else []:
                try:
                    ins = Instance(**json.loads(line))
                except (json.JSONDecodeError, TypeError):
                    break  # the line being written when the eval stopped
                self.done[(ins.id, str(ins.wait_k))] = ins
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "w", encoding="utf-8")  # what was read, without a cut last line
        self.file.write(header + "\n")
        for ins in self.done.values():
            self.add(ins)

    def get(self, utt_id: str, wait_k: int | None) -> Instance | None:
        return self.done.get((utt_id, "inf" if wait_k is None else str(wait_k)))

    def add(self, ins: Instance) -> None:
        self.file.write(json.dumps(asdict(ins), ensure_ascii=False) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()

    def remove(self) -> None:
        """The eval's outputs are written: the log has served."""
        self.close()
        self.path.unlink(missing_ok=True)


def eval_settings(
    model_dir: Path,
    manifest: Path,
    limit: int | None,
    wait_ks: list[int | None],
    options: SessionOptions,
    playback: Playback,
) -> dict:
    """What an eval's instances depend on: the bytes of the model folder (but its card) and of
    the manifest, the utterance count, every k, session option and playback setting."""

    def digest(paths: list[Path]) -> str:
        sha = hashlib.sha256()
        for path in paths:
            sha.update(path.name.encode() + path.read_bytes())
        return sha.hexdigest()

    return {
        "model": digest(
            sorted(p for p in model_dir.iterdir() if p.is_file() and p.suffix != ".md")
        ),
        "manifest": digest([manifest]),
        "limit": limit,
        "wait_ks": ["inf" if k is None else k for k in wait_ks],
        "options": asdict(options),
        "playback": asdict(playback),
    }


def evaluate(
    bundle: Bundle,
    utterances: list[Utterance],
    wait_ks: list[int | None],
    options: SessionOptions,
    playback: Playback = Playback(),
    log: InstanceLog | None = None,
) -> tuple[list[dict], list[Instance]]:
    """Every (utterance, k) through a fresh Session with `options` (its wait_k replaced by each
    k); returns the per-k runs and all instances. With `log`, the instances it holds are taken
    as they are and each new one is added to it.

    Each file, as `playback` gives it, is decoded in full context and its reference words
    aligned once, then streamed once per k.
    """
    per_k: dict[int | None, list[Instance]] = {k: [] for k in wait_ks}
    kept = {} if log is None else log.done
    with tqdm(
        total=len(utterances) * len(wait_ks), initial=len(kept), desc="eval", unit="run"
    ) as bar:
        for utt in utterances:
            logged = {k: log and log.get(utt.id, k) for k in wait_ks}
            if not all(logged.values()):
                audio = playback.audio(utt)
                offline = full_context_pass(bundle, audio, utt.text, options.beam)
            for k in wait_ks:
                ins = logged[k]
                if ins is None:
                    ins = run_instance(bundle, utt, audio, replace(options, wait_k=k), offline)
                    if log is not None:
                        log.add(ins)
                    bar.update(1)
                per_k[k].append(ins)
    runs = [summarize(instances, "inf" if k is None else k) for k, instances in per_k.items()]
    return runs, [ins for instances in per_k.values() for ins in instances]


def instance_json(ins: Instance) -> dict:
    return {
        "id": ins.id, "wait_k": ins.wait_k, "transcript": ins.transcript, "translation": ins.translation,
        "text_ref": ins.text_ref, "translation_ref": ins.translation_ref, "source_ms": ins.source_ms,
        "delays_ms": ins.delays_ms, "elapsed_ms": [round(e, 1) for e in ins.elapsed_ms],
        "transcript_word_ms": ins.transcript_word_ms, "transcript_word_shown_ms": ins.shown_word_ms,
        "full_context_transcript": ins.full_context_transcript, "voice": ins.voice,
    }  # fmt: skip


def write_outputs(
    out: Path,
    model: str,
    options: SessionOptions,
    runs: list[dict],
    instances: list[Instance],
    decoder: str = "greedy",
    playback: Playback = Playback(),
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "instances.jsonl", "w", encoding="utf-8") as f:
        for ins in instances:
            f.write(json.dumps(instance_json(ins), ensure_ascii=False) + "\n")
    one_k = [i for i in instances if i.wait_k == runs[0]["wait_k"]]
    summary = {
        "model": model,
        "chunk_ms": options.chunk_ms,
        "decoder": decoder,
        "translate_from": options.translate_from,
        "translation_search": asdict(options.translation),
        "lead_silence_ms": playback.lead_silence_ms,
        "room": None
        if playback.room is None
        else {"rt60_s": playback.room[0], "drr_db": playback.room[1]},
        "pause_lookback_ms": options.pause_lookback_ms,
        "sound_margin_db": options.sound_margin_db,
        "runs": runs,
        # the transcript does not depend on k: one k's instances give every voice's WER
        "wer_by_voice": wer_by_voice(one_k),
        "first_words_wrong": first_words_wrong(one_k),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    title = f"{model}, {options.chunk_ms} ms chunks"
    plot_latency_quality(runs, out / "latency_quality.png", title)
    return summary


def plot_latency_quality(runs: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    points = [r for r in runs if r["bleu"] is not None and r["AL"] is not None]
    for metric, marker in (("AL", "o"), ("LAAL", "s")):
        ax.plot(
            [r[metric] for r in points], [r["bleu"] for r in points], marker=marker, label=metric
        )
        for r in points:
            ax.annotate(
                f"k={r['wait_k']}",
                (r[metric], r["bleu"]),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=8,
            )
    ax.set_xlabel("latency (ms of source audio)")
    ax.set_ylabel("BLEU")
    ax.set_title(f"translation: BLEU vs latency\n{title}", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    labels = [str(r["wait_k"]) for r in runs]
    wer = [r["wer"] if r["wer"] is not None else 0 for r in runs]
    delay = [r["asr_delay_ms"]["mean"] or 0 for r in runs]
    ax2.bar(labels, wer, color="tab:gray", label="WER %")
    ax2.set_xlabel("wait-k")
    ax2.set_ylabel("WER %")
    twin = ax2.twinx()
    twin.plot(labels, delay, "r.-", label="transcript emission delay (ms)")
    twin.set_ylabel("mean emission delay (ms)")
    ax2.set_title("transcript: WER and emission delay", fontsize=10)
    fig.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


COLUMNS = (
    "wait_k",
    "wer",
    "wer_full_context",
    "bleu",
    "chrf",
    "AL",
    "LAAL",
    "DAL",
    "AP",
    "StartOffset",
    "EndOffset",
    "ATD",
    "AL_CA",
    "LAAL_CA",
    "DAL_CA",
    "ATD_CA",
    "asr_delay",
    "rtf",
)


def table_rows(runs: list[dict]) -> list[list[str]]:
    def fmt(value, digits=1):
        return (
            "-"
            if value is None
            else (f"{value:.{digits}f}" if isinstance(value, float) else str(value))
        )

    rows = []
    for r in runs:
        row = [fmt(r.get(c), 3 if c in ("AP", "rtf") else 1) for c in COLUMNS if c != "asr_delay"]
        row.insert(COLUMNS.index("asr_delay"), fmt(r["asr_delay_ms"]["mean"], 0))
        rows.append(row)
    return rows


def markdown_table(runs: list[dict]) -> str:
    header = "| " + " | ".join(COLUMNS) + " |"
    rule = "|" + "---|" * len(COLUMNS)
    return "\n".join([header, rule] + ["| " + " | ".join(row) + " |" for row in table_rows(runs)])


@dataclass(frozen=True)
class Difference:
    """B's figure minus A's on the same items, with a paired bootstrap over the items."""

    a: float  # A's figure
    b: float  # B's figure
    low: float  # 2.5th percentile of B - A over the resamples
    high: float  # 97.5th percentile
    b_higher: float  # share of resamples in which B's figure is the higher


def paired_bootstrap(
    num_a: np.ndarray, num_b: np.ndarray, den: np.ndarray, samples: int = 1000, seed: int = 0
) -> Difference:
    """B's sum(num_b) / sum(den) against A's sum(num_a) / sum(den) beyond what the choice of
    items explains: both resampled together, item by item (Koehn, 2004, for BLEU)."""
    picks = np.random.default_rng(seed).integers(0, len(den), (samples, len(den)))
    diff = (num_b[picks].sum(1) - num_a[picks].sum(1)) / den[picks].sum(1)
    return Difference(
        a=float(num_a.sum() / den.sum()),
        b=float(num_b.sum() / den.sum()),
        low=float(np.percentile(diff, 2.5)),
        high=float(np.percentile(diff, 97.5)),
        b_higher=float(np.mean(diff > 0)),
    )


def paired_wer_bootstrap(
    refs: list[str], hyps_a: list[str], hyps_b: list[str], samples: int = 1000, seed: int = 0
) -> Difference:
    """B's WER % against A's, the error counts resampled utterance by utterance."""

    def errors(hyps: list[str]) -> np.ndarray:
        counts = []
        for ref, hyp in zip(refs, hyps):
            words = jiwer.process_words(ref, hyp)
            counts.append(words.substitutions + words.deletions + words.insertions)
        return 100 * np.array(counts)

    words = np.array([len(ref.split()) for ref in refs])
    return paired_bootstrap(errors(hyps_a), errors(hyps_b), words, samples, seed)


def paired_latency_bootstrap(
    rows_a: list[dict], rows_b: list[dict], metric: str, samples: int = 1000, seed: int = 0
) -> tuple[Difference, int] | None:
    """B's corpus `metric` (AL, LAAL, ATD...) against A's on the utterances both translated with
    at least one word, resampled utterance by utterance; None when there are none."""

    def scores(rows: list[dict]) -> dict[str, float]:
        return {
            row["id"]: latency[metric]
            for row in rows
            if (
                latency := instance_latency(
                    row["delays_ms"], row["source_ms"], row["translation_ref"]
                )
            )
        }

    a, b = scores(rows_a), scores(rows_b)
    ids = sorted(a.keys() & b.keys())
    if not ids:
        return None
    values_a, values_b = np.array([a[i] for i in ids]), np.array([b[i] for i in ids])
    return paired_bootstrap(values_a, values_b, np.ones(len(ids)), samples, seed), len(ids)


@dataclass(frozen=True)
class BleuDifference:
    a: float  # BLEU of A
    b: float  # BLEU of B
    p_value: float  # of B's BLEU differing from A's by chance (sacrebleu's paired bootstrap)


def paired_bleu_bootstrap(
    refs: list[str], hyps_a: list[str], hyps_b: list[str], samples: int = 1000
) -> BleuDifference:
    """sacrebleu's paired bootstrap resampling of B's BLEU against A's (seeded by sacrebleu)."""
    from sacrebleu.significance import PairedTest

    test = PairedTest(
        [("A", hyps_a), ("B", hyps_b)], {"BLEU": sacrebleu.BLEU()}, [refs], "bs", samples
    )
    a, b = test()[1]["BLEU"]
    return BleuDifference(a=a.score, b=b.score, p_value=b.p_value)


def read_instances(folder: Path) -> list[dict]:
    """The rows of an eval folder's instances.jsonl, one per utterance and wait-k."""
    with open(folder / "instances.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def one_row_per_utterance(rows: list[dict]) -> list[dict]:
    """The first wait-k's rows: an utterance's transcript is the same at every k."""
    return [row for row in rows if row["wait_k"] == rows[0]["wait_k"]]


def transcripts_by_id(rows: list[dict]) -> dict[str, tuple[str, str, str]]:
    """id -> (reference, streamed, full-context transcript), normalized, of the utterances with a
    reference transcript."""
    texts = {
        row["id"]: tuple(
            normalize_transcript(row[key] or "")
            for key in ("text_ref", "transcript", "full_context_transcript")
        )
        for row in one_row_per_utterance(rows)
    }
    return {id_: text for id_, text in texts.items() if text[0]}


# Bands of how often a word occurs in the training text: (lowest, highest; None: no bound).
FREQUENCY_BANDS = ((0, 0), (1, 9), (10, 99), (100, None))


@dataclass
class WordErrors:
    """Reference words and the ones a transcript missed (substituted or deleted in the WER
    alignment), by word; what each substituted word was read as; and the words it inserted."""

    words: Counter = field(default_factory=Counter)
    missed: Counter = field(default_factory=Counter)
    read_as: Counter = field(default_factory=Counter)  # (reference word, transcript word)
    inserted: int = 0

    def add(self, ref: str, hyp: str) -> None:
        words, heard = ref.split(), hyp.split()
        self.words.update(words)
        for chunk in jiwer.process_words(ref, hyp).alignments[0]:
            if chunk.type in ("substitute", "delete"):
                self.missed.update(words[chunk.ref_start_idx : chunk.ref_end_idx])
            if chunk.type == "substitute":
                pairs = zip(
                    words[chunk.ref_start_idx : chunk.ref_end_idx],
                    heard[chunk.hyp_start_idx : chunk.hyp_end_idx],
                )
                self.read_as.update(pairs)
            elif chunk.type == "insert":
                self.inserted += chunk.hyp_end_idx - chunk.hyp_start_idx

    def band(self, counts: Counter, low: int, high: int | None) -> tuple[int, int]:
        """(reference words, missed ones) among the words the training text holds low..high
        times."""
        inside = [w for w in self.words if low <= counts[w] and (high is None or counts[w] <= high)]
        return sum(self.words[w] for w in inside), sum(self.missed[w] for w in inside)

    def most_read_as(self, word: str) -> tuple[str, int] | None:
        """The transcript word `word` was most often read as, and how often."""
        pairs = [(n, heard) for (said, heard), n in self.read_as.items() if said == word]
        if not pairs:
            return None
        n, heard = max(pairs)
        return heard, n


def word_errors(rows: list[dict]) -> tuple[WordErrors, WordErrors]:
    """The streamed and the full-context transcripts' WordErrors over an eval folder's rows."""
    streamed, full = WordErrors(), WordErrors()
    for ref, hyp, offline in transcripts_by_id(rows).values():
        streamed.add(ref, hyp)
        full.add(ref, offline)
    return streamed, full


def frequency_band_rows(streamed: WordErrors, full: WordErrors, counts: Counter) -> list[str]:
    """`word-errors` table rows: per band of training-text frequency (then all words), the
    reference words, their share, the share missed streamed and in full context, and the band's
    share of the streamed misses."""

    def percent(n: int, of: int) -> str:
        return f"{100 * n / of:.1f} %" if of else "-"

    total, missed = sum(streamed.words.values()), sum(streamed.missed.values())
    rows = []
    for low, high in [*FREQUENCY_BANDS, (0, None)]:
        if (low, high) == (0, None):
            name = "all"
        else:
            name = f"{low}+" if high is None else f"{low}" if low == high else f"{low}-{high}"
        words, wrong = streamed.band(counts, low, high)
        wrong_full = full.band(counts, low, high)[1]
        rows.append(
            f"{name:>22} | {words:5d} | {percent(words, total):>7} | {percent(wrong, words):>7} | "
            f"{percent(wrong_full, words):>7} | {percent(wrong, missed):>7}"
        )
    return rows


def training_word_counts(paths: list[Path]) -> Counter:
    """How often each normalized word occurs in training text: manifests (.jsonl, their `text`)
    or plain text files, one sentence a line."""
    counts: Counter = Counter()
    for path in paths:
        if path.suffix == ".jsonl":
            texts = [utterance.text or "" for utterance in read_manifest(path)]
        else:
            texts = path.read_text(encoding="utf-8").splitlines()
        for text in texts:
            counts.update(normalize_transcript(text).split())
    return counts


def translations_by_k(rows: list[dict]) -> dict[str, dict[str, tuple[str, str]]]:
    """wait-k -> id -> (reference, translation) of the utterances with a reference translation."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for row in rows:
        if row.get("translation_ref"):
            pairs = out.setdefault(str(row["wait_k"]), {})
            pairs[row["id"]] = (row["translation_ref"], row["translation"] or "")
    return out


def write_instance_log(target: Path, instances: list[dict], source_type: str) -> None:
    """SimulEval 1.1.4's `instances.log` and `config.yaml` in `target`, for `simuleval
    --score-only --output target`. Each instance: prediction, delays and elapsed (one per
    predicted word, in the source's unit: ms of speech or words of text), reference, source (its
    name) and source_length (in the same unit)."""
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.yaml").write_text(f"source_type: {source_type}\ntarget_type: text\n")
    with open(target / "instances.log", "w", encoding="utf-8") as f:
        for index, instance in enumerate(instances):
            log = {
                "index": index,
                **instance,
                "source": [instance["source"]],
                "prediction_length": len(instance["prediction"].split()),
            }
            f.write(json.dumps(log, ensure_ascii=False) + "\n")


def write_simuleval_logs(folder: Path, out: Path) -> dict[str, tuple[Path, int]]:
    """An eval folder's translations as SimulEval 1.1.4 instance logs, one folder per wait-k
    (`out/k<K>/instances.log` and `config.yaml`), for `simuleval --score-only --output DIR` to
    score with SimulEval's own scorers. Returns wait-k -> (folder, instances)."""
    by_k: dict[str, list[dict]] = {}
    for row in read_instances(folder):
        if row.get("translation_ref") is not None:
            by_k.setdefault(str(row["wait_k"]), []).append(
                {
                    "prediction": row["translation"] or "",
                    "delays": row["delays_ms"],
                    "elapsed": row["elapsed_ms"],
                    "reference": row["translation_ref"],
                    "source": row["id"],
                    "source_length": row["source_ms"],
                }
            )
    written = {}
    for k, instances in by_k.items():
        write_instance_log(out / f"k{k}", instances, "speech")
        written[k] = (out / f"k{k}", len(instances))
    return written


RESULTS_BEGIN, RESULTS_END = "<!-- results:begin -->", "<!-- results:end -->"


def results_section(eval_dirs: list[Path]) -> str:
    """Markdown for the README's Results section from one or more eval output folders."""
    parts = []
    for folder in eval_dirs:
        summary = json.loads((folder / "summary.json").read_text())
        count = sum(1 for _ in open(folder / "instances.jsonl")) // max(1, len(summary["runs"]))
        source = summary.get("translate_from", "speech")  # eval folders before the cascade
        # eval folders from before these settings decoded greedily without the guard
        search = TranslationSearch(**summary.get("translation_search", {"no_repeat_ngram": 0}))
        room = summary.get("room")  # absent in folders from before the option
        after = Playback(
            summary.get("lead_silence_ms", 0), room and (room["rt60_s"], room["drr_db"])
        ).describe()
        lookback = summary.get("pause_lookback_ms")  # absent in folders from before the option
        margin = summary.get("sound_margin_db")  # absent in folders from before the option
        if lookback is not None:
            after += f", pause lookback {lookback} ms"
            after += f" from the sound's onset ({margin:g} dB)" if margin is not None else ""
        parts.append(
            f"**{summary['chunk_ms']} ms chunks, translation from the {source}**"
            f" ({summary['model']}, {count} utterances{after},"
            f" {summary.get('decoder', 'greedy')} transcript search,"
            f" translation {search}, `{folder}`):\n"
        )
        parts.append(markdown_table(summary["runs"]) + "\n")
        plot = folder / "latency_quality.png"
        if plot.exists():
            parts.append(
                f"![BLEU against AL and LAAL, {summary['chunk_ms']} ms, from the {source}]"
                f"({plot.as_posix()})\n"
            )
    return "\n".join(parts)


def update_readme(readme: Path, section: str) -> None:
    text = readme.read_text()
    start, end = text.find(RESULTS_BEGIN), text.find(RESULTS_END)
    if start < 0 or end < start:
        raise ValueError(f"{readme}: no {RESULTS_BEGIN} ... {RESULTS_END} markers")
    readme.write_text(text[: start + len(RESULTS_BEGIN)] + "\n" + section + text[end:])
