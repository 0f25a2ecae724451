"""A word LSTM language model of English transcripts, mixed with the n-gram in beam search.

The n-gram (lm.py) sees two words back; the LSTM sees the whole segment so far. The beam search
scores each word it completes with log10(mix * p_lstm + (1 - mix) * p_ngram) (decoding.py):
linear interpolation, which beats either model alone on held-out text. The vocabulary is the
word LM's lexicon, so every word the search can write has an LSTM probability.

`forward` scores whole sentences (training); `step` one word at a time (search): equal, tested.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, safe_open, save_file
from torch import Tensor, nn
from tqdm import tqdm

log = logging.getLogger(__name__)

WORD_RNN_FILE = "word_rnn.safetensors"
BOS, EOS, UNK = "<s>", "</s>", "<unk>"


@dataclass(frozen=True)
class WordRnnConfig:
    dim: int = 256  # embedding and LSTM width (the output layer is tied to the embedding)
    layers: int = 1  # LSTM layers
    dropout: float = 0.3  # on the embeddings and the LSTM's output (training only)


@dataclass(frozen=True)
class RnnState:
    """The LSTM's memory after the words read so far."""

    h: np.ndarray  # (layers, dim)
    c: np.ndarray  # (layers, dim)


class WordRnn(nn.Module):
    def __init__(self, words: Sequence[str], cfg: WordRnnConfig):
        super().__init__()
        self.cfg = cfg
        self.words = [BOS, EOS, UNK, *(w for w in words if w not in (BOS, EOS, UNK))]
        self.index = {w: i for i, w in enumerate(self.words)}
        self.embed = nn.Embedding(len(self.words), cfg.dim)
        self.lstm = nn.LSTM(
            cfg.dim, cfg.dim, cfg.layers, batch_first=True,
            dropout=cfg.dropout if cfg.layers > 1 else 0.0,
        )  # fmt: skip
        self.dropout = nn.Dropout(cfg.dropout)

    @property
    def bos_id(self) -> int:
        return self.index[BOS]

    @property
    def eos_id(self) -> int:
        return self.index[EOS]

    def encode(self, words: Sequence[str]) -> list[int]:
        """<s> words </s> as ids; words outside the vocabulary read as <unk>."""
        unk = self.index[UNK]
        return [self.bos_id, *(self.index.get(w, unk) for w in words), self.eos_id]

    def forward(self, ids: Tensor) -> Tensor:
        """(B, T) word ids -> (B, T, V) logits of the next word."""
        hidden, _ = self.lstm(self.dropout(self.embed(ids)))
        return F.linear(self.dropout(hidden), self.embed.weight)

    def init_state(self) -> RnnState:
        zeros = np.zeros((self.cfg.layers, self.cfg.dim), dtype=np.float32)
        return RnnState(zeros, zeros)

    def step(self, word: int, state: RnnState) -> tuple[np.ndarray, RnnState]:
        """Read one word -> (V,) log10-probs of the next, and the state after it.

        The beam search calls this once per new context, one at a time, so it runs in numpy:
        a fifth of the time of torch's LSTM and matrix-vector calls at this size."""
        layers = self._numpy_layers
        x = layers.embed[word]
        hs, cs = [], []
        for (w_ih, w_hh, bias), h, c in zip(layers.cells, state.h, state.c):
            i, f, g, o = np.split(w_ih @ x + w_hh @ h + bias, 4)  # PyTorch's gate order
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
            x = _sigmoid(o) * np.tanh(c)
            hs.append(x)
            cs.append(c)
        logits = layers.embed @ x
        top = logits.max()
        log_z = top + math.log(np.exp(logits - top).sum())
        return (logits - log_z) / math.log(10), RnnState(np.stack(hs), np.stack(cs))

    @cached_property
    def _numpy_layers(self) -> _NumpyLayers:
        def array(t: Tensor) -> np.ndarray:
            return t.detach().float().numpy().copy()

        cells = []
        for n in range(self.cfg.layers):
            w_ih, w_hh = (array(getattr(self.lstm, f"weight_{k}_l{n}")) for k in ("ih", "hh"))
            bias = array(getattr(self.lstm, f"bias_ih_l{n}") + getattr(self.lstm, f"bias_hh_l{n}"))
            cells.append((w_ih, w_hh, bias))
        return _NumpyLayers(array(self.embed.weight), cells)

    def save(self, path: Path) -> None:
        metadata = {"config": json.dumps(asdict(self.cfg)), "words": json.dumps(self.words)}
        state = {k: v.contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(path), metadata=metadata)

    @classmethod
    def load(cls, path: Path) -> WordRnn:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata()
        model = cls(json.loads(metadata["words"]), WordRnnConfig(**json.loads(metadata["config"])))
        model.load_state_dict(load_file(str(path)))
        return model.eval()


@dataclass(frozen=True)
class _NumpyLayers:
    """The weights `WordRnn.step` reads (taken once, after training or loading)."""

    embed: np.ndarray  # (V, dim), also the output layer
    cells: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # per layer: W_ih, W_hh, bias


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _batches(sentences: list[list[int]], size: int, generator: torch.Generator | None):
    """(inputs, targets) of `size` sentences, padded; targets -100 where padded."""
    order = (
        torch.randperm(len(sentences), generator=generator).tolist()
        if generator is not None
        else list(range(len(sentences)))
    )
    for i in range(0, len(order), size):
        batch = [sentences[j] for j in order[i : i + size]]
        longest = max(map(len, batch))
        ids = torch.full((len(batch), longest), -100)
        for row, sentence in enumerate(batch):
            ids[row, : len(sentence)] = torch.tensor(sentence)
        yield ids[:, :-1].clamp(min=0), ids[:, 1:]


@torch.inference_mode()
def perplexity(model: WordRnn, sentences: list[list[str]]) -> float:
    """Per-word perplexity (</s> counted as a word) of whole sentences."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for inputs, targets in _batches([model.encode(s) for s in sentences], 256, None):
        logits = model(inputs)
        total += F.cross_entropy(logits.transpose(1, 2), targets, reduction="sum").item()
        count += int((targets >= 0).sum())
    model.train(was_training)
    return math.exp(total / count)


def train_word_rnn(
    model: WordRnn,
    train: list[list[str]],
    val: list[list[str]],
    epochs: int,
    lr: float = 2e-3,
    batch_sentences: int = 64,
    seed: int = 0,
) -> list[float]:
    """Fit `model` to word lists; keep the weights of the epoch with the lowest validation
    perplexity (returned per epoch). The learning rate falls by 0.7 after each epoch.
    Ctrl-C ends training early with the best weights so far."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    data = [model.encode(s) for s in train]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.7)
    history: list[float] = []
    best = None
    model.train()
    try:
        for epoch in range(1, epochs + 1):
            bar = tqdm(
                _batches(data, batch_sentences, generator),
                total=math.ceil(len(data) / batch_sentences),
                desc=f"epoch {epoch}/{epochs}",
                unit="batch",
            )
            for inputs, targets in bar:
                loss = F.cross_entropy(model(inputs).transpose(1, 2), targets)
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                bar.set_postfix(loss=f"{loss.item():.3f}")
            schedule.step()
            history.append(perplexity(model, val))
            log.info("epoch %d: validation perplexity %.2f", epoch, history[-1])
            if history[-1] == min(history):
                best = {k: v.clone() for k, v in model.state_dict().items()}
    except KeyboardInterrupt:
        log.warning("interrupted after %d epochs: keeping the best so far", len(history))
    if best is not None:
        model.load_state_dict(best)
    model.eval()
    return history
