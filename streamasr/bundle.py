"""A model folder: config.json, model.safetensors, feature_stats.safetensors, en.model, de.model,
transcript.model where the cascade reads pieces of its own (config `transcript_vocab`), and
optionally the transcript word LM (lm.arpa, lexicon.txt) for CTC beam search.

Loading reads JSON, safetensors, sentencepiece and text files only: nothing is unpickled.
"""

from __future__ import annotations

import dataclasses
import filecmp
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .config import ModelConfig
from .decoding import BeamOptions, CtcBeamSearch, WordLM
from .features import FeatureStats
from .lm import LEXICON_FILE, LM_FILE, boost_arpa, spell
from .model import SpeechTranslator
from .text import Tokenizer

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "base"
# Output layers tied to their embeddings: saved once, under the embedding's name.
TIED = ("decoder.out.weight", "transcript_decoder.out.weight")
FILES = ("config.json", "model.safetensors", "feature_stats.safetensors", "en.model", "de.model")
TRANSCRIPT_TOKENIZER = "transcript.model"
# What a companion encoder shares with the main one (`with_companion`): all but the depth.
COMPANION_FIELDS = (
    "n_mels",
    "feature_hop_ms",
    "subsampling_layers",
    "subsampling_channels",
    "d_model",
    "n_heads",
    "d_ff",
    "conv_kernel",
    "left_context_frames",
    "lookahead_frames",
    "right_context_frames",
    "en_vocab",
)


class ModelFolderError(ValueError):
    """A model folder that is missing or incomplete."""


@dataclass
class Bundle:
    config: ModelConfig
    model: SpeechTranslator
    stats: FeatureStats
    en: Tokenizer
    de: Tokenizer
    lm_folder: Path | None = None  # holds lm.arpa and lexicon.txt
    # The cascade's source pieces (transcript.model); None: it reads en.model's, as the CTC writes.
    transcript_pieces: Tokenizer | None = None

    @property
    def transcript_tokenizer(self) -> Tokenizer:
        """The tokenizer the cascade translator reads transcript words with."""
        return self.transcript_pieces or self.en

    @property
    def has_lm(self) -> bool:
        return self.lm_folder is not None

    @cached_property
    def word_lm(self) -> WordLM:
        if self.lm_folder is None:
            raise ModelFolderError("this model folder has no word LM (lm.arpa, lexicon.txt)")
        return WordLM(self.lm_folder / LEXICON_FILE, self.lm_folder / LM_FILE, self._pieces)

    @property
    def _pieces(self) -> list[str]:
        return [self.en.sp.id_to_piece(i) for i in range(len(self.en))]

    def boost_words(self, boost: Mapping[str, float]) -> list[str]:
        """Make the transcript search favour these words, each by its bonus (log10 of LM
        probability, in every context; `boost_arpa`), and know those the lexicon lacks. Returns
        the words the transcript pieces cannot spell, which are left out."""
        if self.lm_folder is None:
            raise ModelFolderError("this model folder has no word LM (lm.arpa, lexicon.txt)")
        spellings = {word: spell(word, self.en) for word in boost}
        spelled = {word: pieces for word, pieces in spellings.items() if pieces is not None}
        with tempfile.TemporaryDirectory() as tmp:  # KenLM reads the whole file at once
            arpa = Path(tmp) / LM_FILE
            boost_arpa(self.lm_folder / LM_FILE, arpa, {w: boost[w] for w in spelled})
            self.word_lm = WordLM(self.lm_folder / LEXICON_FILE, arpa, self._pieces, spelled)
        unspelled = [word for word in boost if word not in spelled]
        return unspelled

    def beam_search(self, options: BeamOptions | None) -> CtcBeamSearch | None:
        """A transcript beam search, or None for greedy CTC (no options, or no word LM)."""
        if options is None or not self.has_lm:
            return None
        return CtcBeamSearch(self.word_lm, options, self.config.frame_ms)

    def save(self, folder: Path, dtype: str = "float32") -> None:
        """Write the model folder, the weights stored as torch's `dtype` ("float16" or
        "bfloat16" halve the file; loading casts them back to float32; the feature statistics
        stay float32)."""
        folder.mkdir(parents=True, exist_ok=True)
        self.config.save(folder / "config.json")
        stored = getattr(torch, dtype)
        state = {
            k: (v.to(stored) if v.is_floating_point() else v).contiguous()
            for k, v in self.model.state_dict().items()
        }
        for name in TIED:
            state.pop(name, None)
        save_file(state, str(folder / "model.safetensors"))
        save_file(
            {"mean": self.stats.mean, "std": self.stats.std},
            str(folder / "feature_stats.safetensors"),
        )
        tokenizers = [(self.en, "en.model"), (self.de, "de.model")]
        if self.transcript_pieces is not None:
            tokenizers.append((self.transcript_pieces, TRANSCRIPT_TOKENIZER))
        for tok, name in tokenizers:
            if tok.path.resolve() != (folder / name).resolve():
                shutil.copyfile(tok.path, folder / name)
        if self.lm_folder is not None and self.lm_folder.resolve() != folder.resolve():
            for name in (LM_FILE, LEXICON_FILE):
                shutil.copyfile(self.lm_folder / name, folder / name)


def lm_folder(folder: Path) -> Path | None:
    """`folder` if it holds a word LM (lm.arpa and lexicon.txt), else None."""
    return folder if all((folder / name).is_file() for name in (LM_FILE, LEXICON_FILE)) else None


