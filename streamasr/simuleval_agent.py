"""A SimulEval 1.1.4 agent that runs the streamasr Session, so SimulEval can score our model.

    simuleval --agent streamasr/simuleval_agent.py --source wav_list.txt --target refs.txt \
        --source-segment-size 320 --wait-k 3 --output runs/simuleval

SimulEval sends one source segment per call and accepts one write per call, so every
translation word the session emits for a segment goes into one WriteAction; SimulEval splits
it into words that share that segment's delay.
"""

from __future__ import annotations

import numpy as np
from simuleval.agents import SpeechToTextAgent
from simuleval.agents.actions import Action, ReadAction, WriteAction
from simuleval.utils import entrypoint

from streamasr.audio import SAMPLE_RATE, StreamResampler
from streamasr.bundle import load_bundle
from streamasr.cli import add_translation_search_options, translation_search
from streamasr.config import TRANSLATION_SOURCES
from streamasr.policy import parse_wait_k
from streamasr.session import Session, SessionOptions


@entrypoint
class StreamasrAgent(SpeechToTextAgent):
    def __init__(self, args):
        self.bundle = load_bundle(args.model_dir)
        self.options = SessionOptions(
            chunk_ms=args.chunk_ms,
            translate=True,
            wait_k=parse_wait_k(args.wait_k),
            translate_from=args.translate_from,
            translation=translation_search(args),
        )
        super().__init__(args)  # calls reset(), which needs the bundle

    @staticmethod
    def add_args(parser) -> None:
        parser.add_argument(
            "--model-dir", default=None, help="streamasr model folder (default: shipped)"
        )
        parser.add_argument("--wait-k", default="3", help="K >= 1 or inf")
        parser.add_argument("--chunk-ms", type=int, default=320, help="encoder chunk")
        parser.add_argument(
            "--translate-from",
            choices=TRANSLATION_SOURCES,
            default=None,
            help="translation source (default: the model's)",
        )
        add_translation_search_options(parser)

    def reset(self) -> None:
        super().reset()
        self.session = Session(self.bundle, self.options, stream="simuleval")
        self.samples_fed = 0
        self.resampler: StreamResampler | None = None  # made once the source's rate is known

    def policy(self) -> Action:
        new = self.states.source[self.samples_fed :]
        self.samples_fed = len(self.states.source)
        events = []
        if self.resampler is None:
            self.resampler = StreamResampler(self.states.source_sample_rate or SAMPLE_RATE)
        if new:
            events += self.session.accept(self.resampler.push(np.asarray(new, dtype=np.float32)))
        if self.states.source_finished:
            if len(tail := self.resampler.flush()):
                events += self.session.accept(tail)
            events += self.session.finish()
        words = [e.text for e in events if e.type == "translation" and e.text]
        if words or self.states.source_finished:
            return WriteAction(" ".join(words), finished=self.states.source_finished)
        return ReadAction()
