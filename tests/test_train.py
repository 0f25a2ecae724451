"""Training: a kill-and-resume gives exactly the weights of an uninterrupted run; export loads."""

from __future__ import annotations

import json
import logging
import math
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import SENTENCES_DE, SENTENCES_EN
from safetensors.torch import save_file

from streamasr.augment import AugmentConfig, augment_logmel, reverberate
from streamasr.bundle import ModelFolderError, average_bundles, load_bundle, with_companion
from streamasr.cli import main
from streamasr.config import ModelConfig
from streamasr.model import SpeechTranslator
from streamasr.session import Session, SessionOptions
from streamasr.train import (
    TrainConfig,
    TrainError,
    augment_config,
    autocast,
    collate,
    export,
    loss_on_batch,
    prepare,
    to_device,
    train,
    train_chunk_frames,
    train_device,
)
from streamasr.train_cascade import (
    WordNoise,
    multi30k_pairs,
    recognized_pairs,
    text_pairs,
    train_cascade,
    with_recognized,
)

TINY = ModelConfig(
    d_model=32, n_heads=2, d_ff=64, encoder_layers=1, decoder_layers=1, en_vocab=40, de_vocab=60,
    left_context_frames=16,
)  # fmt: skip


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def make_corpus(folder, tone):
    folder.mkdir()
    rng = np.random.default_rng(1)
    for split, count in (("train", 8), ("val", 2)):
        rows = []
        for i in range(count):
            audio = np.roll(tone, 1600 * i)[: 16000 + 2000 * i] * rng.uniform(0.5, 1)
            sf.write(folder / f"{split}{i}.wav", audio.astype(np.float32), 16000)
            rows.append(
                {
                    "id": f"{split}{i}",
                    "audio": f"{split}{i}.wav",
                    "text": SENTENCES_EN[i],
                    "translation": SENTENCES_DE[i],
                }
            )
        (folder / f"{split}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        )
    return folder


def test_resume_after_a_kill_is_exact(tmp_path, tone):
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(
        steps=4, batch_frames=900, val_every=1000, ckpt_every=1, val_utterances=2, warmup_steps=2,
        augment_from=2,
    )  # fmt: skip
    straight = train(corpus, tmp_path / "a", TINY, tcfg)
    train(corpus, tmp_path / "b", TINY, tcfg, stop_at=2)
    with open(tmp_path / "b" / "train_log.jsonl", "a") as log:  # a step logged, then killed
        log.write(json.dumps({"step": 3, "ctc": 0.0}) + "\n")
    resumed = train(corpus, tmp_path / "b", TINY, tcfg)
    assert_same_weights(straight, resumed)
    log = [
        json.loads(line) for line in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    assert "val" in log[-1]  # the last step validates

    bundle = load_bundle(export(tmp_path / "b", tmp_path / "model"))
    assert bundle.config == TINY
    assert torch.equal(bundle.model.ctc_head.weight, resumed.ctc_head.weight)


def test_warm_start_from_a_model_folder(tmp_path, tone):
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(
        steps=1, batch_frames=900, val_every=1000, val_utterances=2, warmup_steps=1, lr=0.0
    )
    first = train(corpus, tmp_path / "a", TINY, tcfg)
    folder = export(tmp_path / "a", tmp_path / "model")
    assert not (folder / "lm.arpa").exists()  # a run from scratch has no word LM
    (folder / "lm.arpa").write_text("\\data\\\n")
    (folder / "lexicon.txt").write_text("a\t▁a\n")
    second = train(
        corpus, tmp_path / "b", ModelConfig(), tcfg, init=folder
    )  # shape comes from init
    assert_same_weights(first, second)  # lr 0: the warm start is exactly the exported weights
    again = export(tmp_path / "b", tmp_path / "again")  # the init's word LM comes along
    for name in ("lm.arpa", "lexicon.txt"):
        assert (again / name).read_bytes() == (folder / name).read_bytes()


def test_warm_start_adds_lookahead_at_zero_then_learns_it(tmp_path, tone):
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(steps=2, batch_frames=900, val_every=1000, val_utterances=2, warmup_steps=1)
    train(corpus, tmp_path / "a", TINY, replace(tcfg, lr=0.0))
    folder = export(tmp_path / "a", tmp_path / "model")
    asked = replace(ModelConfig(), lookahead_frames=2)
    still = train(corpus, tmp_path / "b", asked, replace(tcfg, lr=0.0), init=folder)
    plain = load_bundle(folder).model
    # speech units now end where 320 ms of audio completes frames: the first is 2 frames short
    assert still.cfg == replace(TINY, lookahead_frames=2, unit_shift_frames=2)
    feats, lengths = torch.randn(1, 200, 80), torch.tensor([200])
    with torch.no_grad():  # at zero the added map changes nothing (the chunk grid moves)
        full = still.eval().encoder(feats, lengths, -1)[0]
        assert torch.equal(full, plain.encoder(feats, lengths, -1)[0])
    learnt = train(corpus, tmp_path / "c", asked, tcfg, init=folder)
    assert learnt.encoder.lookahead.conv.weight.abs().max() > 0
    exported = load_bundle(export(tmp_path / "c", tmp_path / "model_c"))
    assert exported.config.lookahead_frames == exported.config.unit_shift_frames == 2
    again = train(
        corpus, tmp_path / "d", ModelConfig(), replace(tcfg, lr=0.0), init=tmp_path / "model_c"
    )
    assert_same_weights(exported.model, again)


def test_right_context_replaces_the_init_lookahead(tmp_path, tone):
    """--right-context-frames on a lookahead model: its other weights carry over, the
    lookahead's map is dropped, and speech units follow the right context."""
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(steps=2, batch_frames=900, val_every=1000, val_utterances=2, warmup_steps=1)
    train(corpus, tmp_path / "a", replace(TINY, lookahead_frames=2), tcfg)
    folder = export(tmp_path / "a", tmp_path / "model")
    tcfg = replace(tcfg, lr=0.0)
    asked = replace(ModelConfig(), right_context_frames=3)
    model = train(corpus, tmp_path / "b", asked, tcfg, init=folder)
    assert model.cfg == replace(TINY, right_context_frames=3, unit_shift_frames=3)
    source = load_bundle(folder).model.state_dict()
    kept = {k: v for k, v in source.items() if not k.startswith("encoder.lookahead.")}
    assert kept.keys() == model.state_dict().keys()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in kept.items())
    both = train(corpus, tmp_path / "c", replace(asked, lookahead_frames=2), tcfg, init=folder)
    assert both.cfg.ahead_frames == both.cfg.unit_shift_frames == 5
    learnt = source["encoder.lookahead.conv.weight"]
    assert learnt.abs().max() > 0 and torch.equal(both.encoder.lookahead.conv.weight, learnt)


def test_added_encoder_layers_start_as_the_identity_then_learn(tmp_path, tone):
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(steps=2, batch_frames=900, val_every=1000, val_utterances=2, warmup_steps=1)
    train(corpus, tmp_path / "a", TINY, tcfg)
    folder = export(tmp_path / "a", tmp_path / "model")
    plain = load_bundle(folder).model
    grown = train(
        corpus, tmp_path / "b", ModelConfig(), replace(tcfg, lr=0.0), init=folder,
        add_encoder_layers=2,
    )  # fmt: skip
    assert grown.cfg == replace(TINY, encoder_layers=3)
    feats, lengths = torch.randn(1, 200, 80), torch.tensor([200])
    with torch.no_grad():  # the added blocks pass their input through, streamed or not
        for chunk in (-1, 4):
            out = grown.eval().encoder(feats, lengths, chunk)[0]
            assert torch.equal(out, plain.encoder(feats, lengths, chunk)[0])
    learnt = train(corpus, tmp_path / "c", ModelConfig(), tcfg, init=folder, add_encoder_layers=2)
    for block in learnt.encoder.layers[1:]:
        assert block.attn.out.weight.abs().max() > 0 and block.ff[-1].weight.abs().max() > 0
    exported = load_bundle(export(tmp_path / "c", tmp_path / "model_c"))
    assert exported.config.encoder_layers == 3
    again = train(
        corpus, tmp_path / "d", ModelConfig(), replace(tcfg, lr=0.0), init=tmp_path / "model_c"
    )
    assert_same_weights(exported.model, again)
    with pytest.raises(TrainError, match="needs an init"):
        train(corpus, tmp_path / "e", TINY, tcfg, add_encoder_layers=1)
    replace(exported.config, companion_encoder_layers=1).save(tmp_path / "model_c" / "config.json")
    with pytest.raises(TrainError, match="has a companion encoder"):
        train(corpus, tmp_path / "f", ModelConfig(), tcfg, init=tmp_path / "model_c")


def test_a_killed_warm_start_resumes_exactly(tmp_path, tone):
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(steps=1, batch_frames=900, val_every=1000, val_utterances=2, warmup_steps=1)
    train(corpus, tmp_path / "a", TINY, tcfg)
    folder = export(tmp_path / "a", tmp_path / "model")
    asked, tcfg = replace(ModelConfig(), lookahead_frames=2), replace(tcfg, steps=3, ckpt_every=1)
    straight = train(corpus, tmp_path / "b", asked, tcfg, init=folder)
    train(corpus, tmp_path / "c", asked, tcfg, init=folder, stop_at=1)
    resumed = train(corpus, tmp_path / "c", asked, tcfg, init=folder)  # the same command again
    assert_same_weights(straight, resumed)
    with pytest.raises(TrainError, match="another model shape"):
        train(corpus, tmp_path / "c", replace(asked, lookahead_frames=3), tcfg, init=folder)


def test_a_run_begun_before_shifted_units_resumes_with_its_own(tmp_path, tone):
    """A lookahead run whose config.json predates `unit_shift_frames` resumes with units of
    whole unit_ms blocks, as it began."""
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(steps=2, batch_frames=900, val_every=1000, val_utterances=2, ckpt_every=1)
    asked = replace(TINY, lookahead_frames=2)
    train(corpus, tmp_path / "a", asked, tcfg, stop_at=1)
    saved_path = tmp_path / "a" / "config.json"
    saved = json.loads(saved_path.read_text())
    del saved["model"]["unit_shift_frames"]
    saved_path.write_text(json.dumps(saved))
    resumed = train(corpus, tmp_path / "a", asked, tcfg)
    assert resumed.cfg == replace(asked, unit_shift_frames=0)


def test_frozen_encoder_trains_the_decoder_only(tmp_path, tone):
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(steps=2, batch_frames=900, val_every=1000, val_utterances=2, warmup_steps=1)
    train(corpus, tmp_path / "a", TINY, tcfg)
    folder = export(tmp_path / "a", tmp_path / "model")
    frozen = replace(tcfg, freeze_encoder=True)
    second = train(corpus, tmp_path / "b", TINY, frozen, init=folder)
    first = load_bundle(folder).model
    assert_same_weights(first.encoder, second.encoder)
    assert torch.equal(first.ctc_head.weight, second.ctc_head.weight)
    assert not torch.equal(first.decoder.out.weight, second.decoder.out.weight)


def test_detached_translation_loss_leaves_the_encoder_alone(tmp_path, tone):
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(steps=1, batch_frames=900, val_every=1000, val_utterances=2, mt_detach=True)
    model = train(corpus, tmp_path / "a", TINY, replace(tcfg, lr=0.0))
    cache, _, stats, _, de = prepare(corpus, tmp_path / "a", TINY, 2)
    batch = collate(cache, [0, 1], stats, None, torch.Generator(), de.bos_id, de.eos_id)
    model.zero_grad(set_to_none=True)
    mt = loss_on_batch(model, batch, chunk_frames=2, wait_k=1, tcfg=tcfg).mt
    mt.backward()
    assert all(p.grad is None for p in model.encoder.parameters())
    assert model.decoder.out.weight.grad.abs().sum() > 0


def test_augment_ranges_come_from_the_flags():
    assert augment_config(TrainConfig()) == AugmentConfig()
    wide = augment_config(TrainConfig(speed_range="0.8,1.2", warp_range="0.8, 1.25"))
    assert (wide.speed_range, wide.warp_range) == ((0.8, 1.2), (0.8, 1.25))
    assert wide.gain_db == AugmentConfig().gain_db
    for bad in ("1.2,0.8", "0,1", "0.9", "a,b"):
        with pytest.raises(TrainError, match="--warp-range"):
            augment_config(TrainConfig(warp_range=bad))


# the augmentation with speed, warp, gain and noise off: what is left is the part under test
PLAIN_AUGMENT = replace(
    AugmentConfig(), speed_range=(1.0, 1.0), warp_range=(1.0, 1.0), gain_db=0.0, noise_prob=0.0
)


def test_spectral_colouring_is_smooth_bounded_and_off_by_default():
    x = torch.randn(50, 80)
    plain = PLAIN_AUGMENT
    # off: the augmentation draws what it drew before the colouring existed
    assert torch.equal(augment_logmel(x, plain, torch.Generator().manual_seed(3)), x)
    cfg = replace(plain, eq_db=6.0)
    curve = augment_logmel(x, cfg, torch.Generator().manual_seed(3)) - x
    assert torch.allclose(curve, curve[:1].expand_as(curve), atol=1e-5)  # the same in every frame
    assert 0 < curve[0].abs().max() <= 6 * math.log(10) / 10 + 1e-6
    assert curve[0].diff().abs().max() < 0.1 * curve[0].abs().max()  # smooth across bins
    assert augment_config(TrainConfig(eq_db=4.0)).eq_db == 4.0
    with pytest.raises(TrainError, match="--eq-db"):
        augment_config(TrainConfig(eq_db=-1.0))


def test_lead_silence_puts_silent_frames_before_the_speech():
    x = torch.randn(50, 80)
    cfg = replace(PLAIN_AUGMENT, lead_silence_frames=30)
    lengths = set()
    for seed in range(20):
        y = augment_logmel(x, cfg, torch.Generator().manual_seed(seed))
        n = y.shape[0] - x.shape[0]
        assert 0 <= n <= 30 and torch.equal(y[n:], x)
        assert torch.all(y[:n] == math.log(1e-6))  # what the features give for digital zeros
        lengths.add(n)
    assert len(lengths) > 5
    assert augment_config(TrainConfig(lead_silence_ms=2000)).lead_silence_frames == 200
    with pytest.raises(TrainError, match="--lead-silence-ms"):
        augment_config(TrainConfig(lead_silence_ms=-10))


def test_reverberation_decays_by_60_db_in_rt60_and_is_causal():
    x = torch.full((120, 80), -60.0)  # next to no power
    x[10] = 0.0  # one frame of unit power in every band
    y = reverberate(x, rt60_s=0.5, drr_db=6.0, hop_s=0.01)
    tail = y.exp() - x.exp()
    assert tail[:11].abs().max() < 1e-20  # nothing before the frame, nor in the frame itself
    # the tail holds 6 dB less power than the direct frame, in every band
    assert torch.allclose(tail[11:].sum(0), torch.full((80,), 10**-0.6), rtol=1e-4)
    # the lowest band falls by 60 dB over 0.5 s (50 frames); higher bands fall faster
    assert 10 * math.log10(tail[11, 0] / tail[60, 0]) == pytest.approx(60 * 49 / 50, rel=1e-3)
    assert torch.all(tail[61:, 0] < 1e-20)  # the tail ends at 60 dB down
    assert tail[40, 79] < tail[40, 0] / 100
    # a steady sound gains the tail's share of its power
    steady = reverberate(torch.zeros(200, 80), 0.5, 6.0, 0.01)
    assert torch.allclose(steady[100:].exp(), torch.full((100, 80), 1 + 10**-0.6), rtol=1e-4)


def test_reverberation_is_drawn_at_the_flag_share():
    x = torch.randn(100, 80) - 2
    cfg = replace(PLAIN_AUGMENT, reverb_prob=0.5)
    changed = [
        not torch.equal(augment_logmel(x, cfg, torch.Generator().manual_seed(s)), x)
        for s in range(40)
    ]
    assert 10 < sum(changed) < 30
    assert augment_config(TrainConfig(reverb_prob=0.3)).reverb_prob == 0.3
    for bad in (-0.1, 1.5):
        with pytest.raises(TrainError, match="--reverb-prob"):
            augment_config(TrainConfig(reverb_prob=bad))


def test_train_chunk_ms_sets_the_chunks_drawn(tmp_path, tone, monkeypatch):
    assert train_chunk_frames(TINY, TrainConfig()) == TINY.chunk_frames_choices
    assert train_chunk_frames(TINY, TrainConfig(train_chunk_ms="160,160,320")) == (4, 4, 8)
    for bad in ("120", "160,x"):  # 3 frames do not divide the lookback; not a number
        with pytest.raises(TrainError, match="--train-chunk-ms"):
            train_chunk_frames(TINY, TrainConfig(train_chunk_ms=bad))
    drawn = []

    def recording(model, batch, chunk_frames, wait_k, tcfg, teacher):
        drawn.append(chunk_frames)
        return loss_on_batch(model, batch, chunk_frames, wait_k, tcfg, teacher)

    monkeypatch.setattr("streamasr.train.loss_on_batch", recording)
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(
        steps=3, batch_frames=900, val_every=1000, val_utterances=2, warmup_steps=1,
        full_context_prob=0.0, train_chunk_ms="160",
    )  # fmt: skip
    train(corpus, tmp_path / "a", TINY, tcfg)
    assert drawn and set(drawn) == {4}


def test_distill_weight_adds_the_distillation_to_the_loss_and_the_log(tmp_path, tone):
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(
        steps=2, batch_frames=900, val_every=1000, val_utterances=2, warmup_steps=1,
        full_context_prob=0.0, distill_weight=0.5,
    )  # fmt: skip
    train(corpus, tmp_path / "a", TINY, tcfg)
    records = [json.loads(line) for line in open(tmp_path / "a" / "train_log.jsonl")]
    assert len(records) == 2 and all(r["distill"] > 0 for r in records)


def test_a_teacher_folder_is_distilled_on_every_batch(tmp_path, tone, capsys):
    """`--teacher DIR --distill-weight W`: a model folder with a companion (an ensemble) teaches
    on full-context batches too; a teacher without a weight, missing or reading other features
    is refused in one line before any step."""
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(steps=1, batch_frames=900, val_every=1000, val_utterances=2, warmup_steps=1)
    train(corpus, tmp_path / "a", TINY, tcfg)
    student = export(tmp_path / "a", tmp_path / "student")
    torch.manual_seed(5)  # the companion: other weights reading the same features and pieces
    other_weights = SpeechTranslator(load_bundle(student).config).eval()
    replace(load_bundle(student), model=other_weights).save(tmp_path / "second")
    with_companion(student, tmp_path / "second", 0.3).save(tmp_path / "ensemble")
    taught = ["train", "--corpus", str(corpus), "--init", str(student), "--steps", "2",
              "--batch-frames", "900", "--val-utterances", "2", "--warmup-steps", "1",
              "--full-context-prob", "1"]  # fmt: skip
    work = tmp_path / "b"
    args = [*taught, "--work", str(work), "--teacher", str(tmp_path / "ensemble")]
    assert main([*args, "--distill-weight", "0.5"]) == 0
    records = [json.loads(line) for line in open(work / "train_log.jsonl")]
    assert len(records) == 2 and all(r["distill"] > 0 for r in records)
    assert json.loads((work / "config.json").read_text())["train"]["teacher"] == args[-1]

    def refused(teacher, message, *more):
        out = tmp_path / "x"
        assert main([*taught, "--work", str(out), "--teacher", str(teacher), *more]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
        assert not (out / "checkpoint.pt").exists()

    refused(tmp_path / "ensemble", "give --distill-weight W > 0")
    refused(tmp_path / "nowhere", "not a model folder", "--distill-weight", "1")
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "ensemble", other)
    save_file({"mean": torch.zeros(80), "std": torch.ones(80)}, other / "feature_stats.safetensors")
    refused(other, "differs from the model trained in feature statistics", "--distill-weight", "1")


def test_extra_corpora_join_the_training_data(tmp_path, tone):
    corpus = make_corpus(tmp_path / "corpus", tone)
    extra = make_corpus(tmp_path / "voice2", -tone)
    alone, *_ = prepare(corpus, tmp_path / "a", TINY, 2)
    other, *_ = prepare(extra, tmp_path / "b", TINY, 2)
    both, val, *_ = prepare(corpus, tmp_path / "c", TINY, 2, extra=[extra])
    assert len(both.items) == len(alone.items) + len(other.items) == len(both.offsets) - 1
    assert torch.equal(both.utterance(2), alone.utterance(2))
    assert torch.equal(both.utterance(len(alone.items) + 3), other.utterance(3))
    assert (tmp_path / "c" / "features_train+voice2.safetensors").is_file()
    assert [it["id"] for it in val.items] == ["val0", "val1"]  # validation: the first corpus
    # a corpus named twice is drawn twice as often
    twice, *_ = prepare(corpus, tmp_path / "c", TINY, 2, extra=[extra, extra])
    assert len(twice.items) == len(alone.items) + 2 * len(other.items)
    assert torch.equal(twice.utterance(len(both.items) + 3), other.utterance(3))


def test_feature_cache_follows_its_manifest(tmp_path, tone):
    corpus = make_corpus(tmp_path / "corpus", tone)
    manifest = corpus / "train.jsonl"
    rows = manifest.read_text().splitlines(keepends=True)
    manifest.write_text("".join(rows[:5]))
    first, *_ = prepare(corpus, tmp_path / "a", TINY, 2)
    assert len(first.items) == 5
    manifest.write_text("".join(rows))  # the corpus grew: the cache is extended
    grown, *_ = prepare(corpus, tmp_path / "a", TINY, 2)
    (tmp_path / "b").mkdir()
    for name in ("en.model", "de.model"):  # the same tokenizers: a fresh cache to compare with
        shutil.copy(tmp_path / "a" / name, tmp_path / "b" / name)
    fresh, *_ = prepare(corpus, tmp_path / "b", TINY, 2)
    assert grown.items == fresh.items
    assert torch.equal(grown.feats, fresh.feats) and torch.equal(grown.offsets, fresh.offsets)
    changed = json.loads(rows[0]) | {"text": "something else entirely"}
    manifest.write_text(json.dumps(changed) + "\n" + "".join(rows[1:]))  # it changed: rebuilt
    rebuilt, *_ = prepare(corpus, tmp_path / "a", TINY, 2)
    assert rebuilt.items[0]["text"] == "something else entirely"
    assert torch.equal(rebuilt.feats, fresh.feats)


def test_feature_cache_serves_other_tokenizers(tmp_path, tone, monkeypatch):
    """A run with tokenizers of its own reuses another run's features (none recomputed) and
    gets its own token ids."""
    corpus = make_corpus(tmp_path / "corpus", tone)
    prepare(corpus, tmp_path / "a", TINY, 2)
    (tmp_path / "b").mkdir()
    for split in ("train", "val"):
        for name in (f"features_{split}.safetensors", f"items_{split}.jsonl"):
            shutil.copy(tmp_path / "a" / name, tmp_path / "b" / name)
    monkeypatch.setattr("streamasr.train.load_audio", None)  # no audio may be read again
    other, _, _, en, _ = prepare(corpus, tmp_path / "b", replace(TINY, en_vocab=35), 2)
    first, *_ = prepare(corpus, tmp_path / "a", TINY, 2)
    assert len(en) == 35 and torch.equal(other.feats, first.feats)
    assert [it["en"] for it in other.items] == [en.encode(it["text"]) for it in first.items]
    assert [it["en"] for it in other.items] != [it["en"] for it in first.items]


@pytest.mark.parametrize("whole_source", [False, True])
def test_cascade_training_resumes_exactly_and_leaves_the_speech_model_alone(
    tmp_path, tone, whole_source
):
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(steps=1, batch_frames=900, val_every=1000, val_utterances=2, warmup_steps=1)
    train(corpus, tmp_path / "a", TINY, tcfg)
    folder = export(tmp_path / "a", tmp_path / "model")
    ctcfg = replace(tcfg, steps=4, batch_tokens=60, val_every=2, source_noise=0.5)
    layers = {"transcript_encoder_layers": 1, "cascade_whole_source": whole_source}
    whole = train_cascade(corpus, tmp_path / "b", folder, ctcfg, layers)
    train_cascade(corpus, tmp_path / "c", folder, ctcfg, layers, stop_at=2)  # "killed"
    resumed = train_cascade(corpus, tmp_path / "c", folder, ctcfg, layers)
    assert_same_weights(whole, resumed)
    speech = load_bundle(folder).model
    for name in ("encoder", "ctc_head", "decoder"):
        assert_same_weights(getattr(speech, name), getattr(whole, name))
    # the cascade decoder started from the speech decoder and has moved away from it
    assert not torch.equal(speech.decoder.out.weight, whole.transcript_decoder.out.weight)
    shipped = load_bundle(export(tmp_path / "b", tmp_path / "cascade_model"))
    assert shipped.config.translate_from == "transcript"
    assert shipped.config.cascade_whole_source is whole_source
    assert_same_weights(shipped.model, whole)


def test_train_wait_k_is_drawn_from_the_list_given(tiny_config):
    from streamasr.train import train_wait_ks

    assert train_wait_ks(tiny_config, TrainConfig()) == (1, 2, 3, 4, 5, 7, 9, None)
    assert train_wait_ks(tiny_config, TrainConfig(train_wait_k="inf")) == (None,)
    assert train_wait_ks(tiny_config, TrainConfig(train_wait_k="3,3,inf")) == (3, 3, None)
    with pytest.raises(TrainError, match="--train-wait-k '0,inf': wait-k must be a positive"):
        train_wait_ks(tiny_config, TrainConfig(train_wait_k="0,inf"))


def test_self_conditioning_grafts_as_no_change_then_learns_and_resumes(tmp_path, tone):
    """--self-condition-layers on an init: the model starts as the init's (a grown block and a
    zero projection), then the intermediate head's CTC loss is logged and the projection learns;
    a killed run resumes exactly; blocks outside the encoder are refused."""
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(steps=2, batch_frames=900, val_every=1000, val_utterances=2, warmup_steps=1)
    train(corpus, tmp_path / "a", TINY, tcfg)
    folder = export(tmp_path / "a", tmp_path / "model")
    plain = load_bundle(folder).model
    grow = {"init": folder, "add_encoder_layers": 1, "self_condition_layers": (1,)}
    start = train(corpus, tmp_path / "b", ModelConfig(), replace(tcfg, lr=0.0), **grow)
    assert start.cfg == replace(TINY, encoder_layers=2, self_condition_layers=(1,))
    conditioner = start.encoder.conditioners["1"]
    assert_same_weights(conditioner.head, plain.ctc_head)  # the final head reads block 1 first
    assert_same_weights(conditioner.norm, plain.encoder.norm)
    feats, lengths = torch.randn(1, 200, 80), torch.tensor([200])
    with torch.no_grad():
        for chunk in (-1, 4):
            out = start.eval().encoder(feats, lengths, chunk)[0]
            assert torch.equal(out, plain.encoder(feats, lengths, chunk)[0])
    learnt = train(corpus, tmp_path / "c", ModelConfig(), tcfg, **grow)
    assert learnt.encoder.conditioners["1"].back.weight.abs().max() > 0
    logged = [
        json.loads(line) for line in (tmp_path / "c" / "train_log.jsonl").read_text().splitlines()
    ]
    assert len(logged) == 2 and all(row["inter"] > 0 for row in logged)
    train(corpus, tmp_path / "d", ModelConfig(), tcfg, stop_at=1, **grow)  # "killed"
    assert_same_weights(learnt, train(corpus, tmp_path / "d", ModelConfig(), tcfg, **grow))
    exported = load_bundle(export(tmp_path / "c", tmp_path / "model_c"))
    assert exported.config.self_condition_layers == (1,)
    assert_same_weights(exported.model, learnt)
    with pytest.raises(TrainError, match="self_condition_layers must be blocks 1 to 1"):
        train(
            corpus, tmp_path / "e", ModelConfig(), tcfg, **(grow | {"self_condition_layers": (2,)})
        )


def test_whole_source_encoder_trains_alone_and_resumes_exactly(tmp_path, tone):
    """--cascade-whole-encoder beside a trained cascade: the second encoder starts as the causal
    one and is the only weight that moves; killed and resumed, it ends where an unbroken run
    does; an init without a cascade of that shape is refused."""
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(steps=1, batch_frames=900, val_every=1000, val_utterances=2, warmup_steps=1)
    train(corpus, tmp_path / "a", TINY, tcfg)
    speech = export(tmp_path / "a", tmp_path / "speech")
    ctcfg = replace(tcfg, steps=3, batch_tokens=60, val_every=2)
    train_cascade(corpus, tmp_path / "b", speech, ctcfg, {"transcript_encoder_layers": 1})
    cascade = export(tmp_path / "b", tmp_path / "cascade")
    mode = {
        "transcript_encoder_layers": 1,
        "cascade_whole_source": True,
        "cascade_whole_encoder": True,
    }
    own = train_cascade(corpus, tmp_path / "c", cascade, ctcfg, mode)
    train_cascade(corpus, tmp_path / "d", cascade, ctcfg, mode, stop_at=1)  # "killed"
    assert_same_weights(own, train_cascade(corpus, tmp_path / "d", cascade, ctcfg, mode))
    before = load_bundle(cascade).model.state_dict()
    after = own.state_dict()
    assert {k for k in after if k not in before} == {
        k.replace("transcript_encoder.", "whole_encoder.", 1)
        for k in before
        if k.startswith("transcript_encoder.")
    }
    for name, value in before.items():
        assert torch.equal(after[name], value), name
    moved = [
        not torch.equal(after[k], before[k.replace("whole_encoder.", "transcript_encoder.", 1)])
        for k in after
        if k.startswith("whole_encoder.")
    ]
    assert any(moved)  # started as the causal encoder, and trained
    shipped = load_bundle(export(tmp_path / "c", tmp_path / "own"))
    assert shipped.config.cascade_whole_encoder and shipped.config.cascade_whole_source
    assert_same_weights(shipped.model, own)
    with pytest.raises(TrainError, match="has none of this shape"):
        train_cascade(corpus, tmp_path / "e", speech, ctcfg, mode)
    every = train_cascade(
        corpus, tmp_path / "f", cascade, replace(ctcfg, cascade_train_all=True), mode
    )
    for name in ("transcript_encoder", "transcript_decoder", "whole_encoder"):
        assert not torch.equal(  # with --cascade-train-all every part of the cascade moves
            next(getattr(every, name).parameters()), next(getattr(own, name).parameters())
        ), name


def write_multi30k(folder, corpus) -> None:
    """A Multi30k folder holding the text of a corpus's train and val manifests."""
    folder.mkdir()
    for split in ("train", "val"):
        rows = [json.loads(line) for line in (corpus / f"{split}.jsonl").read_text().splitlines()]
        for lang, key in (("en", "text"), ("de", "translation")):
            (folder / f"{split}.{lang}").write_text("".join(r[key] + "\n" for r in rows))


def test_cascade_with_its_own_source_pieces_from_multi30k_text(tmp_path, tone):
    """--multi30k reads the pairs a corpus's manifests hold; --transcript-vocab gives the cascade
    a tokenizer of its own, shipped as transcript.model and used by the session; a warm start
    from that model continues the same cascade."""
    corpus = make_corpus(tmp_path / "corpus", tone)
    text = tmp_path / "multi30k"
    write_multi30k(text, corpus)
    assert multi30k_pairs(text, "train") == text_pairs([corpus / "train.jsonl"])
    tcfg = TrainConfig(steps=1, batch_frames=900, val_every=1000, val_utterances=2, warmup_steps=1)
    train(corpus, tmp_path / "a", TINY, tcfg)
    folder = export(tmp_path / "a", tmp_path / "model")
    ctcfg = replace(tcfg, steps=2, batch_tokens=60, val_every=2)
    cascade = {"transcript_encoder_layers": 1, "transcript_vocab": 30, "cascade_dropout": 0.3}
    model = train_cascade(None, tmp_path / "b", folder, ctcfg, cascade, multi30k=text)
    bundle = load_bundle(export(tmp_path / "b", tmp_path / "cascade_model"))
    assert (tmp_path / "cascade_model" / "transcript.model").is_file()
    assert bundle.transcript_tokenizer is bundle.transcript_pieces
    assert model.transcript_encoder.embed.num_embeddings == 30 == len(bundle.transcript_pieces)
    assert model.transcript_encoder.layers[0].dropout.p == 0.3
    assert model.decoder.layers[0].dropout == TINY.dropout  # the speech decoder keeps its own
    session = Session(bundle, SessionOptions(wait_k=2, translate_from="transcript"))
    assert session.translator.en is bundle.transcript_pieces
    again = train_cascade(None, tmp_path / "c", tmp_path / "cascade_model", ctcfg, cascade,
                          stop_at=0, multi30k=text)  # fmt: skip
    assert_same_weights(again, model)  # same shape: the shipped cascade is where it starts


def test_word_noise_edits_words_into_similar_ones():
    import random

    sentences = ["a man rides a bike", "a man hides the bikes", "the men ride bikes"]
    noise = WordNoise(sentences, neighbours=2, inserted=3)
    assert set(noise.similar["bike"]) == {"bikes", "ride"}  # the closest spellings
    words = "a man rides a bike".split()
    assert noise(words, 0.0, random.Random(0)) == words
    for seed in range(20):
        noisy = noise(words, 1.0, random.Random(seed))
        assert noisy  # a sentence never vanishes
        assert noisy == noise(words, 1.0, random.Random(seed))  # seeded
        assert not set(noisy) - set(noise.similar) - set(words)  # only vocabulary words
    edited = [noise(words, 1.0, random.Random(s)) != words for s in range(20)]
    assert all(edited)


def test_feature_statistics_summed_in_slices_equal_one_sum(tmp_path, tone, monkeypatch):
    corpus = make_corpus(tmp_path / "corpus", tone)
    monkeypatch.setattr("streamasr.features.STATS_SLICE_FRAMES", 7)  # many slices, a ragged last
    cache, _, stats, *_ = prepare(corpus, tmp_path / "a", TINY, 2)
    expected = cache.feats.double()  # one sum over the whole cache
    expected = SimpleNamespace(
        mean=expected.mean(0).float(), std=expected.std(0, correction=0).float()
    )
    assert torch.allclose(stats.mean, expected.mean, atol=1e-5)
    assert torch.allclose(stats.std, expected.std, atol=1e-5)


def test_average_of_model_folders(tmp_path, tone):
    """`streamasr average`: the mean of the weights of folders alike in all else; a folder of
    other tokenizers or config is refused."""
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(steps=2, batch_frames=900, val_every=1000, val_utterances=2, warmup_steps=1)
    train(corpus, tmp_path / "a", TINY, tcfg)
    first = export(tmp_path / "a", tmp_path / "first")
    train(corpus, tmp_path / "b", ModelConfig(), tcfg, init=first)
    second = export(tmp_path / "b", tmp_path / "second")
    mean = average_bundles([first, second])
    a, b = load_bundle(first).model.state_dict(), load_bundle(second).model.state_dict()
    assert not torch.equal(a["ctc_head.weight"], b["ctc_head.weight"])
    for name, tensor in mean.model.state_dict().items():
        assert torch.equal(tensor, (a[name] + b[name]) / 2), name
    mean.save(tmp_path / "mean")
    assert_same_weights(load_bundle(tmp_path / "mean").model, mean.model)
    # a tensor alike in every folder stays bit for bit (three equal floats' mean can round off)
    twin = Path(shutil.copytree(second, tmp_path / "twin"))
    three = average_bundles([first, second, twin]).model.state_dict()
    for name in a:
        if torch.equal(a[name], b[name]):
            assert torch.equal(three[name], a[name]), name
        elif a[name].is_floating_point():
            assert torch.equal(three[name], (a[name] + b[name] + b[name]) / 3), name
    alike = average_bundles([first, first, first]).model.state_dict()
    assert any(not torch.equal((t + t + t) / 3, t) for t in a.values() if t.is_floating_point())
    assert all(torch.equal(alike[name], a[name]) for name in a)
    assert main(["average", str(first), str(second), "--out", str(tmp_path / "half"),
                 "--dtype", "float16"]) == 0  # fmt: skip
    for name, tensor in load_bundle(tmp_path / "half").model.state_dict().items():
        assert torch.equal(tensor, mean.model.state_dict()[name].half().float()), name

    other = Path(shutil.copytree(second, tmp_path / "other"))
    replace(TINY, dropout=0.3).save(other / "config.json")
    with pytest.raises(ModelFolderError, match="config.json differs"):
        average_bundles([first, other])
    TINY.save(other / "config.json")
    shutil.copyfile(other / "en.model", other / "de.model")
    with pytest.raises(ModelFolderError, match="de.model differ"):
        average_bundles([first, other])


def test_companion_folder_holds_both_encoders(tiny_bundle_dir, tmp_path, capsys):
    """`streamasr companion MAIN SECOND`: MAIN's weights and SECOND's encoder and CTC head,
    stored and loaded back; a second folder of other features, pieces or frames is refused."""
    tiny = load_bundle(tiny_bundle_dir)
    torch.manual_seed(2)
    model = SpeechTranslator(replace(tiny.config, encoder_layers=1)).eval()
    second = tmp_path / "second"
    replace(tiny, config=model.cfg, model=model).save(second)
    out = tmp_path / "both"
    assert main(["companion", str(tiny_bundle_dir), str(second), "--out", str(out),
                 "--dtype", "float16", "--weight", "0.25"]) == 0  # fmt: skip
    both = load_bundle(out)
    assert both.config == replace(tiny.config, companion_encoder_layers=1, companion_weight=0.25)
    state = both.model.state_dict()
    for name, tensor in tiny.model.state_dict().items():
        assert torch.equal(state[name], tensor.half().float()), name
    for part in ("encoder", "ctc_head"):
        for name, tensor in getattr(model, part).state_dict().items():
            assert torch.equal(state[f"companion.{part}.{name}"], tensor.half().float()), name
    assert len(state) == len(tiny.model.state_dict()) + len(model.encoder.state_dict()) + 2
    alone = tmp_path / "alone"  # the way back: what training starts from
    assert main(["export", "--model", str(out), "--without-companion", "--out", str(alone)]) == 0
    back = load_bundle(alone)
    assert back.config == tiny.config
    state = back.model.state_dict()
    assert state.keys() == tiny.model.state_dict().keys()
    for name, tensor in tiny.model.state_dict().items():
        assert torch.equal(state[name], tensor.half().float()), name
    for source in (["--model", str(alone)], ["--work", str(tmp_path)]):
        assert main(["export", *source, "--without-companion", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "has no companion encoder to drop" in err and "give --model" in err

    def refused(first, message):
        assert main(["companion", str(first), str(second), "--out", str(tmp_path / "x")]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "x").exists()

    refused(out, "must not have a companion itself")
    with pytest.raises(SystemExit):  # argparse: a share outside (0, 1)
        main(["companion", str(tiny_bundle_dir), str(second), "--out", "x", "--weight", "1"])
    assert "between 0 and 1" in capsys.readouterr().err
    conditioned = replace(tiny.config, self_condition_layers=(1,))
    replace(tiny, config=conditioned, model=SpeechTranslator(conditioned)).save(tmp_path / "sc")
    with pytest.raises(ModelFolderError, match="self-conditioned encoder cannot be a companion"):
        with_companion(tiny_bundle_dir, tmp_path / "sc")
    replace(tiny.config, encoder_layers=1, right_context_frames=2).save(second / "config.json")
    refused(tiny_bundle_dir, "config.json differs from")
    with pytest.raises(ModelFolderError, match="in right_context_frames"):
        with_companion(tiny_bundle_dir, second)
    model.cfg.save(second / "config.json")
    shutil.copyfile(second / "de.model", second / "en.model")
    refused(tiny_bundle_dir, "en.model differ")


def write_eval_folder(folder, rows) -> None:
    """An eval folder's instances.jsonl: (id, voice, transcript, translation_ref) at k=3 and inf."""
    folder.mkdir()
    lines = [
        {"id": i, "voice": voice, "wait_k": k, "transcript": hyp, "translation_ref": ref}
        for i, voice, hyp, ref in rows for k in (3, None)
    ]  # fmt: skip
    (folder / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_recognized_transcripts_join_the_pairs_they_differ_from(tmp_path, caplog):
    pairs = [("a man rides a bike", "Ein Mann fährt Rad."), ("two dogs", "Zwei Hunde.")]
    write_eval_folder(tmp_path / "a", [
        ("u1", "flite:rms", "a man hides a bike", "Ein Mann fährt Rad."),
        ("u1", "espeak:en-us+m1", "two dogs", "Zwei Hunde."),  # right: its pair already
    ])  # fmt: skip
    write_eval_folder(
        tmp_path / "b", [("u1", "piper:joe", "a man rides bike", "Ein Mann fährt Rad.")]
    )
    heard = recognized_pairs([tmp_path / "a", tmp_path / "b"])
    assert len(heard) == 3  # one per utterance (an id may come from two corpora), not per k
    with caplog.at_level(logging.INFO):
        merged = with_recognized(pairs, heard)
    assert merged == pairs + [
        ("a man hides a bike", "Ein Mann fährt Rad."), ("a man rides bike", "Ein Mann fährt Rad.")
    ]  # fmt: skip
    assert "3 recognized transcripts, 2 of them unlike" in caplog.text
    with pytest.raises(TrainError, match="1 transcripts of sentences outside"):
        with_recognized(pairs[:1], heard)
    write_eval_folder(tmp_path / "c", [("u9", "flite:awb", "two dogs", "Zwei Hunde.")])
    with pytest.raises(TrainError, match="flite:awb, a voice reserved for evaluation"):
        recognized_pairs([tmp_path / "c"])
    with pytest.raises(TrainError, match="not a `streamasr eval` folder"):
        recognized_pairs([tmp_path])


def test_the_device_flag_names_a_device_this_machine_has(tmp_path, tone, capsys):
    assert train_device("cpu") == torch.device("cpu")
    with pytest.raises(TrainError, match="--device 'gpu0'"):
        train_device("gpu0")
    corpus = make_corpus(tmp_path / "corpus", tone)
    absent = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
    code = main(
        ["train", "--corpus", str(corpus), "--work", str(tmp_path / "w"), "--device", absent]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"--device '{absent}'" in err and "Traceback" not in err
    assert not (tmp_path / "w" / "checkpoint.pt").exists()


def _a_batch_and_a_tiny_model(tmp_path, tone):
    """Four utterances collated without augmentation, and a seeded TINY model without dropout
    (eval mode), so that two passes differ only by what a test changes."""
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(val_utterances=2)
    cache, _, stats, _, de = prepare(corpus, tmp_path / "w", TINY, tcfg.val_utterances)
    batch = collate(cache, list(range(4)), stats, None, torch.Generator(), de.bos_id, de.eos_id)
    torch.manual_seed(0)
    return batch, tcfg, SpeechTranslator(TINY).eval()


def _assert_distillation_is_the_kl_from(target, model, batch, chunk, tcfg, teacher=None):
    """`loss_on_batch`'s distillation at `chunk` equals the per-frame KL from the teacher's
    log-probs `target` (no gradient) computed by hand, in value and in the encoder's gradients
    (returned)."""
    feats, lengths = batch[0], batch[1]
    model.zero_grad()
    losses = loss_on_batch(model, batch, chunk, 2, tcfg, teacher)
    losses.distill.backward()
    grads = [w.grad.clone() for w in model.encoder.parameters()]
    model.zero_grad()
    student, frame_lengths = model.encoder(feats, lengths, chunk)
    per_frame = (target.exp() * (target - model.ctc_log_probs(student))).sum(-1)
    expected = sum(per_frame[i, :n].sum() for i, n in enumerate(frame_lengths))
    expected = expected / frame_lengths.sum()
    assert losses.distill.item() == pytest.approx(expected.item(), rel=1e-4)
    assert losses.distill > 0
    expected.backward()
    for got, want in zip(grads, (w.grad for w in model.encoder.parameters()), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
    return grads


def test_a_teachers_distillation_is_the_kl_from_its_full_context(tmp_path, tone):
    """With a teacher, the distillation's target is the teacher's full-context transcript
    posteriors (its companion mixed in), on chunked and full-context batches alike; the
    gradient reaches the student only."""
    batch, tcfg, model = _a_batch_and_a_tiny_model(tmp_path, tone)
    feats, lengths = batch[0], batch[1]
    kd = replace(tcfg, distill_weight=0.5)
    torch.manual_seed(3)
    teacher = SpeechTranslator(replace(TINY, companion_encoder_layers=1, companion_weight=0.3))
    teacher.eval().requires_grad_(False)
    twin = SpeechTranslator(TINY).eval()
    twin.load_state_dict(model.state_dict())
    assert loss_on_batch(model, batch, -1, 2, kd, twin).distill.abs() < 1e-6
    target = teacher.encode_transcript(feats, lengths, -1)[1]
    for chunk in (-1, 2):
        _assert_distillation_is_the_kl_from(target, model, batch, chunk, kd, teacher)
    assert all(w.grad is None for w in teacher.parameters())


def test_bf16_losses_and_gradients_follow_float32(tmp_path, tone):
    batch, tcfg, model = _a_batch_and_a_tiny_model(tmp_path, tone)
    cpu = torch.device("cpu")
    runs = []
    for precision in ("fp32", "bf16"):
        model.zero_grad()
        with autocast(cpu, precision):
            ctc, mt, *_ = loss_on_batch(model, batch, 4, 2, tcfg)
        (ctc + mt).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        runs.append((ctc.item(), mt.item(), grads, ctc.dtype))
        with autocast(cpu, precision):  # the CTC head's log-softmax in float32 either way
            assert model.ctc_log_probs(torch.randn(1, 3, TINY.d_model)).dtype == torch.float32
    (ctc32, mt32, grad32, _), (ctc16, mt16, grad16, dtype16) = runs
    assert dtype16 == torch.float32 and grad16.dtype == torch.float32  # weights stay float32
    assert (ctc16, mt16) == pytest.approx((ctc32, mt32), rel=0.02)
    assert torch.nn.functional.cosine_similarity(grad16, grad32, dim=0) > 0.99
    assert not torch.equal(grad16, grad32)  # bf16 did run


def test_bf16_training_runs_resumes_in_float32_and_unknown_precisions_are_refused(
    tmp_path, tone, capsys
):
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(
        steps=4, batch_frames=900, val_every=2, ckpt_every=1, val_utterances=2, warmup_steps=2,
        augment_from=2, precision="bf16",
    )  # fmt: skip
    train(corpus, tmp_path / "w", TINY, tcfg, stop_at=2)
    model = train(corpus, tmp_path / "w", TINY, replace(tcfg, precision="fp32"))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    log = [
        json.loads(line) for line in (tmp_path / "w" / "train_log.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    assert all(math.isfinite(r["ctc"]) and math.isfinite(r["mt"]) for r in log)
    code = main(
        ["train", "--corpus", str(corpus), "--work", str(tmp_path / "x"), "--precision", "fp16"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--precision 'fp16': give one of fp32, bf16" in err
    assert "Traceback" not in err and not (tmp_path / "x" / "checkpoint.pt").exists()


def test_distillation_is_the_kl_from_full_context_trained_through_the_stream(tmp_path, tone):
    batch, tcfg, model = _a_batch_and_a_tiny_model(tmp_path, tone)
    feats, lengths = batch[0], batch[1]
    kd = replace(tcfg, distill_weight=0.5)
    assert loss_on_batch(model, batch, 4, 2, tcfg).distill == 0  # off by default
    assert loss_on_batch(model, batch, -1, 2, kd).distill == 0  # nothing to distil in full context
    # one chunk as long as the batch is full context: the same posteriors, nothing to learn
    assert loss_on_batch(model, batch, feats.shape[1], 2, kd).distill.abs() < 1e-6
    with torch.no_grad():  # the teacher: the same weights without the chunk mask
        target = model.ctc_log_probs(model.encoder(feats, lengths, -1)[0])
    grads = _assert_distillation_is_the_kl_from(target, model, batch, 2, kd)
    assert any(g.abs().sum() > 0 for g in grads)
    assert model.decoder.out.weight.grad is None


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
def test_a_batch_gives_the_same_loss_and_gradients_on_cuda(tmp_path, tone):
    batch, tcfg, model = _a_batch_and_a_tiny_model(tmp_path, tone)
    grads = []
    for device in ("cpu", "cuda"):
        model.to(device).zero_grad()
        ctc, mt, _ = loss_on_batch(model, to_device(batch, torch.device(device)), 4, 2, tcfg)
        (ctc + mt).backward()
        grads.append([p.grad.detach().cpu().clone() for p in model.parameters()])
        if device == "cpu":
            losses = (ctc.item(), mt.item())
    assert (ctc.item(), mt.item()) == pytest.approx(losses, rel=1e-4)
    for cpu_grad, cuda_grad in zip(*grads, strict=True):
        torch.testing.assert_close(cuda_grad, cpu_grad, rtol=1e-3, atol=1e-4)


@needs_cuda
def test_training_on_cuda_validates_and_resumes_on_the_cpu(tmp_path, tone):
    corpus = make_corpus(tmp_path / "corpus", tone)
    tcfg = TrainConfig(
        steps=4, batch_frames=900, val_every=2, ckpt_every=1, val_utterances=2, warmup_steps=2,
        augment_from=2, device="cuda",
    )  # fmt: skip
    model = train(corpus, tmp_path / "w", TINY, tcfg, stop_at=2)
    assert next(model.parameters()).is_cuda
    resumed = train(corpus, tmp_path / "w", TINY, replace(tcfg, device="cpu"))
    assert not next(resumed.parameters()).is_cuda
    log = [
        json.loads(line) for line in (tmp_path / "w" / "train_log.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and "val" in log[1] and "val" in log[3]
    assert load_bundle(export(tmp_path / "w", tmp_path / "model")).config == TINY
    # the cascade trains and validates there too
    cascade = train_cascade(
        corpus, tmp_path / "c", tmp_path / "model",
        replace(tcfg, steps=2, batch_tokens=60), {"transcript_encoder_layers": 1},
    )  # fmt: skip
    assert next(cascade.transcript_decoder.parameters()).is_cuda