def transcript_pieces(folder: Path, config: ModelConfig) -> Tokenizer | None:
    """The cascade's own source tokenizer in a model or work folder, if the config asks for one."""
    if not config.transcript_vocab:
        return None
    if not (folder / TRANSCRIPT_TOKENIZER).is_file():
        raise ModelFolderError(
            f"{folder}: config.json sets transcript_vocab but {TRANSCRIPT_TOKENIZER} is missing"
        )
    return Tokenizer(folder / TRANSCRIPT_TOKENIZER)


def _check_same_inputs(first: Bundle, first_folder: Path, other: Bundle, folder: Path) -> None:
    """Both folders read the same features and write the same pieces: tokenizers and feature
    statistics identical, else ModelFolderError."""
    pieces = (first.en, first.de, first.transcript_pieces)
    names = [tok.path.name for tok in pieces if tok is not None]
    stats_differ = not other.stats.same_as(first.stats)
    differ = [n for n in names if not filecmp.cmp(first_folder / n, folder / n, shallow=False)]
    if stats_differ or differ:
        what = ", ".join(differ + ["feature_stats.safetensors"] * stats_differ)
        raise ModelFolderError(f"{folder}: {what} differ from {first_folder}'s")


def average_bundles(folders: Sequence[Path]) -> Bundle:
    """The uniform mean of the weights of model folders that differ in nothing else (the same
    config.json, tokenizers and feature statistics): a weight average of runs fine-tuned one
    from another. A tensor alike in every folder is kept as it is (a mean of three equal floats
    can round off them), so weights no run changed stay bit for bit. The first folder's word LM
    comes with it."""
    if len(folders) < 2:
        raise ModelFolderError("averaging needs at least two model folders")
    bundles = [load_bundle(folder) for folder in folders]
    first = bundles[0]
    for folder, other in zip(folders[1:], bundles[1:]):
        if other.config != first.config:
            raise ModelFolderError(f"{folder}: config.json differs from {folders[0]}'s")
        _check_same_inputs(first, folders[0], other, folder)
    states = [bundle.model.state_dict() for bundle in bundles]
    mean = {
        name: sum(state[name] for state in states) / len(states)
        if tensor.is_floating_point()
        and not all(torch.equal(tensor, state[name]) for state in states[1:])
        else tensor
        for name, tensor in states[0].items()
    }
    first.model.load_state_dict(mean)
    return first


def with_companion(main: Path, second: Path, weight: float = 0.5) -> Bundle:
    """The folder `main` with the encoder and CTC head of `second` as its companion (config
    `companion_encoder_layers`): the transcript reads the weighted mean of both recognizers'
    posteriors, `weight` the companion's share; everything else is main's. Both must read the
    same features and write the same pieces, and their encoders differ in depth at most (the
    same frames, chunk grid and right context)."""
    first, other = load_bundle(main), load_bundle(second)
    if first.model.companion is not None or other.model.companion is not None:
        raise ModelFolderError("a companion's model folder must not have a companion itself")
    if other.config.self_condition_layers:
        raise ModelFolderError(f"{second}: a self-conditioned encoder cannot be a companion")
    differ = [n for n in COMPANION_FIELDS if getattr(first.config, n) != getattr(other.config, n)]
    if differ:
        raise ModelFolderError(
            f"{second}: config.json differs from {main}'s in {', '.join(differ)}"
        )
    _check_same_inputs(first, main, other, second)
    config = dataclasses.replace(
        first.config,
        companion_encoder_layers=other.config.encoder_layers,
        companion_weight=weight,
    )
    model = SpeechTranslator(config)
    state = first.model.state_dict()
    for part in ("encoder", "ctc_head"):
        for name, tensor in getattr(other.model, part).state_dict().items():
            state[f"companion.{part}.{name}"] = tensor
    model.load_state_dict(state)
    model.eval()
    return dataclasses.replace(first, config=config, model=model)


def without_companion(bundle: Bundle, source: Path) -> Bundle:
    """The bundle's main recognizer alone, its companion encoder and CTC head dropped: the
    folder `with_companion` started from (the companion's share back to its default)."""
    if bundle.model.companion is None:
        raise ModelFolderError(f"{source}: has no companion encoder to drop")
    config = dataclasses.replace(
        bundle.config, companion_encoder_layers=0, companion_weight=ModelConfig.companion_weight
    )
    model = SpeechTranslator(config)
    state = bundle.model.state_dict()
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("companion.")})
    model.eval()
    return dataclasses.replace(bundle, config=config, model=model)


def load_bundle(folder: str | Path | None = None) -> Bundle:
    folder = Path(folder) if folder is not None else DEFAULT_MODEL_DIR
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise ModelFolderError(f"{folder}: not a model folder (missing {', '.join(missing)})")
    config = ModelConfig.load(folder / "config.json")
    pieces = transcript_pieces(folder, config)
    model = SpeechTranslator(config)
    missing_keys, unexpected = model.load_state_dict(
        load_file(str(folder / "model.safetensors")), strict=False
    )
    if unexpected or set(missing_keys) - set(TIED):
        raise ModelFolderError(
            f"{folder}: weights do not match config.json ({missing_keys + unexpected})"
        )
    model.eval()
    stats = load_file(str(folder / "feature_stats.safetensors"))
    return Bundle(
        config=config,
        model=model,
        stats=FeatureStats(mean=stats["mean"], std=stats["std"]),
        en=Tokenizer(folder / "en.model"),
        de=Tokenizer(folder / "de.model"),
        lm_folder=lm_folder(folder),
        transcript_pieces=pieces,
    )
