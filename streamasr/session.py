"""A streaming session: audio pieces in, timestamped transcript and translation events out.

features (carried samples) -> encoder chunks (carried caches) -> CTC greedy (carried label)
-> words, or, when the model folder has a word LM, CTC beam search -> the words its beam agrees
on. The wait-k translator of the current segment reads either the same frames (translation from
speech) or the words as they are committed (the cascade: translation from the transcript). A run
of blank frames (greedy labels) closes a segment: its transcript and translation become final and
the decoders are reset, so a stream of any length runs in flat memory. Output never depends on
how the audio was cut into pieces: work is done in whole encoder chunks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import torch

from .audio import SAMPLES_PER_MS
from .bundle import Bundle
from .config import TRANSLATION_SOURCES
from .decoding import (
    DEFAULT_BEAM,
    DEFAULT_TRANSLATION,
    BeamOptions,
    CtcState,
    SpeechWaitKTranslator,
    TranscriptWaitKTranslator,
    TranslationSearch,
    ctc_greedy_step,
)
from .features import LogMel, SoundOnset, StreamingLogMel
from .policy import WaitK
from .text import Tokenizer


@dataclass(frozen=True)
class SessionOptions:
    chunk_ms: int = 320  # encoder chunk: audio gathered before each step
    translate: bool = True  # run the wait-k translator
    wait_k: int | None = 3  # None = full context (translate once the segment has ended)
    translate_from: str | None = None  # "speech" (encoder frames, units of unit_ms) or
    # "transcript" (committed words, one unit each); None: the model's default
    endpoint_ms: int = 800  # a run of blank frames this long closes a segment
    lead_in_ms: int = 640  # audio before the first transcript token that still joins the segment
    max_segment_ms: int = 20_000  # close a segment that runs this long without a pause
    pause_lookback_ms: int | None = 160  # outside a segment (before speech, in a pause), the
    # encoder looks back at most this far: a pause's silence is forgotten, and speech after it
    # is read as the training sentences, which begin after a short silence; None: the model's
    # whole lookback
    sound_margin_db: float | None = 10.0  # ...but it keeps every frame since the sound now heard
    # began (frames this far above the noise floor), as a word's first frames come before its
    # token; None: the greedy labels alone say where speech began
    beam: BeamOptions | None = DEFAULT_BEAM  # transcript beam search with the model's word LM;
    # None, or a model folder without an LM: greedy CTC
    translation: TranslationSearch = DEFAULT_TRANSLATION  # token choice of the translator
    partials: bool = False  # also emit the beam's tentative words after the committed ones as
    # "partial" events, each replacing the segment's last (the beam search only)


@dataclass(frozen=True)
class Event:
    stream: str
    segment: int
    type: Literal["transcript", "translation", "partial"]
    text: str  # newly emitted words (a delta); a partial: the tentative words after them
    final: bool  # closes the segment for this type
    delay_ms: float  # source audio consumed when emitted
    elapsed_ms: float  # compute-aware emission time (audio arriving in real time)

    def to_json(self) -> dict:
        return {
            "stream": self.stream, "segment": self.segment, "type": self.type, "text": self.text,
            "final": self.final, "delay_ms": round(self.delay_ms, 1), "elapsed_ms": round(self.elapsed_ms, 1),
        }  # fmt: skip


@dataclass(frozen=True)
class WordTiming:
    """A word with the times its last subword was written (for latency metrics)."""

    segment: int
    text: str
    delay_ms: float
    elapsed_ms: float


@dataclass(frozen=True)
class Segment:
    """A closed segment, for subtitles and reports."""

    index: int
    start_ms: float
    end_ms: float
    transcript: str
    translation: str


class VirtualClock:
    """Elapsed time as if audio arrived in real time: a chunk starts when its audio is in and
    the previous chunk is done; its computation time is measured."""

    def __init__(self) -> None:
        self.free_at_ms = 0.0
        self._begin_ms = 0.0
        self._t0 = 0.0

    def audio_arrived(self, total_ms: float) -> None:
        pass

    def start_chunk(self, audio_end_ms: float) -> None:
        self._begin_ms = max(audio_end_ms, self.free_at_ms)
        self._t0 = time.perf_counter()

    def now_ms(self) -> float:
        return self._begin_ms + (time.perf_counter() - self._t0) * 1000

    def end_chunk(self) -> None:
        self.free_at_ms = self.now_ms()


class WallClock:
    """Elapsed time on the wall clock, from the moment the stream's first audio was captured.

    That moment is estimated from arrivals: the stream's first `total_ms` of audio are in now, so
    its recording began at least that long ago. The earliest such bound over all arrivals is kept,
    so a piece delivered late (a busy machine, a driver's burst) never dates the stream too late,
    and elapsed time is never less than the audio consumed.
    """

    def __init__(self) -> None:
        self.t0: float | None = None

    def audio_arrived(self, total_ms: float) -> None:
        """The stream's first total_ms of audio have arrived."""
        began = time.perf_counter() - total_ms / 1000
        self.t0 = began if self.t0 is None else min(self.t0, began)

    def start_chunk(self, audio_end_ms: float) -> None:
        pass

    def now_ms(self) -> float:
        if self.t0 is None:
            return 0.0
        return (time.perf_counter() - self.t0) * 1000

    def end_chunk(self) -> None:
        pass


Word = tuple[str, tuple[float, float]]  # text, (delay_ms, elapsed_ms) of its last subword


class WordAssembler:
    """Collects subword tokens into whole words; a word is complete when the next one starts."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.pending: list[int] = []
        self.last_times = (0.0, 0.0)

    def push(self, token: int, delay_ms: float, elapsed_ms: float) -> list[Word]:
        """Add a token; returns the words it completed."""
        done = self.flush() if self.pending and self.tokenizer.starts_word(token) else []
        self.pending.append(token)
        self.last_times = (delay_ms, elapsed_ms)
        return done

    def flush(self) -> list[Word]:
        """The pending word(s): an unknown piece decodes with spaces around it, so maybe several."""
        text = self.tokenizer.decode(self.pending)
        self.pending = []
        return [(word, self.last_times) for word in text.split()]


@dataclass
class _SegmentState:
    index: int = 0
    started: bool = False  # a transcript token was seen: frames now feed the translator
    frames: int = 0  # encoder frames in the segment
    start_frame: int = 0  # absolute encoder frame where the segment's source begins
    last_token_frame: int = -1
    lead_in: torch.Tensor | None = None  # (1, T, D) frames before speech, trimmed to lead_in_ms
    transcript: list[str] = field(default_factory=list)
    translation: list[str] = field(default_factory=list)
    partial: str = ""  # the tentative words last emitted as a partial event


class Session:
    """One stream. `accept` pieces of 16 kHz mono float32 audio, then `finish`."""

    def __init__(
        self,
        bundle: Bundle,
        options: SessionOptions = SessionOptions(),
        stream: str = "stream",
        clock: Literal["virtual", "wall"] = "virtual",
    ):
        cfg = bundle.config
        self.bundle, self.options, self.stream = bundle, options, stream
        self.chunk_frames = cfg.chunk_frames(options.chunk_ms)
        lookback = options.pause_lookback_ms
        self.pause_keep_frames = None if lookback is None else lookback // cfg.frame_ms
        self.feature_frames_per_chunk = self.chunk_frames * cfg.subsampling
        self.features = StreamingLogMel(LogMel(cfg.feature_config()))
        margin = options.sound_margin_db
        gated = margin is not None and self.pause_keep_frames is not None
        self.sound = SoundOnset(cfg.feature_config(), margin) if gated else None
        self.feature_state = self.features.init_state()
        self.pending_feats = torch.zeros(0, cfg.n_mels)
        self.encoder_state = bundle.model.encoder.init_state(chunk_frames=self.chunk_frames)
        companion = bundle.model.companion
        self.companion_state = (
            None
            if companion is None
            else companion.encoder.init_state(chunk_frames=self.chunk_frames)
        )
        self.ctc_state = CtcState()
        self.beam = bundle.beam_search(options.beam)
        self.clock = VirtualClock() if clock == "virtual" else WallClock()
        self.policy = WaitK(options.wait_k, cfg.tokens_per_unit)
        self.translate_from = options.translate_from or cfg.translate_from
        if self.translate_from not in TRANSLATION_SOURCES:
            raise ValueError(f"translate_from must be one of {TRANSLATION_SOURCES}")
        bos_eos = bundle.de.bos_id, bundle.de.eos_id
        if self.translate_from == "transcript":
            self.translator = TranscriptWaitKTranslator(
                bundle.model,
                bundle.transcript_tokenizer,
                self.policy,
                *bos_eos,
                options.translation,
            )
        else:
            self.translator = SpeechWaitKTranslator(
                bundle.model, self.policy, *bos_eos, options.translation
            )
        self.translator_state = self.translator.init_state()
        self.segment = _SegmentState()
        self.en_words = WordAssembler(bundle.en)
        self.de_words = WordAssembler(bundle.de)
        self.samples_in = 0
        self.nonfinite_samples = 0  # NaN or infinity read as silence: one would poison the state
        self.feature_frames_used = 0
        self.transcript_words: list[WordTiming] = []
        self.translation_words: list[WordTiming] = []
        self.segments: list[Segment] = []
        self.chunk_compute_ms: list[float] = []
        self.finished = False

    # ------------------------------------------------------------------ public API

    @property
    def audio_ms(self) -> float:
        return self.samples_in / SAMPLES_PER_MS

    @torch.inference_mode()
    def accept(self, samples: np.ndarray) -> list[Event]:
        """Feed a piece of audio (any length); returns the events it caused. Samples that are
        not finite are read as silence and counted in `nonfinite_samples`."""
        if self.finished:
            raise RuntimeError("accept() after finish(): start a new Session")
        samples = np.asarray(samples)
        if not np.issubdtype(samples.dtype, np.floating):
            raise ValueError(
                f"expected float samples in [-1, 1], got {samples.dtype} (16-bit PCM: / 32768)"
            )
        samples = samples.astype(np.float32, copy=False)
        bad = ~np.isfinite(samples)
        if bad.any():  # a NaN in the carried caches would silence the rest of the stream
            self.nonfinite_samples += int(bad.sum())
            samples = np.where(bad, np.float32(0), samples)
        self.samples_in += len(samples)
        self.clock.audio_arrived(self.audio_ms)
        frames, self.feature_state = self.features.step(
            torch.from_numpy(samples), self.feature_state
        )
        self.pending_feats = torch.cat([self.pending_feats, frames])
        events: list[Event] = []
        while self.pending_feats.shape[0] >= self.feature_frames_per_chunk:
            events += self._process_chunk(
                self.feature_frames_per_chunk, self._consumed_ms(self.feature_frames_per_chunk)
            )
        return events

    @torch.inference_mode()
    def finish(self) -> list[Event]:
        """End of stream: encode what is left (whole encoder frames, and the frames still
        waiting for lookahead), close the open segment."""
        if self.finished:
            return []
        sub = self.bundle.config.subsampling
        usable = self.pending_feats.shape[0] // sub * sub
        waiting = self.encoder_state.ahead.shape[1]
        events = self._process_chunk(usable, self.audio_ms, final=True) if usable or waiting else []
        self.clock.start_chunk(self.audio_ms)
        events += self._close_segment(self.audio_ms)
        self.clock.end_chunk()
        self.finished = True
        return events

    # ------------------------------------------------------------------ internals

    def _consumed_ms(self, feature_frames: int) -> float:
        """Audio needed to compute the features up to this chunk's last frame (causal frames)."""
        return (self.feature_frames_used + feature_frames) * self.features.logmel.config.hop_ms

    def _process_chunk(
        self, feature_frames: int, delay_ms: float, final: bool = False
    ) -> list[Event]:
        model, cfg = self.bundle.model, self.bundle.config
        self.clock.start_chunk(delay_ms)
        t0 = time.perf_counter()
        raw = self.pending_feats[:feature_frames]
        self.pending_feats = self.pending_feats[feature_frames:]
        self.feature_frames_used += feature_frames
        if self.pause_keep_frames is not None and not self.segment.started:
            keep = self._pause_keep_frames()
            self.encoder_state = self.encoder_state.forget(keep)
            if self.companion_state is not None:
                self.companion_state = self.companion_state.forget(keep)
        if self.sound is not None:
            self.sound.update(raw)
        feats = self.bundle.stats.normalize(raw)[None]
        frames, self.encoder_state = model.encoder.step(feats, self.encoder_state, final)
        companion_frames = None
        if self.companion_state is not None:  # the same chunk grid: the same frames complete
            companion_frames, self.companion_state = model.companion.encoder.step(
                feats, self.companion_state, final
            )
        first_frame = self.encoder_state.frames_done - frames.shape[1]
        events: list[Event] = []
        if frames.shape[1]:  # with lookahead, a stream's first chunk may complete no frame
            log_probs = model.transcript_log_probs(frames, companion_frames)[0]
            events = self._transcript(log_probs, first_frame, delay_ms)
            events += self._translate(frames, first_frame, delay_ms, self._new_words(events))
        seg = self.segment
        silence_ms = self.ctc_state.trailing_blank_frames * cfg.frame_ms
        too_long = seg.frames * cfg.frame_ms >= self.options.max_segment_ms
        if seg.started and (silence_ms >= self.options.endpoint_ms or too_long):
            events += self._close_segment(delay_ms)
        self.clock.end_chunk()
        self.chunk_compute_ms.append((time.perf_counter() - t0) * 1000)
        return events

    def _pause_keep_frames(self) -> int:
        """Outside a segment: the pause lookback, reaching back to where the sound heard in the
        chunks before this one began (a word is heard before the greedy labels find it)."""
        onset = None if self.sound is None else self.sound.onset
        if onset is None:
            return self.pause_keep_frames
        heard = self.encoder_state.frames_done - onset // self.bundle.config.subsampling
        return self.pause_keep_frames + max(0, heard)

    def _event(self, kind: str, text: str, final: bool, delay_ms: float) -> Event:
        return Event(
            self.stream, self.segment.index, kind, text, final, delay_ms, self.clock.now_ms()
        )

    def _transcript(
        self, log_probs: torch.Tensor, first_frame: int, delay_ms: float
    ) -> list[Event]:
        """Greedy labels find speech and pauses; the words come from them or from the beam."""
        tokens, self.ctc_state = ctc_greedy_step(log_probs, self.ctc_state)
        if tokens:
            self.segment.last_token_frame = first_frame + tokens[-1][1]
            if not self.segment.started:
                self._start_segment(first_frame)
        times = (delay_ms, self.clock.now_ms())
        if self.beam is None:
            words = [w for token, _ in tokens for w in self.en_words.push(token, *times)]
        elif self.segment.started:
            words = [(word, times) for word in self.beam.step(log_probs)]
        else:
            words = []
        events = self._word_events("transcript", words, delay_ms)
        if self.options.partials and self.beam is not None and self.segment.started:
            partial = " ".join(self.beam.tentative())
            if partial != self.segment.partial or words:  # it follows the committed words
                self.segment.partial = partial
                events.append(self._event("partial", partial, False, delay_ms))
        return events

    def _word_events(
        self,
        kind: str,
        words: list[Word],
        delay_ms: float,
        final: bool = False,
    ) -> list[Event]:
        timings = self.transcript_words if kind == "transcript" else self.translation_words
        store = self.segment.transcript if kind == "transcript" else self.segment.translation
        for word, (word_delay, word_elapsed) in words:
            timings.append(WordTiming(self.segment.index, word, word_delay, word_elapsed))
            store.append(word)
        text = " ".join(word for word, _ in words)
        return [self._event(kind, text, final, delay_ms)] if text or final else []

    def _start_segment(self, first_frame: int) -> None:
        """Speech began in the chunk at first_frame: the translator reads the lead-in first."""
        seg = self.segment
        seg.started = True
        if self.beam is not None:
            self.beam.begin()
        if seg.lead_in is None or seg.lead_in.shape[1] == 0:
            seg.start_frame = first_frame
        else:
            if self.options.translate and self.translate_from == "speech":
                self.translator_state = self.translator.read(seg.lead_in, self.translator_state)
            seg.frames += seg.lead_in.shape[1]
        seg.lead_in = None

    def _keep_lead_in(self, frames: torch.Tensor, first_frame: int) -> None:
        """Before speech, keep only the last lead_in_ms of frames (bounded memory in silence)."""
        seg = self.segment
        keep = self.options.lead_in_ms // self.bundle.config.frame_ms
        lead = frames if seg.lead_in is None else torch.cat([seg.lead_in, frames], dim=1)
        seg.lead_in = lead[:, lead.shape[1] - min(keep, lead.shape[1]) :]
        seg.start_frame = first_frame + frames.shape[1] - seg.lead_in.shape[1]

    @staticmethod
    def _new_words(events: list[Event]) -> list[str]:
        """The words these events committed (a partial's tentative words are not the source)."""
        return [w for event in events if event.type == "transcript" for w in event.text.split()]

    def _translate(
        self, frames: torch.Tensor, first_frame: int, delay_ms: float, words: list[str]
    ) -> list[Event]:
        """Read this chunk's source (its frames, or the words it committed), write what the
        policy allows."""
        seg = self.segment
        if not seg.started:
            self._keep_lead_in(frames, first_frame)
            return []
        seg.frames += frames.shape[1]
        if not self.options.translate:
            return []
        source = words if self.translate_from == "transcript" else frames
        self.translator_state = self.translator.read(source, self.translator_state)
        tokens, self.translator_state = self.translator.write(
            self.translator_state, source_finished=False
        )
        return self._translation_tokens(tokens, delay_ms)

    def _translation_tokens(
        self, tokens: list[int], delay_ms: float, final: bool = False
    ) -> list[Event]:
        words = []
        for token in tokens:
            words += self.de_words.push(token, delay_ms, self.clock.now_ms())
        if final:
            words += self.de_words.flush()
        return self._word_events("translation", words, delay_ms, final)

    def _close_segment(self, delay_ms: float) -> list[Event]:
        seg = self.segment
        if not seg.started:
            return []
        if self.beam is None:
            words = self.en_words.flush()
        else:
            words = [(word, (delay_ms, self.clock.now_ms())) for word in self.beam.end()]
        events = self._word_events("transcript", words, delay_ms, final=True)
        if self.options.translate:
            if self.translate_from == "transcript":
                self.translator_state = self.translator.read(
                    self._new_words(events), self.translator_state
                )
            tokens, self.translator_state = self.translator.write(
                self.translator_state, source_finished=True
            )
            events += self._translation_tokens(tokens, delay_ms, final=True)
        frame_ms = self.bundle.config.frame_ms
        self.segments.append(
            Segment(
                index=seg.index,
                start_ms=seg.start_frame * frame_ms,
                end_ms=(seg.last_token_frame + 1) * frame_ms,
                transcript=" ".join(seg.transcript),
                translation=" ".join(seg.translation),
            )
        )
        self.segment = _SegmentState(
            index=seg.index + 1, start_frame=self.encoder_state.frames_done
        )
        self.translator_state = self.translator.init_state()
        self.ctc_state = replace(self.ctc_state, trailing_blank_frames=0)
        return events
