"""Decoding: streaming CTC search (greedy, or beam search with a word LM) and the wait-k
incremental translators (from encoder frames, or from the committed transcript words).

Greedy search and the translator carry explicit frozen states, so a session, the trainer's
validation and the evaluation run the same code. The beam search is flashlight-text's lexicon
decoder, stepped chunk by chunk; a word is emitted once every hypothesis
in the beam agrees on it, or, with a commit lookback, once the best hypothesis has held it for
that long (the beam then forgets the history before it). Emitted words are never revised.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from .model import DecoderState, SpeechTranslator, TranslationDecoder
from .policy import Action, PolicyView, WaitK
from .text import Tokenizer

BLANK = 0  # CTC blank of the transcript vocabulary
PAD = 0  # padding id of the translation vocabulary


@dataclass(frozen=True)
class CtcState:
    previous: int = BLANK  # label of the last frame, so repeats across chunks collapse
    trailing_blank_frames: int = 0  # blank frames since the last non-blank one


def ctc_greedy_step(log_probs: Tensor, state: CtcState) -> tuple[list[tuple[int, int]], CtcState]:
    """(T, V) log-probs of one chunk -> ([(token, frame offset in chunk)], state)."""
    labels = log_probs.argmax(-1).tolist()
    emitted = []
    previous, trailing = state.previous, state.trailing_blank_frames
    for t, label in enumerate(labels):
        if label != BLANK and label != previous:
            emitted.append((label, t))
        trailing = trailing + 1 if label == BLANK else 0
        previous = label
    return emitted, CtcState(previous=previous, trailing_blank_frames=trailing)


def ctc_greedy_tokens(log_probs: Tensor) -> list[int]:
    """(T, V) log-probs of a whole utterance -> its greedy CTC token ids."""
    tokens, _ = ctc_greedy_step(log_probs, CtcState())
    return [token for token, _ in tokens]


@dataclass(frozen=True)
class BeamOptions:
    """Defaults chosen with `streamasr tune-lm` for models/base: on data/tune (training voices),
    the beam on four tuning sets of voices no run heard (session 30), the blank penalty and
    log-add merging on those five sets (session 43)."""

    beam_size: int = 384  # hypotheses kept per frame
    lm_weight: float = 1.25  # weight of the LM's log10 probability (acoustic scores are ln)
    word_score: float = 0.5  # added per word (a length bonus)
    commit_ms: int | None = 640  # commit the best path this far back; None: on agreement only
    token_beam: int | None = 8  # most likely pieces tried per frame; None: every piece
    blank_penalty: float = 0.5  # subtracted from the blank's log-prob (favours pieces)
    log_add: bool = True  # merge equal hypotheses by log-add (the sum over CTC paths), not max


DEFAULT_BEAM = BeamOptions()


class WordLM:
    """A model folder's word LM (ARPA) and its lexicon as a trie over the transcript pieces,
    built once and shared by every search (building the trie takes a fifth of a second)."""

    def __init__(
        self,
        lexicon: Path,
        arpa: Path,
        tokens: list[str],
        extra: dict[str, list[str]] | None = None,
    ):
        """`extra`: spellings of words the lexicon lacks (`--words`), in pieces."""
        from flashlight.lib.text.decoder import SmearingMode, Trie
        from flashlight.lib.text.decoder.kenlm import KenLM
        from flashlight.lib.text.dictionary import Dictionary, create_word_dict, load_words

        spellings = load_words(str(lexicon))
        for word, pieces in (extra or {}).items():
            spellings.setdefault(word, [pieces])
        self.words = create_word_dict(spellings)
        self.tokens = Dictionary(tokens)
        self.silence = self.tokens.get_index(tokens[1])  # bos: never emitted by the CTC head
        with _quiet_stderr():  # KenLM draws a progress bar on stderr while it reads
            self.kenlm = KenLM(str(arpa), self.words)
        self.trie = Trie(self.tokens.index_size(), self.silence)
        start = self.kenlm.start(False)
        for word, pieces_list in spellings.items():
            index = self.words.get_index(word)
            _, score = self.kenlm.score(start, index)
            for pieces in pieces_list:
                self.trie.insert([self.tokens.get_index(p) for p in pieces], index, score)
        self.trie.smear(SmearingMode.MAX)


@contextlib.contextmanager
def _quiet_stderr():
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class CtcBeamSearch:
    """Lexicon-constrained CTC beam search with a word n-gram LM (flashlight-text's lexicon
    decoder), one segment at a time: `begin`, then `step` per chunk (returns the words that
    became certain), then `end`."""

    def __init__(self, lm: WordLM, options: BeamOptions, frame_ms: int):
        from flashlight.lib.text.decoder import (
            CriterionType,
            LexiconDecoder,
            LexiconDecoderOptions,
        )

        self.lm, self.options = lm, options
        self.commit_frames = None if options.commit_ms is None else options.commit_ms // frame_ms
        decoder_options = LexiconDecoderOptions(
            beam_size=options.beam_size,
            beam_size_token=options.token_beam or lm.tokens.index_size(),
            beam_threshold=50.0,
            lm_weight=options.lm_weight,
            word_score=options.word_score,
            unk_score=float("-inf"),
            sil_score=0.0,
            log_add=options.log_add,
            criterion_type=CriterionType.CTC,
        )
        unk = lm.words.get_index("<unk>")
        self.decoder = LexiconDecoder(
            decoder_options, lm.trie, lm.kenlm, lm.silence, BLANK, unk, [], False
        )
        self.emitted = 0  # words emitted from the hypotheses' root frame on

    def begin(self) -> None:
        self.decoder.decode_begin()
        self.emitted = 0

    def step(self, log_probs: Tensor) -> list[str]:
        """(T, V) log-probs of one chunk -> the words that became certain."""
        emissions = log_probs.float()
        if self.options.blank_penalty:
            emissions = emissions.clone()  # the caller's log-probs stay as they are
            emissions[:, BLANK] -= self.options.blank_penalty
        emissions = emissions.contiguous()
        self.decoder.decode_step(emissions.data_ptr(), *emissions.shape)
        committed = self._commit() if self.commit_frames is not None else []
        hyps = self.decoder.get_all_final_hypothesis()  # the beam now, not yet final
        words = [[w for w in h.words if w >= 0] for h in hyps]
        return committed + self._take(os.path.commonprefix(words) if words else [])

    def _commit(self) -> list[str]:
        """Fix the best path's words older than the lookback: the decoder cuts every
        hypothesis's history at the best path's last word boundary before it, which becomes
        the new root frame; the words before it are final."""
        before = self.decoder.get_best_hypothesis().words  # one entry per frame from the root
        self.decoder.prune(self.commit_frames)
        root = len(before) - len(self.decoder.get_best_hypothesis().words)
        fixed = [w for w in before[:root] if w >= 0]
        new = fixed[self.emitted :]
        self.emitted = max(0, self.emitted - len(fixed))
        return [self.lm.words.get_entry(w) for w in new]

    def tentative(self) -> list[str]:
        """The best hypothesis's words after those `step` returned: words it may still take back
        (partial captions), never committed ones."""
        words = [w for w in self.decoder.get_best_hypothesis().words if w >= 0]
        return [self.lm.words.get_entry(w) for w in words[self.emitted :]]

    def end(self) -> list[str]:
        """Close the segment: the rest of the best hypothesis."""
        self.decoder.decode_end()
        best = self.decoder.get_all_final_hypothesis()
        return self._take([w for w in best[0].words if w >= 0] if best else [])

    def decode(self, log_probs: Tensor) -> list[str]:
        """A whole utterance at once (full context)."""
        self.begin()
        return self.step(log_probs) + self.end()

    def _take(self, word_ids: list[int]) -> list[str]:
        new = word_ids[self.emitted :]
        self.emitted = max(self.emitted, len(word_ids))
        return [self.lm.words.get_entry(w) for w in new]


@dataclass(frozen=True)
class TranslationSearch:
    """How the wait-k translator chooses tokens: greedily while the source is arriving (a written
    token is final); once the source has ended, the rest of the sentence by beam search when
    beam > 1 (at k = inf, the whole sentence), hypotheses ranked by mean log-probability per
    token. Never an n-gram of pieces twice (0: no guard)."""

    beam: int = 4
    no_repeat_ngram: int = 4

    def __str__(self) -> str:
        guard = f"no repeated {self.no_repeat_ngram}-grams" if self.no_repeat_ngram else "no guard"
        return f"{'greedy' if self.beam == 1 else f'tail beam {self.beam}'}, {guard}"


DEFAULT_TRANSLATION = TranslationSearch()


@dataclass(frozen=True)
class TranslatorState:
    decoder: DecoderState
    memory_read: int = 0  # source positions of this segment in the cross caches
    unit_ends: tuple[int, ...] = ()  # memory position just after each complete source unit
    source: tuple[int, ...] = ()  # transcript subwords read (transcript source only)
    tokens: tuple[int, ...] = ()  # target tokens written so far
    next_input: int = 1  # token fed at the next step (bos first)
    done: bool = False  # eos written or length cap reached


def repeating_tokens(tokens: Sequence[int], n: int) -> list[int]:
    """The tokens that would complete an n-gram already in `tokens` (none for n < 1): banning
    them stops greedy decoding from looping ("Hosen Hosen Hosen ...")."""
    if n < 1 or len(tokens) < n - 1:
        return []
    tokens = tuple(tokens)
    context = tokens[len(tokens) - (n - 1) :]
    return [
        tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tokens[i : i + n - 1] == context
    ]


class WaitKTranslator:
    """Writes target tokens over a growing source memory when the policy says Write.

    Subclasses say what a source unit is: `unit_ms` of encoder frames (SpeechWaitKTranslator)
    or one transcript word (TranscriptWaitKTranslator). Token i sees the memory of its first
    k + i // tokens_per_unit units, exactly as in prefix-to-prefix training. Tokens are chosen
    as `search` says.
    """

    def __init__(
        self,
        decoder: TranslationDecoder,
        policy: WaitK,
        bos_id: int,
        eos_id: int,
        search: TranslationSearch = DEFAULT_TRANSLATION,
    ):
        self.decoder, self.policy = decoder, policy
        self.bos_id, self.eos_id = bos_id, eos_id
        self.search = search

    @property
    def device(self) -> torch.device:
        """Where the decoder's weights are, and so its inputs are made."""
        return next(self.decoder.parameters()).device

    def init_state(self) -> TranslatorState:
        decoder = self.decoder.init_state(device=self.device)
        return TranslatorState(decoder=decoder, next_input=self.bos_id)

    def _extend(self, memory: Tensor, unit_ends: list[int], state: TranslatorState):
        """Project new memory (1, C, D) into the cross caches; record complete units."""
        if memory.shape[1] == 0:
            return state
        return replace(
            state,
            decoder=self.decoder.extend_memory(memory, state.decoder),
            memory_read=state.memory_read + memory.shape[1],
            unit_ends=state.unit_ends + tuple(unit_ends),
        )

    def _visible(self, state: TranslatorState, units: int | None) -> int:
        if units is None or units > len(state.unit_ends):
            return state.memory_read
        return state.unit_ends[units - 1]

    def _max_tokens(self, state: TranslatorState) -> int:
        complete = state.unit_ends[-1] if state.unit_ends else 0
        units = len(state.unit_ends) + (state.memory_read > complete)  # a partial unit counts
        return min(self.decoder.cfg.max_target_tokens - 1, 8 + 3 * units)

    def write(
        self, state: TranslatorState, source_finished: bool
    ) -> tuple[list[int], TranslatorState]:
        """Write every token the policy allows now; returns the new tokens (eos excluded)."""
        new: list[int] = []
        if source_finished and self.search.beam > 1 and not state.done and state.memory_read:
            new, _, state = self.finish_by_beam(state)
            return new, state
        while not state.done and state.memory_read > 0:
            view = PolicyView(len(state.unit_ends), len(state.tokens), source_finished)
            if self.policy(view) is Action.READ:
                break
            visible = self._visible(state, self.policy.units_needed(len(state.tokens)))
            logits, decoder = self.decoder.step(
                torch.tensor([state.next_input], device=self.device), state.decoder, visible
            )
            logits[0, self._banned(state.tokens)] = float("-inf")
            if not source_finished:
                logits[0, self.eos_id] = float("-inf")  # the sentence cannot end before its source
            token = int(logits[0].argmax())
            tokens = state.tokens if token == self.eos_id else state.tokens + (token,)
            done = token == self.eos_id or len(tokens) >= self._max_tokens(state)
            state = replace(state, decoder=decoder, tokens=tokens, next_input=token, done=done)
            if token != self.eos_id:
                new.append(token)
        return new, state

    def _banned(self, tokens: tuple[int, ...]) -> list[int]:
        """Tokens never written after `tokens`: padding, bos, and a repeated n-gram's end."""
        return [PAD, self.bos_id, *repeating_tokens(tokens, self.search.no_repeat_ngram)]

    def finish_by_beam(self, state: TranslatorState) -> tuple[list[int], float, TranslatorState]:
        """The rest of the sentence once the source has ended, by beam search over continuations
        of the tokens written so far: (new tokens, their mean log-probability with eos, the
        finished state). As in fairseq, a hypothesis ends (eos, or the length cap) only from the
        best `beam` candidates of a step, and the search stops once `beam` have ended; with
        beam 1 it is the greedy search. The finished state keeps the decoder state it was given:
        a finished segment is not decoded further."""
        beam, prefix, cap = self.search.beam, state.tokens, self._max_tokens(state)
        alive: list[tuple[tuple[int, ...], float]] = [((), 0.0)]  # new tokens, summed log-prob
        ended: list[tuple[float, tuple[int, ...]]] = []  # mean log-prob, new tokens
        decoder, inputs = state.decoder, torch.tensor([state.next_input], device=self.device)
        while alive and len(ended) < beam:
            written = len(prefix) + len(alive[0][0])
            visible = self._visible(state, self.policy.units_needed(written))
            logits, decoder = self.decoder.step(inputs, decoder, visible)
            log_probs = logits.log_softmax(-1)
            for row, (tokens, _) in enumerate(alive):
                log_probs[row, self._banned(prefix + tokens)] = float("-inf")
            scores = torch.tensor([score for _, score in alive], device=self.device)
            totals = scores[:, None] + log_probs
            top = totals.flatten().topk(min(2 * beam, totals.numel()))
            next_alive, rows = [], []
            for rank, (total, index) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
                if total == float("-inf"):
                    break
                row, token = divmod(index, totals.shape[1])
                tokens = alive[row][0] + (token,)
                if token == self.eos_id or written + 1 >= cap:
                    if rank < beam:
                        kept = tokens[:-1] if token == self.eos_id else tokens
                        ended.append((total / len(tokens), kept))
                elif len(next_alive) < beam:
                    next_alive.append((tokens, total))
                    rows.append(row)
            alive = next_alive
            if alive:
                decoder = _select_rows(decoder, torch.tensor(rows, device=self.device))
                inputs = torch.tensor([tokens[-1] for tokens, _ in alive], device=self.device)
        score, tokens = max(ended, key=lambda e: e[0])
        return list(tokens), score, replace(state, tokens=prefix + tokens, done=True)


