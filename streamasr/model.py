"""The network: a chunked streaming Conformer encoder with a CTC head, and a wait-k decoder.

Every streaming module has `forward` (whole sequence under the chunk mask, for training) and
`step(x, state) -> (y, state)` (one chunk, caches carried). States are frozen dataclasses
of tensors, batched on dim 0; modules hold only parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig


def rotary(x: Tensor, positions: Tensor) -> Tensor:
    """Rotate (B, H, T, Dh) by absolute positions (T,): RoPE, half-split layout."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (10000 ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (T, half)
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def sinusoids(length: int, dim: int) -> Tensor:
    """(length, dim) absolute sinusoidal positions (Vaswani et al., 2017)."""
    inv = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2) / dim)
    angles = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def last_frames(x: Tensor, n: int, dim: int) -> Tensor:
    """The last n entries of x along dim (all of them when it has fewer)."""
    return x.narrow(dim, max(0, x.shape[dim] - n), min(n, x.shape[dim]))


def chunk_starts(num_frames: int, chunk_frames: int, offset: int = 0, device=None) -> Tensor:
    """(T,) the first frame of each frame's chunk (negative for a first chunk cut short)."""
    t = torch.arange(num_frames, device=device)
    return ((t + offset) // chunk_frames) * chunk_frames - offset


def chunk_mask(
    num_frames: int, chunk_frames: int, left_frames: int, device=None, offset: int = 0
) -> Tensor:
    """(T, T) bool, True where query t may attend key s: its own chunk and left_frames before it.

    Chunks end where `offset` frames short of a multiple of chunk_frames: with `offset` frames of
    lookahead, the frames a chunk of audio completes (the first chunk is that much shorter).
    """
    t = torch.arange(num_frames, device=device)
    chunk_start = chunk_starts(num_frames, chunk_frames, offset, device)  # (T,)
    own_or_past = t[None, :] < (chunk_start[:, None] + chunk_frames)
    recent = t[None, :] >= (chunk_start[:, None] - left_frames)
    return own_or_past & recent


def lengths_to_mask(lengths: Tensor, max_len: int) -> Tensor:
    """(B,) lengths -> (B, T) bool, True on valid frames."""
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


# --------------------------------------------------------------------------- subsampling


@dataclass(frozen=True)
class SubsamplingState:
    tails: tuple[Tensor, ...]  # per conv layer, its last input frame: (B, C_in, 1, F_in)


class CausalSubsampling(nn.Module):
    """Stride-2 causal conv2d layers over (time, mel), then a projection to d_model.

    Output j of a layer sees its input frames 2j-1, 2j, 2j+1. Convolving along the mel axis
    shares weights across frequency, so a formant shift between speakers is a shift of the
    feature map, not a new pattern. Inputs are trimmed to a multiple of the total stride, so
    that the whole-sequence pass and the chunk-by-chunk pass see the same frames.
    """

    def __init__(self, n_mels: int, d_model: int, num_layers: int, channels: int):
        super().__init__()
        in_channels, self.freqs = [1] + [channels] * (num_layers - 1), [n_mels]
        for _ in range(num_layers):
            self.freqs.append((self.freqs[-1] - 3) // 2 + 1)
        self.convs = nn.ModuleList(
            nn.Conv2d(c_in, channels, kernel_size=3, stride=2) for c_in in in_channels
        )
        self.proj = nn.Linear(channels * self.freqs[-1], d_model)
        self.factor = 2**num_layers

    def init_state(self, batch: int, device=None) -> SubsamplingState:
        return SubsamplingState(
            tails=tuple(
                torch.zeros(batch, conv.in_channels, 1, freq, device=device)
                for conv, freq in zip(self.convs, self.freqs)
            )
        )

    def _layer(self, conv: nn.Conv2d, x: Tensor, tail: Tensor) -> Tensor:
        return F.gelu(conv(torch.cat([tail, x], dim=2)))  # time is dim 2 of (B, C, T, F)

    def _project(self, x: Tensor) -> Tensor:
        return self.proj(x.transpose(1, 2).flatten(2))  # (B, C, T, F) -> (B, T, d_model)

    def forward(self, feats: Tensor) -> Tensor:
        """(B, T_feat, n_mels) -> (B, T_feat // factor, d_model)."""
        x = feats[:, None, : feats.shape[1] // self.factor * self.factor]
        for conv in self.convs:
            x = self._layer(conv, x, torch.zeros_like(x[:, :, :1]))
        return self._project(x)

    def step(self, feats: Tensor, state: SubsamplingState) -> tuple[Tensor, SubsamplingState]:
        """(B, T_feat, n_mels) with T_feat a multiple of factor -> (B, T_feat // factor, d_model)."""
        if feats.shape[1] % self.factor:
            raise ValueError(
                f"step needs a multiple of {self.factor} feature frames, got {feats.shape[1]}"
            )
        x, tails = feats[:, None], []
        for conv, tail in zip(self.convs, state.tails):
            tails.append(x[:, :, -1:])
            x = self._layer(conv, x, tail)
        return self._project(x), SubsamplingState(tails=tuple(tails))


# --------------------------------------------------------------------------- encoder


@dataclass(frozen=True)
class LayerState:
    keys: Tensor  # (B, H, T_cache, Dh), rotated, at most left_context_frames
    values: Tensor  # (B, H, T_cache, Dh)
    conv_tail: Tensor  # (B, kernel - 1, D): depthwise conv inputs carried

    def forget(self, keep_frames: int) -> LayerState:
        """Only the last keep_frames frames: older keys and values dropped, older conv inputs 0."""
        kept = last_frames(self.conv_tail, keep_frames, dim=1)
        older = self.conv_tail.shape[1] - kept.shape[1]
        return LayerState(
            keys=last_frames(self.keys, keep_frames, dim=2),
            values=last_frames(self.values, keep_frames, dim=2),
            conv_tail=torch.cat([kept.new_zeros(kept.shape[0], older, kept.shape[2]), kept], 1),
        )


@dataclass(frozen=True)
class EncoderState:
    subsampling: SubsamplingState
    layers: tuple[LayerState, ...]
    frames_done: int  # encoder frames emitted so far: the absolute position of the next one
    ahead: Tensor  # (B, n, D): subsampled frames not yet complete (their chunk or lookahead)
    chunk_frames: int  # the chunk grid the blocks run on (0: one piece per step)

    def forget(self, keep_frames: int) -> EncoderState:
        """The state as if the stream had begun keep_frames frames ago: every attention cache
        cut to its last keep_frames frames, and the convolutions' inputs before those zeros, as
        at a stream's start (the subsampling's few feature frames are kept)."""
        return replace(self, layers=tuple(layer.forget(keep_frames) for layer in self.layers))


class Lookahead(nn.Module):
    """Right context before the attention blocks: each frame adds a linear map of the next
    `frames` frames. Zero at initialization, so a model warm-started with it begins as its
    source. The blocks then see at most this far ahead of their chunk, for that much latency.
    """

    def __init__(self, d_model: int, frames: int):
        super().__init__()
        self.frames = frames
        self.conv = nn.Conv1d(d_model, d_model, frames)
        nn.init.zeros_(self.conv.weight)
        nn.init.zeros_(self.conv.bias)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T + frames, D) -> (B, T, D): frames t + 1 .. t + frames added to frame t."""
        T = x.shape[1] - self.frames
        ahead = self.conv(x[:, 1:].transpose(1, 2)).transpose(1, 2)  # (B, T, D)
        return x[:, :T] + ahead


class FeedForward(nn.Sequential):
    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__(
            nn.Linear(d_model, d_ff), nn.SiLU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model)
        )


@dataclass(frozen=True)
class RightContext:
    """A whole-sequence pass with right context: chunk c ends before frame ends[c], and its R
    right-context frames (at positions ends[c] .. ends[c] + R - 1) follow the T frames in the
    sequence the blocks see, chunk after chunk."""

    ends: Tensor  # (C,)
    positions: Tensor  # (C * R,)


class ChunkedSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def _project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        return rotary(q, positions), rotary(k, positions), v  # each (B, H, T, Dh)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (B, H, T, Dh)
        B, H, T, Dh = y.shape
        return self.out(y.transpose(1, 2).reshape(B, T, H * Dh))

    def forward(self, x: Tensor, mask: Tensor, positions: Tensor) -> Tensor:
        """(B, N, D), mask (B, 1, N, N), positions (N,) -> (B, N, D)."""
        q, k, v = self._project(x, positions)
        return self._attend(q, k, v, mask)

    def step(
        self, x: Tensor, keys: Tensor, values: Tensor, start: int, left_frames: int, cached: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One chunk's block (B, C, D) at absolute position `start`: the chunk's `cached` frames,
        then its right context (seen by the block, not cached); caches trimmed to left_frames."""
        q, k, v = self._project(x, torch.arange(start, start + x.shape[1], device=x.device))
        y = self._attend(q, torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2), mask=None)
        keys = torch.cat([keys, k[:, :, :cached]], dim=2)
        values = torch.cat([values, v[:, :, :cached]], dim=2)
        # The next chunk may look back left_frames before its own start: keep exactly those.
        return y, last_frames(keys, left_frames, dim=2), last_frames(values, left_frames, dim=2)


class CausalConvModule(nn.Module):
    """Pointwise-GLU, causal depthwise conv, LayerNorm, SiLU, pointwise."""

    def __init__(self, d_model: int, kernel: int, dropout: float):
        super().__init__()
        self.kernel = kernel
        self.pointwise_in = nn.Linear(d_model, 2 * d_model)
        self.depthwise = nn.Conv1d(d_model, d_model, kernel, groups=d_model)
        self.norm = nn.LayerNorm(d_model)
        self.pointwise_out = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def _conv(self, x: Tensor) -> Tensor:
        """(N, kernel - 1 + T, D) -> (N, T, D): each output from the kernel's inputs ending
        at it."""
        x = self.depthwise(x.transpose(1, 2)).transpose(1, 2)
        return self.dropout(self.pointwise_out(F.silu(self.norm(x))))

    def forward(self, x: Tensor, right: RightContext | None = None) -> Tensor:
        """(B, T, D), or with `right` (B, T + C * R, D): the frames, then each chunk's right
        context, whose kernel reads its chunk's last frames and the right context before it."""
        x = F.glu(self.pointwise_in(x), dim=-1)
        B, _, D = x.shape
        padded = torch.cat([x.new_zeros(B, self.kernel - 1, D), x], dim=1)
        if right is None:
            return self._conv(padded)
        T = x.shape[1] - right.positions.numel()
        padded = padded[:, : self.kernel - 1 + T]
        frames = self._conv(padded)
        # Chunk c's window: the kernel - 1 frames before ends[c] (padded: frame t at t +
        # kernel - 1), then its R right-context frames. The last chunk's right context lies
        # past the end (never seen), so its window may be clipped.
        before = right.ends[:, None] + torch.arange(self.kernel - 1, device=x.device)
        before = before.clamp(max=padded.shape[1] - 1)
        windows = torch.cat([padded[:, before], x[:, T:].view(B, right.ends.numel(), -1, D)], dim=2)
        out = self._conv(windows.flatten(0, 1)).view(B, -1, D)  # (B, C * R, D)
        return torch.cat([frames, out], dim=1)

    def step(self, x: Tensor, tail: Tensor, cached: int) -> tuple[Tensor, Tensor]:
        """A chunk's block (its `cached` frames, then its right context) after `tail`."""
        x = F.glu(self.pointwise_in(x), dim=-1)
        new_tail = torch.cat([tail, x[:, :cached]], dim=1)[:, -(self.kernel - 1) :]
        return self._conv(torch.cat([tail, x], dim=1)), new_tail


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.norm_attn, self.norm_conv, self.norm_ff = (
            nn.LayerNorm(d),
            nn.LayerNorm(d),
            nn.LayerNorm(d),
        )
        self.attn = ChunkedSelfAttention(d, cfg.n_heads, cfg.dropout)
        self.conv = CausalConvModule(d, cfg.conv_kernel, cfg.dropout)
        self.ff = FeedForward(d, cfg.d_ff, cfg.dropout)
        self.dropout = nn.Dropout(cfg.dropout)

    def start_as_identity(self) -> None:
        """Zero the three residual branches' output projections: the block then passes its input
        through unchanged (every branch is added to the residual stream), while each projection
        still receives a gradient, so a model grown by such blocks starts as the one it grew from."""
        for proj in (self.attn.out, self.conv.pointwise_out, self.ff[-1]):
            nn.init.zeros_(proj.weight)
            nn.init.zeros_(proj.bias)

    def forward(
        self, x: Tensor, mask: Tensor, positions: Tensor, right: RightContext | None = None
    ) -> Tensor:
        x = x + self.dropout(self.attn(self.norm_attn(x), mask, positions))
        x = x + self.conv(self.norm_conv(x), right)
        return x + self.dropout(self.ff(self.norm_ff(x)))

    def step(
        self, x: Tensor, state: LayerState, start: int, left_frames: int, cached: int
    ) -> tuple[Tensor, LayerState]:
        y, keys, values = self.attn.step(
            self.norm_attn(x), state.keys, state.values, start, left_frames, cached
        )
        x = x + y
        y, conv_tail = self.conv.step(self.norm_conv(x), state.conv_tail, cached)
        x = x + y
        x = x + self.ff(self.norm_ff(x))
        return x, LayerState(keys=keys, values=values, conv_tail=conv_tail)


class SelfConditioning(nn.Module):
    """An intermediate CTC head and the way back: frames (B, T, D) -> the frames plus a
    projection of the head's posteriors, and the head's log-probabilities (B, T, V_en). The
    projection starts at zero, so grafted onto a trained encoder it changes nothing at first."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.en_vocab)
        self.back = nn.Linear(cfg.en_vocab, cfg.d_model)
        nn.init.zeros_(self.back.weight)
        nn.init.zeros_(self.back.bias)

    def start_as(self, norm: nn.LayerNorm, head: nn.Linear) -> None:
        """Read the frames with a trained encoder's final norm and CTC head (grafted onto it,
        the intermediate loss then starts near the final one, not at a random head's)."""
        self.norm.load_state_dict(norm.state_dict())
        self.head.load_state_dict(head.state_dict())

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        log_probs = head_log_probs(self.head, self.norm(x))
        return x + self.back(log_probs.exp().to(x.dtype)), log_probs


class StreamingEncoder(nn.Module):
    """Features -> encoder frames; a frame sees its chunk and left_context_frames before it,
    and, with lookahead_frames, that many frames after its chunk (through `Lookahead`); with
    right_context_frames, the blocks of each chunk also run over that many frames after it
    (after the lookahead's), recomputed with every chunk (Emformer's right context)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.subsampling = CausalSubsampling(
            cfg.n_mels, cfg.d_model, cfg.subsampling_layers, cfg.subsampling_channels
        )
        self.ahead = cfg.ahead_frames
        self.right = cfg.right_context_frames
        self.lookahead = (
            Lookahead(cfg.d_model, cfg.lookahead_frames) if cfg.lookahead_frames else None
        )
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        # after block i (1-based), keyed by str(i)
        self.conditioners = nn.ModuleDict(
            {str(i): SelfConditioning(cfg) for i in cfg.self_condition_layers}
        )
        self.norm = nn.LayerNorm(cfg.d_model)

    def _condition(self, i: int, x: Tensor, intermediate: list[Tensor] | None = None) -> Tensor:
        """The frames x after block i (0-based), self-conditioned if the block has a
        conditioner; its log-probs are appended to `intermediate`."""
        key = str(i + 1)
        if key not in self.conditioners:
            return x
        x, log_probs = self.conditioners[key](x)
        if intermediate is not None:
            intermediate.append(log_probs)
        return x

    def forward(
        self,
        feats: Tensor,
        feat_lengths: Tensor,
        chunk_frames: int,
        intermediate: list[Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """(B, T_feat, n_mels), (B,) -> (B, T, D), (B,) with T = T_feat // subsampling.

        chunk_frames <= 0 means full context (no chunking, no lookback limit). `intermediate`:
        a list that receives the self-conditioning heads' log-probs (B, T, V_en), lowest first.
        """
        x = self.subsampling(feats)
        lengths = feat_lengths // self.subsampling.factor
        B, T, D = x.shape
        valid = lengths_to_mask(lengths, T)  # (B, T)
        if self.lookahead is not None:  # past the end, a stream's lookahead reads zeros
            x = x * valid[:, :, None]
            x = self.lookahead(torch.cat([x, x.new_zeros(B, self.lookahead.frames, D)], dim=1))
        if chunk_frames > 0:
            allowed = chunk_mask(
                T, chunk_frames, self.cfg.left_context_frames, x.device, offset=self.ahead
            )[None]
        else:
            allowed = torch.ones(1, T, T, dtype=torch.bool, device=x.device)
        allowed = allowed & valid[:, None, :]
        positions, right = torch.arange(T, device=x.device), None
        if chunk_frames > 0 and self.right:
            x, allowed, positions, right = self._with_right_context(
                x, allowed, lengths, chunk_frames
            )
        # Padded queries may have no valid key left; their own position keeps softmax finite.
        eye = torch.eye(x.shape[1], dtype=torch.bool, device=x.device)
        allowed = (allowed | eye[None])[:, None]
        collected: list[Tensor] = []
        for i, layer in enumerate(self.layers):
            x = self._condition(i, layer(x, allowed, positions, right), collected)
        if intermediate is not None:
            intermediate += [log_probs[:, :T] for log_probs in collected]
        return self.norm(x[:, :T]), lengths

    def _with_right_context(
        self, x: Tensor, allowed: Tensor, lengths: Tensor, chunk_frames: int
    ) -> tuple[Tensor, Tensor, Tensor, RightContext]:
        """Frames (B, T, D) and their chunk mask (B, T, T) -> the frames followed by each
        chunk's right context, and the mask over both: a chunk's right context sees what the
        chunk's frames see, both see it, and no other chunk does."""
        T, device = x.shape[1], x.device
        starts, chunk = torch.unique_consecutive(
            chunk_starts(T, chunk_frames, self.ahead, device), return_inverse=True
        )  # each chunk's first frame, each frame's chunk
        ends = starts + chunk_frames
        positions = (ends[:, None] + torch.arange(self.right, device=device)).flatten()
        right_chunk = torch.arange(ends.numel(), device=device).repeat_interleave(self.right)
        first = starts.clamp(min=0)  # a frame of each chunk, whose mask row it shares
        rows = torch.cat([allowed, allowed[:, first[right_chunk]]], dim=1)  # (B, N, T)
        same = torch.cat([chunk, right_chunk])[:, None] == right_chunk[None, :]  # (N, C * R)
        exists = positions[None, :] < lengths[:, None]  # (B, C * R): within the utterance
        allowed = torch.cat([rows, same[None] & exists[:, None, :]], dim=2)
        x = torch.cat([x, x[:, positions.clamp(max=T - 1)]], dim=1)
        t = torch.arange(T, device=device)
        return x, allowed, torch.cat([t, positions]), RightContext(ends, positions)

    def init_state(self, batch: int = 1, device=None, chunk_frames: int = 0) -> EncoderState:
        """chunk_frames: the chunk size of the stream, needed with lookahead_frames."""
        cfg, head_dim = self.cfg, self.cfg.d_model // self.cfg.n_heads
        if self.ahead and chunk_frames <= 0:
            raise ValueError("a model with lookahead frames needs the stream's chunk_frames")
        empty = torch.zeros(batch, cfg.n_heads, 0, head_dim, device=device)
        tail = torch.zeros(batch, cfg.conv_kernel - 1, cfg.d_model, device=device)
        layer = LayerState(keys=empty, values=empty, conv_tail=tail)
        return EncoderState(
            subsampling=self.subsampling.init_state(batch, device),
            layers=tuple(layer for _ in self.layers),
            frames_done=0,
            ahead=torch.zeros(batch, 0, cfg.d_model, device=device),
            chunk_frames=chunk_frames,
        )

    def step(
        self, feats: Tensor, state: EncoderState, final: bool = False
    ) -> tuple[Tensor, EncoderState]:
        """Features (B, n * subsampling, n_mels) -> the encoder frames they complete (B, n', D).

        With the state's chunk_frames, a frame is complete once its chunk of the grid and the
        frames after it (lookahead and right context) have arrived, so any piece sizes give the
        same frames; the others wait in the state. On the `final` step (the end of the stream;
        n may be 0) every frame left is complete. Without chunk_frames, each step is one chunk
        (n at most its size).
        """
        if feats.shape[1]:
            x, sub_state = self.subsampling.step(feats, state.subsampling)
        else:
            x, sub_state = state.ahead[:, :0], state.subsampling
        x = torch.cat([state.ahead, x], dim=1)
        ready = x.shape[1]
        if not final:
            ready = max(0, ready - self.ahead)
            if state.chunk_frames > 0:  # back to the last chunk boundary of the grid
                end, size = state.frames_done + ready, state.chunk_frames
                ready = max(0, (end + self.ahead) // size * size - self.ahead - state.frames_done)
        ahead = x[:, ready:]
        # The last chunk's blocks also run over its right context: up to `right` frames more.
        n = min(x.shape[1], ready + self.right) if ready else 0
        if self.lookahead is not None and ready:
            L = self.lookahead.frames
            x = self.lookahead(
                torch.cat([x, x.new_zeros(x.shape[0], L, x.shape[2])], 1)[:, : n + L]
            )
        else:
            x = x[:, :n]
        pieces, layers, start = [], list(state.layers), state.frames_done
        for size in self._grid_sizes(ready, start, state.chunk_frames):
            done = start - state.frames_done
            block = x[:, done : done + size + self.right]  # the chunk, then its right context
            for i, layer in enumerate(self.layers):
                block, layers[i] = layer.step(
                    block, layers[i], start, self.cfg.left_context_frames, cached=size
                )
                block = self._condition(i, block)
            pieces.append(block[:, :size])
            start += size
        x = torch.cat(pieces, dim=1) if pieces else x[:, :0]
        new_state = replace(
            state, subsampling=sub_state, layers=tuple(layers), frames_done=start, ahead=ahead
        )
        return self.norm(x), new_state

    def _grid_sizes(self, frames: int, start: int, chunk_frames: int) -> list[int]:
        """The sizes of the pieces that `frames` frames from absolute position `start` split
        into where the chunk grid does."""
        if chunk_frames <= 0:
            return [frames] if frames else []
        sizes, done = [], 0
        while done < frames:
            to_boundary = chunk_frames - (start + done + self.ahead) % chunk_frames
            sizes.append(min(to_boundary, frames - done))
            done += sizes[-1]
        return sizes


# --------------------------------------------------------------------------- decoder


def wait_k_visible_frames(
    num_targets: int,
    source_frames: Tensor,
    wait_k: int | None,
    unit_frames: int,
    tokens_per_unit: int,
    unit_shift_frames: int = 0,
) -> Tensor:
    """(B,) source lengths -> (B, U) frames target token i may see under wait-k.

    Token i (0-based) is written once k + i // tokens_per_unit units are read (unit j ends at
    frame j * unit_frames - unit_shift_frames); wait_k=None is full context. Never fewer than
    one frame, never more than the source.
    """
    if wait_k is None:
        return source_frames[:, None].expand(-1, num_targets)
    i = torch.arange(num_targets, device=source_frames.device)
    units = wait_k + torch.div(i, tokens_per_unit, rounding_mode="floor")
    frames = units[None, :] * unit_frames - unit_shift_frames
    return torch.minimum(frames, source_frames[:, None]).clamp_min(1)


def wait_k_visible_positions(
    num_targets: int, unit_ends: list[list[int]], wait_k: int | None, tokens_per_unit: int
) -> Tensor:
    """Source units of any length (transcript words): unit_ends[b] lists the memory position
    just after each unit of row b, the last one its source length -> (B, U) positions target
    token i may see under wait-k, as wait_k_visible_frames does for fixed units."""
    i = torch.arange(num_targets)
    rows = []
    for ends in unit_ends:
        if wait_k is None or not ends:
            rows.append(torch.full((num_targets,), ends[-1] if ends else 1))
            continue
        units = (wait_k + torch.div(i, tokens_per_unit, rounding_mode="floor")).clamp_max(len(ends))
        rows.append(torch.tensor(ends)[units - 1])
    return torch.stack(rows).clamp_min(1)


@dataclass(frozen=True)
class DecoderLayerState:
    self_keys: Tensor  # (B, H, t, Dh)
    self_values: Tensor
    cross_keys: Tensor  # (B, H, S, Dh): projections of the encoder frames read so far
    cross_values: Tensor


@dataclass(frozen=True)
class DecoderState:
    layers: tuple[DecoderLayerState, ...]
    tokens_done: int  # decoder positions consumed: the position of the next input token


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, self.n_heads = cfg.d_model, cfg.n_heads
        self.norm_self, self.norm_cross, self.norm_ff = (
            nn.LayerNorm(d),
            nn.LayerNorm(d),
            nn.LayerNorm(d),
        )
        self.self_qkv = nn.Linear(d, 3 * d)
        self.self_out = nn.Linear(d, d)
        self.cross_q = nn.Linear(d, d)
        self.cross_kv = nn.Linear(d, 2 * d)
        self.cross_out = nn.Linear(d, d)
        self.ff = FeedForward(d, cfg.d_ff, cfg.dropout)
        self.dropout = cfg.dropout

    def _heads(self, x: Tensor) -> Tensor:
        B, T, D = x.shape
        return x.view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2)  # (B, H, T, Dh)

    def _merge(self, y: Tensor) -> Tensor:
        B, H, T, Dh = y.shape
        return y.transpose(1, 2).reshape(B, T, H * Dh)

    def _sdpa(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False
    ) -> Tensor:
        p = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal
        )

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        k, v = self.cross_kv(memory).chunk(2, dim=-1)
        return self._heads(k), self._heads(v)

    def _cross(self, x: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
        q = self._heads(self.cross_q(self.norm_cross(x)))
        y = self.cross_out(self._merge(self._sdpa(q, keys, values, mask)))
        return x + F.dropout(y, self.dropout, self.training)

    def _ff(self, x: Tensor) -> Tensor:
        return x + F.dropout(self.ff(self.norm_ff(x)), self.dropout, self.training)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        cross_mask: Tensor,
        whole: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """(B, U, D), (B, S, D), (B, 1, U, S) -> (B, U, D). `whole`: another memory (B, S, D)
        and which targets (B, U) attend to it in place of `memory`, under the same mask."""
        q, k, v = (self._heads(t) for t in self.self_qkv(self.norm_self(x)).chunk(3, dim=-1))
        y = self._merge(self._sdpa(q, k, v, None, causal=True))
        x = x + F.dropout(self.self_out(y), self.dropout, self.training)
        crossed = self._cross(x, *self.memory_kv(memory), cross_mask)
        if whole is not None:
            other, use = whole
            crossed = torch.where(
                use[..., None], self._cross(x, *self.memory_kv(other), cross_mask), crossed
            )
        return self._ff(crossed)

    def step(
        self, x: Tensor, state: DecoderLayerState, visible_frames: int
    ) -> tuple[Tensor, DecoderLayerState]:
        """One token (B, 1, D); it sees the first visible_frames cached encoder frames."""
        q, k, v = (self._heads(t) for t in self.self_qkv(self.norm_self(x)).chunk(3, dim=-1))
        keys = torch.cat([state.self_keys, k], dim=2)
        values = torch.cat([state.self_values, v], dim=2)
        x = x + self.self_out(self._merge(self._sdpa(q, keys, values, None)))
        cross_k = state.cross_keys[:, :, :visible_frames]
        cross_v = state.cross_values[:, :, :visible_frames]
        x = self._ff(self._cross(x, cross_k, cross_v, None))
        return x, DecoderLayerState(keys, values, state.cross_keys, state.cross_values)


class TranslationDecoder(nn.Module):
    """Transformer decoder over the encoder frames, trained prefix-to-prefix for wait-k."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.de_vocab, cfg.d_model)
        # Scaled by sqrt(d) on input and tied to the output layer: unit-scale both ways.
        nn.init.normal_(self.embed.weight, std=cfg.d_model**-0.5)
        self.register_buffer(
            "positions", sinusoids(cfg.max_target_tokens, cfg.d_model), persistent=False
        )
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.de_vocab)
        self.out.weight = self.embed.weight  # tied: fewer parameters, better small-data training

    def _embed(self, tokens: Tensor, start: int) -> Tensor:
        if start + tokens.shape[1] > self.cfg.max_target_tokens:
            raise ValueError(
                f"decoder supports {self.cfg.max_target_tokens} positions, asked for {start + tokens.shape[1]}"
            )
        return (
            self.embed(tokens) * math.sqrt(self.cfg.d_model)
            + self.positions[start : start + tokens.shape[1]]
        )

    def forward(
        self,
        tokens: Tensor,
        memory: Tensor,
        visible_frames: Tensor,
        whole: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """tokens (B, U) (bos + targets[:-1]), memory (B, S, D), visible (B, U) -> logits (B, U, V).
        `whole` (memory (B, S, D), targets (B, U) that read it): see `DecoderLayer.forward`."""
        S = memory.shape[1]
        cross_mask = (
            torch.arange(S, device=memory.device)[None, None, :] < visible_frames[:, :, None]
        )[:, None]
        x = self._embed(tokens, 0)
        for layer in self.layers:
            x = layer(x, memory, cross_mask, whole)
        return self.out(self.norm(x))

    def init_state(self, batch: int = 1, device=None) -> DecoderState:
        head_dim = self.cfg.d_model // self.cfg.n_heads
        empty = torch.zeros(batch, self.cfg.n_heads, 0, head_dim, device=device)
        layer = DecoderLayerState(empty, empty, empty, empty)
        return DecoderState(layers=tuple(layer for _ in self.layers), tokens_done=0)

    def extend_memory(self, frames: Tensor, state: DecoderState) -> DecoderState:
        """Project newly read encoder frames (B, C, D) once, into every layer's cross cache."""
        layers = []
        for layer, s in zip(self.layers, state.layers):
            k, v = layer.memory_kv(frames)
            layers.append(
                DecoderLayerState(
                    s.self_keys,
                    s.self_values,
                    torch.cat([s.cross_keys, k], 2),
                    torch.cat([s.cross_values, v], 2),
                )
            )
        return DecoderState(layers=tuple(layers), tokens_done=state.tokens_done)

    def replace_memory(self, frames: Tensor, state: DecoderState) -> DecoderState:
        """Every layer's cross cache projected anew from `frames` (B, S, D), the memory read so
        far encoded again (the whole source); the self-attention caches stay."""
        emptied = tuple(
            replace(s, cross_keys=s.cross_keys[:, :, :0], cross_values=s.cross_values[:, :, :0])
            for s in state.layers
        )
        return self.extend_memory(frames, replace(state, layers=emptied))

    def step(
        self, token: Tensor, state: DecoderState, visible_frames: int
    ) -> tuple[Tensor, DecoderState]:
        """token (B,) -> logits (B, V) for the next token, which sees visible_frames frames."""
        x = self._embed(token[:, None], state.tokens_done)
        layers = []
        for layer, s in zip(self.layers, state.layers):
            x, s = layer.step(x, s, visible_frames)
            layers.append(s)
        logits = self.out(self.norm(x))[:, 0]
        return logits, DecoderState(layers=tuple(layers), tokens_done=state.tokens_done + 1)


# --------------------------------------------------------------------------- cascade source


class TranscriptEncoder(nn.Module):
    """A causal Transformer over transcript subwords, the source of cascade translation.

    Causal, so a prefix encodes the same whatever follows: words committed while streaming are
    encoded once and never revised, exactly as in prefix-to-prefix training.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.d_model = cfg.d_model
        self.embed = nn.Embedding(cfg.cascade_source_vocab, cfg.d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                cfg.d_model,
                cfg.n_heads,
                cfg.d_ff,
                cfg.dropout,
                batch_first=True,
                norm_first=True,
            )
            for _ in range(cfg.transcript_encoder_layers)
        )
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, tokens: Tensor, causal: bool = True) -> Tensor:
        """(B, S) subword ids (right-padded with 0) -> (B, S, D); position s sees positions <= s,
        or with causal=False every position of its row (the whole source, once it has ended)."""
        S = tokens.shape[1]
        x = self.embed(tokens) * math.sqrt(self.d_model) + sinusoids(S, self.d_model).to(
            self.embed.weight
        )
        if causal:
            mask = nn.Transformer.generate_square_subsequent_mask(S, device=tokens.device)
            for layer in self.layers:
                x = layer(x, src_mask=mask, is_causal=True)
        else:
            padding = tokens == 0
            for layer in self.layers:
                x = layer(x, src_key_padding_mask=padding)
        return self.norm(x)


# --------------------------------------------------------------------------- the whole model


class CtcCompanion(nn.Module):
    """A second streaming encoder with a CTC head of its own, trained apart: its posteriors are
    averaged with the main encoder's for the transcript (an ensemble of two recognizers)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.encoder = StreamingEncoder(cfg)
        self.ctc_head = nn.Linear(cfg.d_model, cfg.en_vocab)


def head_log_probs(head: nn.Linear, frames: Tensor) -> Tensor:
    """(B, T, D) -> (B, T, V_en) log-probabilities of a CTC head (float32, under bf16 autocast
    too); id 0 is the blank."""
    return head(frames).float().log_softmax(-1)


class SpeechTranslator(nn.Module):
    """Encoder + CTC head (transcript) + wait-k decoder over the encoder frames (translation),
    optionally a cascade: transcript encoder + its own wait-k decoder, and optionally a
    companion encoder whose CTC posteriors are averaged into the transcript's."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = StreamingEncoder(cfg)
        self.ctc_head = nn.Linear(cfg.d_model, cfg.en_vocab)
        self.decoder = TranslationDecoder(cfg)
        if cfg.transcript_encoder_layers:
            cascade = replace(cfg, dropout=cfg.cascade_dropout)
            self.transcript_encoder = TranscriptEncoder(cascade)
            self.transcript_decoder = TranslationDecoder(cascade)
            if cfg.cascade_whole_encoder:
                self.whole_encoder = TranscriptEncoder(cascade)
        self.companion = None
        if cfg.companion_encoder_layers:
            self.companion = CtcCompanion(
                replace(cfg, encoder_layers=cfg.companion_encoder_layers, self_condition_layers=())
            )

    @property
    def has_cascade(self) -> bool:
        return self.cfg.transcript_encoder_layers > 0

    def encode_whole_source(self, tokens: Tensor) -> Tensor:
        """(B, S) transcript subwords of ended sources -> (B, S, D) without the causal mask, by
        the whole-source encoder if the model has one, else by the causal encoder's weights."""
        encoder = getattr(self, "whole_encoder", self.transcript_encoder)
        return encoder(tokens, causal=False)

    def ctc_log_probs(self, frames: Tensor) -> Tensor:
        """The main encoder's CTC log-probabilities (`head_log_probs`)."""
        return head_log_probs(self.ctc_head, frames)

    def transcript_log_probs(self, frames: Tensor, companion_frames: Tensor | None) -> Tensor:
        """The transcript's CTC log-probabilities (B, T, V_en): the head's over the encoder
        frames, or with a companion the log of the weighted mean of both heads' probabilities
        over the same frames (each encoder's own, `companion_frames`)."""
        log_probs = self.ctc_log_probs(frames)
        if self.companion is None:
            return log_probs
        other = head_log_probs(self.companion.ctc_head, companion_frames)
        share = self.cfg.companion_weight
        return torch.logaddexp(log_probs + math.log1p(-share), other + math.log(share))

    def encode_transcript(
        self, feats: Tensor, feat_lengths: Tensor, chunk_frames: int
    ) -> tuple[Tensor, Tensor]:
        """Whole sequences -> the encoder frames (B, T, D) and the transcript's log-probs
        (B, T, V_en), each encoder under the same chunk mask (`StreamingEncoder.forward`)."""
        frames, _ = self.encoder(feats, feat_lengths, chunk_frames)
        companion = None
        if self.companion is not None:
            companion, _ = self.companion.encoder(feats, feat_lengths, chunk_frames)
        return frames, self.transcript_log_probs(frames, companion)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
