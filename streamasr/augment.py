"""Feature-domain augmentation for voice generalization, cheap enough for 2 CPU cores.

Applied to unnormalized log-mel frames (T, n_mels) of one utterance:
- speed: resample the frame axis (a tempo change; phone durations stretch);
- vocal-tract-length warp: resample the mel axis (formants move, as between speakers);
- gain, an optional smooth random colouring of the mel axis (spectral tilt and broad bumps, as
  between voices and channels), optional late reverberation (each frame's power decays
  exponentially into the frames after it, as in a room), optional digital silence of random
  length before the speech, and additive noise in the power domain, at a random SNR;
then, after normalization, SpecAugment time and frequency masks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .features import FeatureConfig


@dataclass(frozen=True)
class AugmentConfig:
    speed_range: tuple[float, float] = (0.85, 1.15)  # frame-axis stretch factors
    warp_range: tuple[float, float] = (0.88, 1.12)  # mel-axis warp (VTLP-like)
    gain_db: float = 8.0  # +- uniform gain
    eq_db: float = 0.0  # at most this much smooth colouring of the mel axis; 0: none (no draws)
    eq_terms: int = 3  # cosines over the mel axis the colouring sums (1: a tilt only)
    reverb_prob: float = 0.0  # chance of late reverberation; 0: none (no draws)
    rt60_range: tuple[float, float] = (0.2, 0.8)  # seconds for the tail to fall by 60 dB
    drr_db_range: tuple[float, float] = (0.0, 15.0)  # direct-path power over the tail's, in dB
    lead_silence_frames: int = 0  # up to this many frames of digital silence put before the
    # speech (a stream's silence before a sentence); 0: none (no draws)
    silence_log: float = math.log(FeatureConfig().log_floor)  # a silent frame's log-mel
    noise_prob: float = 0.2  # chance of additive noise
    snr_db_range: tuple[float, float] = (5.0, 30.0)
    freq_masks: int = 2  # SpecAugment
    freq_mask_bins: int = 12
    time_masks_per_second: float = 1.0
    time_mask_frames: int = 10


def _resample_axis(x: torch.Tensor, factor: float, dim: int) -> torch.Tensor:
    """Linear resampling of one axis of a (T, F) tensor to round(size * factor) points."""
    size = x.shape[dim]
    new_size = max(1, round(size * factor))
    moved = x.transpose(dim, -1)[None]  # (1, other, size)
    out = F.interpolate(moved, size=new_size, mode="linear", align_corners=True)[0]
    return out.transpose(dim, -1)


def vtlp(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """Warp the mel axis by alpha, keeping the number of bins: bin m reads bin m / alpha."""
    n = x.shape[1]
    source = (torch.arange(n, dtype=torch.float32) / alpha).clamp(0, n - 1)
    lo = source.floor().long()
    hi = (lo + 1).clamp(max=n - 1)
    w = source - lo
    return x[:, lo] * (1 - w) + x[:, hi] * w


def spectral_colouring(n_mels: int, db: float, terms: int, gen: torch.Generator) -> torch.Tensor:
    """A random smooth curve over the mel axis in natural-log power units, at most `db` dB.

    `db` times the mean of `terms` cosines of the bin position (half a period, one period, ...)
    with amplitudes drawn from [-1, 1]: the first is a spectral tilt, the others broad bumps.
    """
    position = torch.linspace(0, math.pi, n_mels)[:, None] * torch.arange(1, terms + 1)
    amplitudes = torch.rand(terms, generator=gen) * 2 - 1
    return torch.cos(position) @ amplitudes * (db / terms * math.log(10) / 10)


def reverberate(x: torch.Tensor, rt60_s: float, drr_db: float, hop_s: float) -> torch.Tensor:
    """Late reverberation of log-mel frames (T, n_mels), in the power domain.

    Each frame's power leaks into the frames after it along an exponential decay that falls by
    60 dB in `rt60_s` at the lowest band and in 0.6 of that at the highest (air and walls absorb
    high frequencies faster); the tail holds `drr_db` dB less power than the direct path. The
    phases of a real room's reflections average out within a band, so powers add.
    """
    n_mels = x.shape[1]
    length = max(1, math.ceil(rt60_s / hop_s))
    rt60 = rt60_s * torch.linspace(1.0, 0.6, n_mels)
    delay = torch.arange(1, length + 1, dtype=torch.float32)[:, None]
    tail = 10 ** (-6 * hop_s * delay / rt60)  # (length, n_mels): power after `delay` frames
    tail = tail / tail.sum(0) * 10 ** (-drr_db / 10)
    power = x.exp().T[None]  # (1, n_mels, T)
    # tail[d - 1] weighs the frame d before: a causal convolution per band
    reverb = F.conv1d(F.pad(power, (length, 0)), tail.flip(0).T[:, None], groups=n_mels)
    return torch.log(power + reverb[..., :-1])[0].T


def augment_logmel(x: torch.Tensor, cfg: AugmentConfig, gen: torch.Generator) -> torch.Tensor:
    def uniform(lo: float, hi: float) -> float:
        return lo + (hi - lo) * torch.rand((), generator=gen).item()

    x = _resample_axis(x, 1.0 / uniform(*cfg.speed_range), dim=0)
    x = vtlp(x, uniform(*cfg.warp_range))
    x = x + uniform(-cfg.gain_db, cfg.gain_db) * math.log(10) / 10
    if cfg.eq_db > 0:
        x = x + spectral_colouring(x.shape[1], cfg.eq_db, cfg.eq_terms, gen)
    if cfg.reverb_prob > 0 and torch.rand((), generator=gen).item() < cfg.reverb_prob:
        rt60, drr = uniform(*cfg.rt60_range), uniform(*cfg.drr_db_range)
        x = reverberate(x, rt60, drr, FeatureConfig().hop_ms / 1000)
    if cfg.lead_silence_frames > 0:
        n = int(torch.randint(0, cfg.lead_silence_frames + 1, (), generator=gen))
        x = torch.cat([x.new_full((n, x.shape[1]), cfg.silence_log), x])
    if torch.rand((), generator=gen).item() < cfg.noise_prob:
        power = x.exp()
        signal_db = 10 * math.log10(power.mean().item() + 1e-10)
        noise_db = signal_db - uniform(*cfg.snr_db_range)
        tilt = torch.linspace(-1, 1, x.shape[1]) * uniform(-6, 6)  # coloured noise, in dB
        noise = 10 ** ((noise_db + tilt) / 10) * torch.rand(x.shape, generator=gen) * 2
        x = torch.log(power + noise)
    return x


def spec_augment(x: torch.Tensor, cfg: AugmentConfig, gen: torch.Generator) -> torch.Tensor:
    """Zero (the normalized mean) random bands and stretches of a (T, F) tensor."""
    x = x.clone()
    T, n = x.shape
    for _ in range(cfg.freq_masks):
        width = int(torch.randint(0, cfg.freq_mask_bins + 1, (), generator=gen))
        start = int(torch.randint(0, max(1, n - width), (), generator=gen))
        x[:, start : start + width] = 0
    for _ in range(int(cfg.time_masks_per_second * T / 100)):
        width = int(torch.randint(0, cfg.time_mask_frames + 1, (), generator=gen))
        start = int(torch.randint(0, max(1, T - width), (), generator=gen))
        x[start : start + width] = 0
    return x