def _select_rows(state: DecoderState, rows: Tensor) -> DecoderState:
    """The decoder state of the hypotheses `rows` (the cross caches are the same for all)."""
    layers = tuple(
        replace(
            layer,
            self_keys=layer.self_keys.index_select(0, rows),
            self_values=layer.self_values.index_select(0, rows),
            cross_keys=layer.cross_keys[:1].expand(len(rows), -1, -1, -1),
            cross_values=layer.cross_values[:1].expand(len(rows), -1, -1, -1),
        )
        for layer in state.layers
    )
    return replace(state, layers=layers)


class SpeechWaitKTranslator(WaitKTranslator):
    """Translation from encoder frames: every unit_ms of a segment's frames is one unit."""

    def __init__(
        self,
        model: SpeechTranslator,
        policy: WaitK,
        bos_id: int,
        eos_id: int,
        search: TranslationSearch = DEFAULT_TRANSLATION,
    ):
        super().__init__(model.decoder, policy, bos_id, eos_id, search)
        self.cfg = model.cfg

    def read(self, frames: Tensor, state: TranslatorState) -> TranslatorState:
        """Append encoder frames (1, C, D) of the current segment."""
        total = state.memory_read + frames.shape[1]
        ends = self.cfg.unit_ends(len(state.unit_ends) + 1, total)
        return self._extend(frames, ends, state)


