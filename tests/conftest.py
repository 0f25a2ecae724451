"""Shared fixtures: tiny seeded models and tiny synthetic audio, no ../shared needed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamasr.config import ModelConfig


@pytest.fixture
def tiny_config() -> ModelConfig:
    return ModelConfig(
        d_model=32,
        n_heads=2,
        d_ff=64,
        encoder_layers=2,
        conv_kernel=5,
        left_context_frames=8,
        decoder_layers=2,
        en_vocab=40,
        de_vocab=50,
        max_target_tokens=64,
        dropout=0.0,
    )


@pytest.fixture
def tiny_model(tiny_config):
    from streamasr.model import SpeechTranslator

    torch.manual_seed(0)
    return SpeechTranslator(tiny_config).eval()


def make_tone() -> np.ndarray:
    """2.3 s of tones hopping every 80 ms, with noise: varied but deterministic 16 kHz audio."""
    rng = np.random.default_rng(0)
    t = np.arange(int(2.3 * 16000)) / 16000
    freq = np.repeat(rng.uniform(150, 3000, size=t.size // 1280 + 1), 1280)[: t.size]
    signal = 0.3 * np.sin(2 * np.pi * np.cumsum(freq) / 16000) + 0.02 * rng.standard_normal(t.size)
    return signal.astype(np.float32)


@pytest.fixture
def tone() -> np.ndarray:
    return make_tone()


def calibrate_ctc_head(model, stats) -> None:
    """Make a random model's CTC labels follow its input: blank on silence, varied on sound.

    A random encoder's outputs differ little from frame to frame; the head is centred on their
    mean and scaled, and its blank row points from sound towards silence.
    """
    from streamasr.features import LogMel

    def encode(audio):
        feats = stats.normalize(LogMel()(torch.from_numpy(audio)))[None]
        return model.encoder(feats, torch.tensor([feats.shape[1]]), 4)[0][0]

    with torch.no_grad():
        tone = make_tone()
        sound = encode(tone)
        silence = encode(np.concatenate([tone, np.zeros(48000, np.float32)]))[
            len(tone) // 1280 + 2 :
        ]
        mean_sound, mean_silence = sound.mean(0), silence.mean(0)
        spread = (sound - mean_sound).norm(dim=-1).mean()
        weight = torch.randn(
            model.ctc_head.weight.shape, generator=torch.Generator().manual_seed(0)
        )
        weight *= 4 / spread / weight.shape[1] ** 0.5
        to_silence = mean_silence - mean_sound
        direction = to_silence / to_silence.norm()
        weight -= (weight @ direction)[:, None] * direction[None, :]  # labels ignore loudness
        weight[0] = 8 * to_silence / to_silence.norm() ** 2
        model.ctc_head.weight.copy_(weight)
        model.ctc_head.bias.copy_(-weight @ mean_sound)
        model.ctc_head.bias[0] -= 4.0


SENTENCES_EN = [
    "a man in an orange hat starring at something",
    "two dogs play in the snow",
    "a little girl climbs into a wooden playhouse",
    "people are walking down a busy street",
    "a woman is sitting on a bench reading a book",
    "the boy jumps into the blue water",
    "several men in hard hats are working",
    "a black dog runs across the green grass",
] * 4
SENTENCES_DE = [
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "Zwei Hunde spielen im Schnee.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "Leute gehen eine belebte Straße entlang.",
    "Eine Frau sitzt auf einer Bank und liest ein Buch.",
    "Der Junge springt ins blaue Wasser.",
    "Mehrere Männer mit Schutzhelmen arbeiten.",
    "Ein schwarzer Hund rennt über das grüne Gras.",
] * 4


@pytest.fixture(scope="session")
def tiny_bundle_dir(tmp_path_factory):
    """A complete model folder with random weights and real (tiny) tokenizers."""
    from streamasr.bundle import Bundle
    from streamasr.config import ModelConfig
    from streamasr.features import FeatureStats
    from streamasr.model import SpeechTranslator
    from streamasr.text import train_tokenizer

    folder = tmp_path_factory.mktemp("tiny_model")
    en = train_tokenizer(SENTENCES_EN, folder / "en", 40)
    de = train_tokenizer(SENTENCES_DE, folder / "de", 60)
    cfg = ModelConfig(
        d_model=32, n_heads=2, d_ff=64, encoder_layers=2, conv_kernel=5, left_context_frames=16,
        decoder_layers=2, en_vocab=len(en), de_vocab=len(de), max_target_tokens=64, dropout=0.0,
        transcript_encoder_layers=1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = SpeechTranslator(cfg).eval()
    stats = FeatureStats(mean=torch.full((80,), -8.0), std=torch.full((80,), 4.0))
    calibrate_ctc_head(model, stats)
    Bundle(cfg, model, stats, en, de).save(folder)
    return folder


@pytest.fixture(scope="session")
def companion_bundle_dir(tiny_bundle_dir, tmp_path_factory):
    """The tiny model folder with a companion: another seeded encoder of one block, its CTC
    head calibrated as the first's (`streamasr companion`)."""
    import dataclasses

    from streamasr.bundle import load_bundle, with_companion
    from streamasr.model import SpeechTranslator

    tiny = load_bundle(tiny_bundle_dir)
    second = tmp_path_factory.mktemp("tiny_second")
    torch.manual_seed(1)
    model = SpeechTranslator(dataclasses.replace(tiny.config, encoder_layers=1)).eval()
    calibrate_ctc_head(model, tiny.stats)
    dataclasses.replace(tiny, config=model.cfg, model=model).save(second)
    folder = tmp_path_factory.mktemp("tiny_companion")
    with_companion(tiny_bundle_dir, second).save(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_bundle(tiny_bundle_dir):
    from streamasr.bundle import load_bundle

    return load_bundle(tiny_bundle_dir)


@pytest.fixture(scope="session")
def tiny_lm_bundle(tiny_bundle_dir, tmp_path_factory):
    """The tiny model folder plus a word LM and lexicon of its English sentences."""
    import shutil

    from streamasr.bundle import load_bundle
    from streamasr.lm import build_transcript_lm
    from streamasr.text import Tokenizer

    folder = tmp_path_factory.mktemp("tiny_lm_model")
    shutil.copytree(tiny_bundle_dir, folder, dirs_exist_ok=True)
    build_transcript_lm(SENTENCES_EN, Tokenizer(folder / "en.model"), folder)
    return load_bundle(folder)


def simuleval_scores(folder, metrics: list[str]):
    """SimulEval 1.1.4's own scores of the instance log in `folder` (`simuleval --score-only
    --output folder --latency-metrics ...`, its argument parsing and evaluator run in process):
    a row with BLEU and each metric."""
    options = pytest.importorskip("simuleval.options")
    evaluator = pytest.importorskip("simuleval.evaluator.evaluator")
    parser = options.general_parser()
    for add in (options.add_evaluator_args, options.add_scorer_args, options.add_dataloader_args):
        add(parser)
    args = parser.parse_args(
        ["--score-only", "--output", str(folder), "--latency-metrics", *metrics]
    )
    return evaluator.SentenceLevelEvaluator.from_args(args).results.iloc[0]
