"""A model folder: config.json, model.safetensors, feature_stats.safetensors, en.model, de.model,
transcript.model where the cascade reads pieces of its own (config `transcript_vocab`), and
optionally the transcript word LM (lm.arpa, lexicon.txt) for CTC beam search.

Loading reads JSON, safetensors, sentencepiece and text files only: nothing is unpickled.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from safetensors.torch import load_file, save_file

from .config import ModelConfig
from .decoding import BeamOptions, CtcBeamSearch, WordLM
from .features import FeatureStats
from .lm import LEXICON_FILE, LM_FILE
from .model import SpeechTranslator
from .text import Tokenizer

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "base"
# Output layers tied to their embeddings: saved once, under the embedding's name.
TIED = ("decoder.out.weight", "transcript_decoder.out.weight")
FILES = ("config.json", "model.safetensors", "feature_stats.safetensors", "en.model", "de.model")
TRANSCRIPT_TOKENIZER = "transcript.model"


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
        tokens = [self.en.sp.id_to_piece(i) for i in range(len(self.en))]
        return WordLM(self.lm_folder / LEXICON_FILE, self.lm_folder / LM_FILE, tokens)

    def beam_search(self, options: BeamOptions | None) -> CtcBeamSearch | None:
        """A transcript beam search, or None for greedy CTC (no options, or no word LM)."""
        if options is None or not self.has_lm:
            return None
        return CtcBeamSearch(self.word_lm, options, self.config.frame_ms)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.config.save(folder / "config.json")
        state = {k: v.contiguous() for k, v in self.model.state_dict().items()}
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


def transcript_pieces(folder: Path, config: ModelConfig) -> Tokenizer | None:
    """The cascade's own source tokenizer in a model or work folder, if the config asks for one."""
    if not config.transcript_vocab:
        return None
    if not (folder / TRANSCRIPT_TOKENIZER).is_file():
        raise ModelFolderError(
            f"{folder}: config.json sets transcript_vocab but {TRANSCRIPT_TOKENIZER} is missing"
        )
    return Tokenizer(folder / TRANSCRIPT_TOKENIZER)


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
        lm_folder=folder if all((folder / f).is_file() for f in (LM_FILE, LEXICON_FILE)) else None,
        transcript_pieces=pieces,
    )