class TranscriptWaitKTranslator(WaitKTranslator):
    """Cascade translation from committed transcript words: every word is one unit.

    The segment's subwords so far are re-encoded by the causal transcript encoder (a prefix
    encodes the same whatever follows) and only the new positions enter the cross caches; a
    model with `cascade_whole_source` encodes them once more, without the mask, when the
    segment's source ends (by an encoder of its own with `cascade_whole_encoder`).
    """

    def __init__(
        self,
        model: SpeechTranslator,
        en: Tokenizer,
        policy: WaitK,
        bos_id: int,
        eos_id: int,
        search: TranslationSearch = DEFAULT_TRANSLATION,
    ):
        if not model.has_cascade:
            raise ValueError(
                "this model has no transcript translator (transcript_encoder_layers=0)"
            )
        super().__init__(model.transcript_decoder, policy, bos_id, eos_id, search)
        self.encoder, self.en = model.transcript_encoder, en
        self.encode_whole = model.encode_whole_source

    def read(self, words: list[str], state: TranslatorState) -> TranslatorState:
        """Append committed transcript words (normalized, lowercase) of the current segment."""
        pieces, ends = self.en.encode_words(words)
        if not pieces:
            return state
        source = list(state.source) + pieces
        ends = [state.memory_read + end for end in ends]
        memory = self.encoder(torch.tensor([source], device=self.device))[:, state.memory_read :]
        return replace(self._extend(memory, ends, state), source=tuple(source))

    def write(
        self, state: TranslatorState, source_finished: bool
    ) -> tuple[list[int], TranslatorState]:
        """As `WaitKTranslator.write`; with `cascade_whole_source`, once the source has ended the
        rest of the translation reads the whole transcript encoded again without the causal
        mask (the cross caches replaced; the words written so far stay)."""
        whole_source = self.decoder.cfg.cascade_whole_source
        if source_finished and whole_source and state.source and not state.done:
            whole = self.encode_whole(torch.tensor([state.source], device=self.device))
            state = replace(state, decoder=self.decoder.replace_memory(whole, state.decoder))
        return super().write(state, source_finished)


def translate_segment(translator: WaitKTranslator, units: list) -> list[int]:
    """Simultaneous translation of a whole segment, given as its source units in order (encoder
    frame blocks (1, C, D) for speech, words for a transcript), read one unit at a time."""
    return [token for token, _ in translate_segment_timed(translator, units)]


def translate_segment_timed(translator: WaitKTranslator, units: list) -> list[tuple[int, int]]:
    """`translate_segment`'s tokens, each with how many source units had been read when it was
    written (its delay in units)."""
    state, timed = translator.init_state(), []
    for read, unit in enumerate(units, 1):
        state = translator.read(unit, state)
        new, state = translator.write(state, source_finished=False)
        timed += [(token, read) for token in new]
    new, state = translator.write(state, source_finished=True)
    return timed + [(token, len(units)) for token in new]


def speech_units(model: SpeechTranslator, memory: Tensor) -> list[Tensor]:
    """An encoded segment (1, S, D) cut into its wait-k units (the last one may be partial)."""
    total = memory.shape[1]
    ends = [end for end in model.cfg.unit_ends(1, total) if end < total] + [total]
    return list(memory.split([b - a for a, b in zip([0] + ends, ends)], dim=1))
