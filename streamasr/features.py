"""Log-mel features, whole-signal and streaming, with global mean/variance normalization.

Frames are causal: the signal is preceded by win - hop zero samples, so frame j ends exactly at
sample (j + 1) * hop and depends on nothing after it. A chunk of N frames therefore needs
exactly N * hop of audio. The streaming extractor carries the samples not yet covered by a full
window and produces exactly the frames the whole signal would give.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torchaudio

from .audio import SAMPLE_RATE, SAMPLES_PER_MS


@dataclass(frozen=True)
class FeatureConfig:
    n_mels: int = 80  # mel bands
    win_ms: int = 25  # analysis window
    hop_ms: int = 10  # frame shift; one feature frame per hop
    log_floor: float = 1e-6  # added before the log so silence stays finite

    @property
    def win_samples(self) -> int:
        return self.win_ms * SAMPLES_PER_MS

    @property
    def hop_samples(self) -> int:
        return self.hop_ms * SAMPLES_PER_MS


class LogMel(torch.nn.Module):
    """(..., T_samples) float waveform -> (..., T_frames, n_mels) log-mel, unnormalized."""

    def __init__(self, config: FeatureConfig = FeatureConfig()):
        super().__init__()
        self.config = config
        self.mel = torchaudio.transforms.MelSpectrogram(
            sample_rate=SAMPLE_RATE,
            n_fft=config.win_samples,
            win_length=config.win_samples,
            hop_length=config.hop_samples,
            n_mels=config.n_mels,
            center=False,
            power=2.0,
        )

    @property
    def lead_samples(self) -> int:
        """Zeros before the signal so that frame j ends at sample (j + 1) * hop."""
        return self.config.win_samples - self.config.hop_samples

    def num_frames(self, num_samples: int) -> int:
        """Frames in a buffer of num_samples, the lead zeros included."""
        if num_samples < self.config.win_samples:
            return 0
        return 1 + (num_samples - self.config.win_samples) // self.config.hop_samples

    def frames(self, buffer: torch.Tensor) -> torch.Tensor:
        """Frames of a buffer whose lead is already in place: (T_samples,) -> (T_frames, n_mels)."""
        if buffer.shape[-1] < self.config.win_samples:
            return buffer.new_zeros(*buffer.shape[:-1], 0, self.config.n_mels)
        spec = self.mel(buffer)  # (..., n_mels, T)
        return torch.log(spec + self.config.log_floor).transpose(-1, -2)

    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        """Whole signal: (..., T_samples) -> (..., T_samples // hop, n_mels)."""
        lead = waveform.new_zeros(*waveform.shape[:-1], self.lead_samples)
        return self.frames(torch.cat([lead, waveform], dim=-1))


@dataclass(frozen=True)
class FeatureState:
    """Samples received but not yet covered by a complete frame."""

    pending: torch.Tensor = field(default_factory=lambda: torch.zeros(0))  # (T_samples,)


class StreamingLogMel:
    """Piecewise log-mel: feeding a signal in any cut gives the whole signal's frames."""

    def __init__(self, logmel: LogMel):
        self.logmel = logmel

    def init_state(self) -> FeatureState:
        return FeatureState(pending=torch.zeros(self.logmel.lead_samples))

    def step(self, samples: torch.Tensor, state: FeatureState) -> tuple[torch.Tensor, FeatureState]:
        """(T_samples,) new audio -> ((T_frames, n_mels) new frames, new state)."""
        buffer = torch.cat([state.pending, samples.to(torch.float32)])
        num_frames = self.logmel.num_frames(buffer.numel())
        frames = self.logmel.frames(buffer[: self._covered(num_frames)])
        consumed = num_frames * self.logmel.config.hop_samples
        return frames, FeatureState(pending=buffer[consumed:])

    def _covered(self, num_frames: int) -> int:
        if num_frames == 0:
            return 0
        cfg = self.logmel.config
        return (num_frames - 1) * cfg.hop_samples + cfg.win_samples


class SoundOnset:
    """Where the sound now heard began, from raw log-mel frames fed in order (minimum statistics).

    A frame is sound when its mean log-mel power stands `margin_db` above a noise floor that
    follows any quieter frame down at once and otherwise rises `rise_db_per_s`, so a steady
    background becomes the floor within seconds; `quiet_ms` without sound ends the sound. The
    floor starts at digital silence, so a stream that opens with speech hears it.
    """

    def __init__(
        self,
        config: FeatureConfig = FeatureConfig(),
        margin_db: float = 10.0,
        quiet_ms: int = 160,
        rise_db_per_s: float = 2.0,
    ):
        nats_per_db = math.log(10) / 10  # the frames are natural logs of power
        self.margin = margin_db * nats_per_db
        self.rise = rise_db_per_s * nats_per_db * config.hop_ms / 1000
        self.quiet_frames = max(1, quiet_ms // config.hop_ms)
        self.floor = math.log(config.log_floor)
        self.frames_seen = 0
        self.quiet_run = 0
        self.onset: int | None = None  # frame index where the sound began; None: quiet

    def update(self, frames: torch.Tensor) -> None:
        """(T, n_mels) the next unnormalized log-mel frames."""
        for energy in frames.mean(-1).tolist():
            self.floor = min(energy, self.floor + self.rise)
            if energy > self.floor + self.margin:
                self.quiet_run = 0
                if self.onset is None:
                    self.onset = self.frames_seen
            else:
                self.quiet_run += 1
                if self.quiet_run >= self.quiet_frames:
                    self.onset = None
            self.frames_seen += 1


@dataclass(frozen=True)
class FeatureStats:
    """Global per-bin mean and standard deviation from the training split."""

    mean: torch.Tensor  # (n_mels,)
    std: torch.Tensor  # (n_mels,)

    def normalize(self, frames: torch.Tensor) -> torch.Tensor:
        return (frames - self.mean) / self.std

    def same_as(self, other: FeatureStats) -> bool:
        """Exactly the same statistics: two models normalize features alike."""
        return torch.equal(self.mean, other.mean) and torch.equal(self.std, other.std)


# RunningStats sums this many frames at a time (21 MB of float64 each): a 42 h feature cache
# converted at once took 24 GB and was killed for memory.
STATS_SLICE_FRAMES = 1 << 15


class RunningStats:
    """Accumulates sums in float64 so that hours of frames give exact statistics."""

    def __init__(self, n_mels: int):
        self.count = 0
        self.total = torch.zeros(n_mels, dtype=torch.float64)
        self.total_sq = torch.zeros(n_mels, dtype=torch.float64)

    def update(self, frames: torch.Tensor) -> None:
        self.count += frames.shape[0]
        for start in range(0, frames.shape[0], STATS_SLICE_FRAMES):
            part = frames[start : start + STATS_SLICE_FRAMES].to(torch.float64)
            self.total += part.sum(0)
            self.total_sq += (part**2).sum(0)

    def result(self) -> FeatureStats:
        if self.count == 0:
            raise ValueError("no frames were accumulated; expected at least one")
        mean = self.total / self.count
        var = (self.total_sq / self.count - mean**2).clamp_min(1e-8)
        return FeatureStats(mean=mean.float(), std=var.sqrt().float())
