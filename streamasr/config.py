"""Model configuration: a frozen dataclass saved as config.json beside the weights."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .features import FeatureConfig

TRANSLATION_SOURCES = ("speech", "transcript")


@dataclass(frozen=True)
class ModelConfig:
    n_mels: int = 80  # input feature bins
    feature_hop_ms: int = 10  # feature frame shift
    # stride-2 causal convs: 2**2 = 4x -> 40 ms frames. 8x (80 ms) left about 2.3 frames per
    # transcript piece at TTS speaking rates and CTC training stalled; 40 ms gives about 4.6.
    subsampling_layers: int = 2
    subsampling_channels: int = 64  # conv2d channels of the subsampling layers
    d_model: int = 192  # width of encoder and decoder
    n_heads: int = 4  # attention heads
    d_ff: int = 768  # feed-forward hidden width
    encoder_layers: int = 6  # Conformer-style blocks
    conv_kernel: int = 15  # causal depthwise kernel (encoder frames: 600 ms)
    left_context_frames: int = 96  # lookback of chunked attention, encoder frames (3.84 s)
    chunk_frames_choices: tuple[int, ...] = (4, 8, 16, 32)  # dynamic chunks: 160-1280 ms
    # Right context: every chunk also sees this many encoder frames after it (through one
    # linear map at the blocks' input), and is emitted that much later.
    lookahead_frames: int = 0
    # Right context inside the blocks (Emformer's): every chunk's attention and convolution also
    # see the next this many frames, recomputed with each chunk and never cached; emitted that
    # much later too (after the lookahead's frames, when both are set).
    right_context_frames: int = 0
    # Self-conditioned CTC (Nozaki and Komatsu, 2021): after each of these encoder blocks
    # (1-based), an intermediate CTC head reads the frames and its posteriors are projected back
    # into them, so the blocks above refine a transcript rather than start one; training adds
    # the intermediate heads' CTC losses. Per frame, so streaming stays exact. (): none.
    self_condition_layers: tuple[int, ...] = ()
    decoder_layers: int = 3  # translation decoder blocks
    unit_ms: int = 320  # wait-k source unit: this much encoded audio is one unit
    # The first unit is this many frames shorter, so that with a lookahead of as many frames
    # the units end where unit_ms of audio completes frames (unit j at j * unit_frames - shift)
    # rather than a chunk later. `streamasr train` sets it to ahead_frames (below unit_frames).
    unit_shift_frames: int = 0
    tokens_per_unit: int = 1  # target tokens written per source unit read
    wait_k_choices: tuple[int, ...] = (1, 2, 3, 4, 5, 7, 9, 0)  # sampled in training; 0 = inf
    en_vocab: int = 128  # transcript sentencepiece size (id 0 = CTC blank)
    de_vocab: int = 4000  # translation sentencepiece size
    max_target_tokens: int = 160  # decoder positions
    dropout: float = 0.1  # on attention/FFN outputs during training
    # Cascade translation: a causal Transformer over the transcript's subwords with its own
    # wait-k decoder, whose source units are transcript words. 0 layers = none.
    transcript_encoder_layers: int = 0
    # The cascade's source pieces: a sentencepiece model of its own (transcript.model) of this
    # size, or 0 for the CTC's en.model. The CTC needs few pieces (about 4.6 frames each); a
    # translator reads words better as word-sized pieces, in sequences half as long or less.
    transcript_vocab: int = 0
    cascade_dropout: float = 0.1  # dropout of the transcript encoder and its decoder
    # Once a segment's source has ended, the cascade encodes its whole transcript again without
    # the causal mask, and the rest of its translation attends to that encoding (the words
    # written while the source streamed in stay as written). False: the causal encoding
    # throughout, as every cascade before session 62.
    cascade_whole_source: bool = False
    # That reading by a second transcript encoder of the same shape, of its own (`whole_encoder`),
    # started from the causal one; cascade training then trains it alone, every other weight and
    # every word written before the source ends kept as they were. False: the causal encoder's
    # weights read the whole source too.
    cascade_whole_encoder: bool = False
    translate_from: str = "speech"  # the default source of translation: "speech" or "transcript"
    # A second streaming encoder of this many blocks, with a CTC head of its own, read beside the
    # first: the transcript's posteriors are a weighted mean of the two, the companion's share
    # `companion_weight` (translation from speech reads the first encoder only). 0 = none.
    companion_encoder_layers: int = 0
    companion_weight: float = 0.5

    def __post_init__(self) -> None:
        if self.translate_from not in TRANSLATION_SOURCES:
            raise ValueError(f"translate_from must be one of {TRANSLATION_SOURCES}")
        if self.translate_from == "transcript" and not self.transcript_encoder_layers:
            raise ValueError("translate_from='transcript' needs transcript_encoder_layers > 0")
        if self.cascade_whole_source and not self.transcript_encoder_layers:
            raise ValueError("cascade_whole_source needs transcript_encoder_layers > 0")
        if self.cascade_whole_encoder and not self.cascade_whole_source:
            raise ValueError("cascade_whole_encoder needs cascade_whole_source")
        if any(not 1 <= i < self.encoder_layers for i in self.self_condition_layers):
            raise ValueError(
                f"self_condition_layers must be blocks 1 to {self.encoder_layers - 1} (below "
                f"the last), got {self.self_condition_layers}"
            )
        if not 0 < self.companion_weight < 1:
            raise ValueError(f"companion_weight must be in (0, 1), got {self.companion_weight}")
        if not 0 <= self.unit_shift_frames < self.unit_frames:
            raise ValueError(f"unit_shift_frames must be in [0, {self.unit_frames})")

    @property
    def subsampling(self) -> int:
        return 2**self.subsampling_layers

    @property
    def frame_ms(self) -> int:
        return self.feature_hop_ms * self.subsampling

    @property
    def ahead_frames(self) -> int:
        """Frames after its chunk that a chunk waits for: lookahead and right context."""
        return self.lookahead_frames + self.right_context_frames

    @property
    def unit_frames(self) -> int:
        return self.unit_ms // self.frame_ms

    def unit_ends(self, first: int, frames: int) -> list[int]:
        """The frame counts just after speech units first, first + 1, ... (1-based) of a
        segment that are complete within its first `frames` frames."""
        start = first * self.unit_frames - self.unit_shift_frames
        return list(range(start, frames + 1, self.unit_frames))

    @property
    def cascade_source_vocab(self) -> int:
        return self.transcript_vocab or self.en_vocab

    def chunk_frames(self, chunk_ms: int) -> int:
        """Encoder frames per chunk; chunk_ms must be a multiple of frame_ms that divides lookback."""
        if chunk_ms <= 0 or chunk_ms % self.frame_ms:
            raise ValueError(
                f"chunk_ms must be a positive multiple of {self.frame_ms}, got {chunk_ms}"
            )
        frames = chunk_ms // self.frame_ms
        if self.left_context_frames % frames:
            raise ValueError(
                f"chunk_ms={chunk_ms} ({frames} frames) must divide the lookback of "
                f"{self.left_context_frames} frames"
            )
        return frames

    def feature_config(self) -> FeatureConfig:
        return FeatureConfig(n_mels=self.n_mels, hop_ms=self.feature_hop_ms)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known}
        return cls(**kwargs)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> ModelConfig:
        return cls.from_json(json.loads(path.read_text()))
