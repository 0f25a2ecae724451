"""A model folder: config.json, model.safetensors, feature_stats.safetensors, en.model, de.model.

Loading reads JSON, safetensors and sentencepiece files only: nothing is unpickled.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import load_file, save_file

from .config import ModelConfig
from .features import FeatureStats
from .model import SpeechTranslator
from .text import Tokenizer

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "base"
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

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.config.save(folder / "config.json")
        state = {k: v.contiguous() for k, v in self.model.state_dict().items()}
        state.pop("decoder.out.weight", None)  # tied to decoder.embed.weight
        save_file(state, str(folder / "model.safetensors"))
        save_file(
            {"mean": self.stats.mean, "std": self.stats.std},
            str(folder / "feature_stats.safetensors"),
        )
        for tok, name in ((self.en, "en.model"), (self.de, "de.model")):
            if tok.path.resolve() != (folder / name).resolve():
                shutil.copyfile(tok.path, folder / name)


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
    if unexpected or set(missing_keys) - {"decoder.out.weight"}:
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
    )
