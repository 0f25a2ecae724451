"""A model folder: config.json, model.safetensors, feature_stats.safetensors, en.model, de.model,
and optionally the transcript word LM (lm.arpa, lexicon.txt) for CTC beam search.

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
        for tok, name in ((self.en, "en.model"), (self.de, "de.model")):
            if tok.path.resolve() != (folder / name).resolve():
                shutil.copyfile(tok.path, folder / name)
        if self.lm_folder is not None and self.lm_folder.resolve() != folder.resolve():
            for name in (LM_FILE, LEXICON_FILE):
                shutil.copyfile(self.lm_folder / name, folder / name)


def load_bundle(folder: str | Path | None = None) -> Bundle:
    folder = Path(folder) if folder is not None else DEFAULT_MODEL_DIR
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise ModelFolderError(f"{folder}: not a model folder (missing {', '.join(missing)})")
    config = ModelConfig.load(folder / "config.json")
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
    )
