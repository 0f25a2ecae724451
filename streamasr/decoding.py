"""Decoding: streaming CTC greedy search and the wait-k incremental translator.

Both carry explicit frozen states, so a session, the trainer's validation and the evaluation
run the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .model import DecoderState, SpeechTranslator
from .policy import Action, PolicyView, WaitK

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
class TranslatorState:
    decoder: DecoderState
    frames_read: int = 0  # encoder frames of this segment projected into the cross caches
    tokens: tuple[int, ...] = ()  # target tokens written so far
    next_input: int = 1  # token fed at the next step (bos first)
    done: bool = False  # eos written or length cap reached


class WaitKTranslator:
    """Reads encoder frames of one segment, writes target tokens when the policy says Write."""

    def __init__(self, model: SpeechTranslator, policy: WaitK, bos_id: int, eos_id: int):
        self.model, self.policy = model, policy
        self.bos_id, self.eos_id = bos_id, eos_id
        self.unit_frames = model.cfg.unit_frames

    def init_state(self) -> TranslatorState:
        return TranslatorState(decoder=self.model.decoder.init_state(), next_input=self.bos_id)

    def read(self, frames: Tensor, state: TranslatorState) -> TranslatorState:
        """Append encoder frames (1, C, D) of the current segment."""
        if frames.shape[1] == 0:
            return state
        decoder = self.model.decoder.extend_memory(frames, state.decoder)
        return replace(state, decoder=decoder, frames_read=state.frames_read + frames.shape[1])

    def _max_tokens(self, state: TranslatorState) -> int:
        units = -(-state.frames_read // self.unit_frames)
        return min(self.model.cfg.max_target_tokens - 1, 8 + 3 * units)

    def write(
        self, state: TranslatorState, source_finished: bool
    ) -> tuple[list[int], TranslatorState]:
        """Write every token the policy allows now; returns the new tokens (eos excluded)."""
        new: list[int] = []
        while not state.done and state.frames_read > 0:
            view = PolicyView(
                state.frames_read // self.unit_frames, len(state.tokens), source_finished
            )
            if self.policy(view) is Action.READ:
                break
            needed = self.policy.units_needed(len(state.tokens))
            visible = (
                state.frames_read
                if needed is None
                else min(needed * self.unit_frames, state.frames_read)
            )
            logits, decoder = self.model.decoder.step(
                torch.tensor([state.next_input]), state.decoder, visible
            )
            logits[0, [PAD, self.bos_id]] = float("-inf")  # never written
            if not source_finished:
                logits[0, self.eos_id] = float("-inf")  # the sentence cannot end before its source
            token = int(logits[0].argmax())
            tokens = state.tokens if token == self.eos_id else state.tokens + (token,)
            done = token == self.eos_id or len(tokens) >= self._max_tokens(state)
            state = replace(state, decoder=decoder, tokens=tokens, next_input=token, done=done)
            if token != self.eos_id:
                new.append(token)
        return new, state


def translate_segment(
    model: SpeechTranslator, memory: Tensor, policy: WaitK, bos_id: int, eos_id: int
) -> list[int]:
    """Simultaneous translation of a whole encoded segment (1, S, D), read one unit at a time."""
    translator = WaitKTranslator(model, policy, bos_id, eos_id)
    state = translator.init_state()
    unit = model.cfg.unit_frames
    for start in range(0, memory.shape[1], unit):
        state = translator.read(memory[:, start : start + unit], state)
        if state.frames_read % unit == 0:
            _, state = translator.write(state, source_finished=False)
    _, state = translator.write(state, source_finished=True)
    return list(state.tokens)
