"""Training on the CPU or any torch device: tokenizers, a feature cache, joint CTC + wait-k
translation training.

`prepare` turns a corpus folder into everything training reads (sentencepiece models, a
float16 feature cache, global statistics); `train` runs resumable steps with checkpoints,
periodic validation on the evaluation voices, and a JSON-lines log; `export` writes a model
folder.
"""

from __future__ import annotations

import filecmp
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from .audio import load_audio
from .augment import AugmentConfig, augment_logmel, spec_augment
from .bundle import (
    TRANSCRIPT_TOKENIZER,
    Bundle,
    ModelFolderError,
    lm_folder,
    load_bundle,
    transcript_pieces,
)
from .config import ModelConfig
from .decoding import SpeechWaitKTranslator, ctc_greedy_tokens, speech_units, translate_segment
from .features import FeatureConfig, FeatureStats, LogMel, RunningStats
from .lm import LEXICON_FILE, LM_FILE
from .manifest import Utterance, read_manifest
from .model import SpeechTranslator, lengths_to_mask, wait_k_visible_frames
from .policy import WaitK, parse_wait_k
from .text import Tokenizer, normalize_transcript, train_tokenizer

log = logging.getLogger(__name__)


class TrainError(ValueError):
    """A training run the user can fix (e.g. resuming a work folder with other model options)."""


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 5600  # optimizer steps in all (resume continues towards this)
    batch_frames: int = 6000  # feature frames per batch, padding included (60 s of audio)
    batch_tokens: int = 3000  # cascade training: source + target tokens per batch, padding included
    source_noise: float = 0.0  # cascade training: highest simulated word error rate per sentence
    lr: float = 1.5e-3  # peak learning rate after warm-up
    warmup_steps: int = 200  # linear warm-up
    weight_decay: float = 0.01
    ctc_weight: float = 1.0  # per-token CTC loss weight
    mt_weight: float = 0.5  # per-token translation cross-entropy weight
    label_smoothing: float = 0.1
    full_context_prob: float = 0.2  # batches trained without the chunk mask
    # in-place distillation (dual-mode ASR): on a chunked batch, this weight times the KL
    # divergence of the streamed CTC posteriors from the same weights' full-context ones (no
    # gradient through those), per frame; 0: none
    distill_weight: float = 0.0
    # weight of the self-conditioning heads' CTC loss (`self_condition_layers`), per token
    inter_ctc_weight: float = 0.3
    # a model folder whose full-context transcript posteriors (its companion's mixed in, if it
    # has one) the distillation reads instead of the same weights', on every batch; "": none
    teacher: str = ""
    # chunk sizes (ms) drawn for the other batches, e.g. "160,160,320,640" (a size named twice is
    # drawn twice as often); empty: the model's chunk_frames_choices, uniformly
    train_chunk_ms: str = ""
    # wait-k values drawn per batch, e.g. "inf" or "1,3,inf" (a value named twice is drawn twice
    # as often); empty: the model's wait_k_choices
    train_wait_k: str = ""
    augment_from: int = 1000  # first step with augmentation: the encoder first fits clean speech
    # "LO,HI" ranges of the speed and vocal-tract-length augmentation; empty: AugmentConfig's
    speed_range: str = ""
    warp_range: str = ""
    eq_db: float = 0.0  # smooth random colouring of the mel axis, at most this many dB; 0: none
    lead_silence_ms: int = 0  # up to this much silence put before each utterance; 0: none
    reverb_prob: float = 0.0  # share of utterances given late reverberation; 0: none
    mt_detach: bool = True  # the translation loss trains the decoder only, not the encoder
    freeze_encoder: bool = False  # encoder fixed (no gradients, no CTC): decoder-only training
    # cascade training with a whole-source encoder of its own (`cascade_whole_encoder`): train it
    # together with the causal encoder and the decoder; False: it alone, the rest kept as it is
    cascade_train_all: bool = False
    grad_clip: float = 5.0
    val_every: int = 500  # steps between validations
    ckpt_every: int = 100  # steps between checkpoints
    val_utterances: int = 60  # val utterances used for validation
    seed: int = 0
    threads: int = 2
    device: str = "cpu"  # torch device the steps run on (features are made on the CPU)
    # "bf16": the losses computed under torch.autocast in bfloat16 (matrix products and
    # convolutions; weights, gradients and the optimizer stay float32); "fp32": all float32
    precision: str = "fp32"


@dataclass
class Cache:
    """Features of a split, concatenated: utterance i is feats[offsets[i]:offsets[i+1]]."""

    feats: torch.Tensor  # (N_frames, n_mels) float16, unnormalized log-mel
    offsets: torch.Tensor  # (U + 1,) int64
    items: list[dict]  # id, en (token ids), de (token ids), text, translation

    def utterance(self, i: int) -> torch.Tensor:
        return self.feats[self.offsets[i] : self.offsets[i + 1]].float()

    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    @classmethod
    def concat(cls, caches: Sequence[Cache]) -> Cache:
        if len(caches) == 1:
            return caches[0]
        starts = torch.tensor([0] + [c.offsets[-1] for c in caches[:-1]]).cumsum(0)
        offsets = [caches[0].offsets[:1]] + [c.offsets[1:] + s for c, s in zip(caches, starts)]
        return cls(
            torch.cat([c.feats for c in caches]),
            torch.cat(offsets),
            [item for c in caches for item in c.items],
        )


def _cache_paths(work: Path, split: str) -> tuple[Path, Path]:
    return work / f"features_{split}.safetensors", work / f"items_{split}.jsonl"


def build_cache(
    rows: list[Utterance], work: Path, split: str, cfg: ModelConfig, en: Tokenizer, de: Tokenizer
) -> Cache:
    """The features of a manifest's rows, cached in `work`. A cache whose utterances (id,
    transcript, translation) are the first rows is reused and extended by the rest, so a corpus
    that grew costs only its new utterances; one that disagrees is rebuilt. Token ids are not
    cached: they come from the tokenizers given, so the features serve a run with other
    tokenizers too. Audio is not compared: after re-synthesizing the same sentences, delete the
    work folder's caches."""
    feat_path, item_path = _cache_paths(work, split)
    kept = _cached_prefix(feat_path, item_path, [_item(utt, en, de) for utt in rows])
    if kept is not None and len(kept.items) == len(rows):
        return kept
    logmel = LogMel(cfg.feature_config())
    chunks, offsets, items = [], [0], []
    if kept is not None:
        chunks, offsets, items = [kept.feats], kept.offsets.tolist(), kept.items
    for utt in tqdm(rows[len(items) :], desc=f"features {split}", unit="utt"):
        frames = logmel(torch.from_numpy(load_audio(utt.audio)))
        chunks.append(frames.to(torch.float16))
        offsets.append(offsets[-1] + frames.shape[0])
        items.append(_item(utt, en, de))
    cache = Cache(torch.cat(chunks), torch.tensor(offsets), items)
    save_file({"feats": cache.feats, "offsets": cache.offsets}, str(feat_path))
    item_path.write_text(
        "".join(json.dumps(_utterance(it), ensure_ascii=False) + "\n" for it in items)
    )
    return cache


def _item(utt: Utterance, en: Tokenizer, de: Tokenizer) -> dict:
    text = normalize_transcript(utt.text or "")
    return {
        "id": utt.id,
        "text": text,
        "translation": utt.translation,
        "en": en.encode(text),
        "de": de.encode(utt.translation or ""),
    }


def _utterance(item: dict) -> dict:
    """What a cached utterance is recognized by: its id and sentences (not its token ids)."""
    return {key: item[key] for key in ("id", "text", "translation")}


def _cached_prefix(feat_path: Path, item_path: Path, expected: list[dict]) -> Cache | None:
    """The cache at these paths, with `expected`'s items, if its utterances are the first of
    `expected`; else None."""
    if not (feat_path.exists() and item_path.exists()):
        return None
    cached = [_utterance(json.loads(line)) for line in item_path.read_text().splitlines()]
    items = expected[: len(cached)]
    if len(cached) > len(expected) or cached != [_utterance(it) for it in items]:
        return None
    data = load_file(str(feat_path))
    return Cache(data["feats"], data["offsets"], items)


def prepare(
    corpus: Path, work: Path, cfg: ModelConfig, val_limit: int, extra: Sequence[Path] = ()
) -> tuple[Cache, Cache, FeatureStats, Tokenizer, Tokenizer]:
    """Tokenizers, feature caches and statistics. Training reads corpus/train.jsonl and each
    extra corpus's train.jsonl (cached as features_train+NAME); validation, corpus/val.jsonl."""
    work.mkdir(parents=True, exist_ok=True)
    train_rows = read_manifest(corpus / "train.jsonl")
    if not (work / "en.model").exists():
        train_tokenizer(
            (normalize_transcript(r.text or "") for r in train_rows), work / "en", cfg.en_vocab
        )
    if not (work / "de.model").exists():
        train_tokenizer((r.translation or "" for r in train_rows), work / "de", cfg.de_vocab)
    en, de = Tokenizer(work / "en.model"), Tokenizer(work / "de.model")
    train = Cache.concat(
        [build_cache(train_rows, work, "train", cfg, en, de)]
        + [
            build_cache(read_manifest(e / "train.jsonl"), work, f"train+{e.name}", cfg, en, de)
            for e in extra
        ]
    )
    val_rows = read_manifest(corpus / "val.jsonl", val_limit)
    val = build_cache(val_rows, work, "val", cfg, en, de)
    stats_path = work / "feature_stats.safetensors"
    if not stats_path.exists():
        running = RunningStats(cfg.n_mels)
        running.update(train.feats)
        stats = running.result()
        save_file({"mean": stats.mean, "std": stats.std}, str(stats_path))
    stats = load_file(str(stats_path))
    return train, val, FeatureStats(stats["mean"], stats["std"]), en, de


def make_batches(lengths: torch.Tensor, batch_frames: int, seed: int) -> list[list[int]]:
    """Length-sorted buckets under a padded-frame budget, in a seeded random order."""
    order = sorted(range(len(lengths)), key=lambda i: int(lengths[i]))
    batches, current = [], []
    for i in order:
        if current and (len(current) + 1) * int(lengths[i]) > batch_frames:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    random.Random(seed).shuffle(batches)
    return batches


def _pad(seqs: list[torch.Tensor], value: float = 0) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=value)


def collate(
    cache: Cache,
    indices: list[int],
    stats: FeatureStats,
    aug: AugmentConfig | None,
    gen: torch.Generator,
    bos: int,
    eos: int,
):
    feats, en, de_in, de_out = [], [], [], []
    for i in indices:
        x = cache.utterance(i)
        if aug is not None:
            x = augment_logmel(x, aug, gen)
        x = stats.normalize(x)
        if aug is not None:
            x = spec_augment(x, aug, gen)
        feats.append(x)
        en.append(torch.tensor(cache.items[i]["en"], dtype=torch.long))
        de = cache.items[i]["de"]
        de_in.append(torch.tensor([bos] + de, dtype=torch.long))
        de_out.append(torch.tensor(de + [eos], dtype=torch.long))
    lengths = torch.tensor([f.shape[0] for f in feats])
    return _pad(feats), lengths, en, _pad(de_in), _pad(de_out)


def train_device(name: str) -> torch.device:
    """The torch device `--device` names, checked to exist here."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise TrainError(
            f"--device {name!r}: not a torch device (cpu, cuda, cuda:1, mps)"
        ) from None
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        seen = f"{count} CUDA device{'s' * (count > 1)}" if count else "no CUDA device"
        raise TrainError(f"--device {name!r}: torch sees {seen} here")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise TrainError(f"--device {name!r}: torch sees no MPS device here")
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as err:  # a backend this torch was not built with
        reason = str(err).split(". ")[0].strip() or type(err).__name__
        raise TrainError(f"--device {name!r}: {reason}") from None
    return device


PRECISIONS = ("fp32", "bf16")


def check_precision(name: str, device: torch.device) -> None:
    """A TrainError for a `--precision` other than PRECISIONS; a warning where bf16 would be
    emulated (a CPU without AVX-512 BF16 or AMX computes it slower than float32)."""
    if name not in PRECISIONS:
        raise TrainError(f"--precision {name!r}: give one of {', '.join(PRECISIONS)}")
    if name == "bf16" and device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        log.warning("--precision bf16: this CPU has no native bfloat16; steps may be slower")


def autocast(device: torch.device, precision: str) -> torch.autocast:
    """The context a training loss is computed in (the backward pass runs outside it)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def to_device(batch: tuple, device: torch.device) -> tuple:
    """A collated batch (tensors, and lists of them) on `device`."""
    return tuple(
        [t.to(device) for t in part] if isinstance(part, list) else part.to(device)
        for part in batch
    )


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 5 % of the peak at cfg.steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_chunk_frames(cfg: ModelConfig, tcfg: TrainConfig) -> tuple[int, ...]:
    """Chunk sizes in encoder frames drawn for chunked batches: `train_chunk_ms`, or the model's."""
    if not tcfg.train_chunk_ms:
        return cfg.chunk_frames_choices
    try:
        return tuple(cfg.chunk_frames(int(ms)) for ms in tcfg.train_chunk_ms.split(","))
    except ValueError as err:
        raise TrainError(f"--train-chunk-ms {tcfg.train_chunk_ms!r}: {err}") from None


def train_wait_ks(cfg: ModelConfig, tcfg: TrainConfig) -> tuple[int | None, ...]:
    """The wait-k values drawn per batch (None: k = inf): `train_wait_k`, or the model's."""
    if not tcfg.train_wait_k:
        return tuple(k or None for k in cfg.wait_k_choices)
    try:
        return tuple(parse_wait_k(k) for k in tcfg.train_wait_k.split(","))
    except ValueError as err:
        raise TrainError(f"--train-wait-k {tcfg.train_wait_k!r}: {err}") from None


def augment_config(tcfg: TrainConfig) -> AugmentConfig:
    """The augmentation of a run: AugmentConfig with the ranges, colouring, silence and
    reverberation `tcfg` names."""
    ranges = {}
    for name in ("speed_range", "warp_range"):
        text = getattr(tcfg, name)
        if not text:
            continue
        try:
            lo, hi = (float(part) for part in text.split(","))
            if not 0 < lo <= hi:
                raise ValueError
        except ValueError:
            flag = "--" + name.replace("_", "-")
            raise TrainError(
                f"{flag} {text!r}: give LO,HI with 0 < LO <= HI, e.g. 0.8,1.2"
            ) from None
        ranges[name] = (lo, hi)
    if tcfg.eq_db < 0:
        raise TrainError(f"--eq-db {tcfg.eq_db:g}: give a level >= 0 (0: no colouring)")
    if tcfg.lead_silence_ms < 0:
        raise TrainError(f"--lead-silence-ms {tcfg.lead_silence_ms}: give a length >= 0")
    if not 0 <= tcfg.reverb_prob <= 1:
        raise TrainError(f"--reverb-prob {tcfg.reverb_prob:g}: give a share from 0 to 1")
    silence = tcfg.lead_silence_ms // FeatureConfig().hop_ms
    return replace(
        AugmentConfig(),
        **ranges,
        eq_db=tcfg.eq_db,
        lead_silence_frames=silence,
        reverb_prob=tcfg.reverb_prob,
    )


class Losses(NamedTuple):
    ctc: torch.Tensor  # per transcript token
    mt: torch.Tensor  # per translation token
    # per frame; zero unless tcfg.distill_weight > 0 and the batch is chunked or has a teacher
    distill: torch.Tensor
    # per transcript token, the mean over the self-conditioning heads; zero without them
    inter: torch.Tensor


def ctc_per_token(
    log_probs: torch.Tensor, targets: list[torch.Tensor], frame_lengths: torch.Tensor
) -> torch.Tensor:
    """CTC loss of (B, T, V) log-probs, summed over the batch and divided by its target tokens."""
    target_lengths = torch.tensor([len(t) for t in targets])
    return F.ctc_loss(
        log_probs.transpose(0, 1),
        torch.cat(targets),
        frame_lengths,
        target_lengths,
        blank=0,
        reduction="sum",
        zero_infinity=True,
    ) / target_lengths.sum().clamp_min(1)


def loss_on_batch(
    model: SpeechTranslator,
    batch,
    chunk_frames: int,
    wait_k: int | None,
    tcfg: TrainConfig,
    teacher: SpeechTranslator | None = None,
) -> Losses:
    feats, lengths, en, de_in, de_out = batch
    intermediate: list[torch.Tensor] = []
    with torch.set_grad_enabled(not tcfg.freeze_encoder and torch.is_grad_enabled()):
        frames, frame_lengths = model.encoder(feats, lengths, chunk_frames, intermediate)
    distill = frames.new_zeros((), dtype=torch.float32)
    ctc = inter = frames.new_zeros((), dtype=torch.float32)
    if not tcfg.freeze_encoder:
        log_probs = model.ctc_log_probs(frames)
        if tcfg.distill_weight and (chunk_frames > 0 or teacher is not None):
            source = model if teacher is None else teacher
            distill = full_context_kl(source, feats, lengths, log_probs, frame_lengths)
        ctc = ctc_per_token(log_probs, en, frame_lengths)
        if intermediate:
            inter = sum(ctc_per_token(lp, en, frame_lengths) for lp in intermediate)
            inter = inter / len(intermediate)
    cfg = model.cfg
    visible = wait_k_visible_frames(
        de_in.shape[1],
        frame_lengths,
        wait_k,
        cfg.unit_frames,
        cfg.tokens_per_unit,
        cfg.unit_shift_frames,
    )
    memory = frames.detach() if tcfg.mt_detach else frames
    logits = model.decoder(de_in, memory, visible)
    mt = F.cross_entropy(
        logits.transpose(1, 2), de_out, ignore_index=0, label_smoothing=tcfg.label_smoothing
    )
    return Losses(ctc, mt, distill, inter)


def full_context_kl(
    teacher: SpeechTranslator,
    feats: torch.Tensor,
    lengths: torch.Tensor,
    log_probs: torch.Tensor,
    frame_lengths: torch.Tensor,
) -> torch.Tensor:
    """KL(teacher's full context || student's `log_probs`) of the CTC posteriors, summed over
    the vocabulary and averaged over the frames inside each utterance, without gradient through
    the teacher: the in-place distillation of dual-mode ASR (Yu et al., 2021) when the teacher
    is the student's own weights in the same mode, or an ensemble's knowledge distilled when it
    is another model (with its companion, if it has one)."""
    with torch.no_grad():
        target = teacher.encode_transcript(feats, lengths, -1)[1]
    per_frame = F.kl_div(log_probs, target, reduction="none", log_target=True).sum(-1)
    inside = lengths_to_mask(frame_lengths, per_frame.shape[1])
    return (per_frame * inside).sum() / inside.sum().clamp_min(1)


def load_teacher(
    folder: Path, cfg: ModelConfig, stats: FeatureStats, en: Tokenizer
) -> SpeechTranslator:
    """The model folder `folder`'s recognizer (eval mode, no gradients) as a distillation
    teacher, after checking it reads the student's features and writes its pieces over the same
    frames; TrainError otherwise."""
    try:
        bundle = load_bundle(folder)
    except ModelFolderError as err:
        raise TrainError(f"--teacher {folder}: {err}") from None
    fields = ("n_mels", "feature_hop_ms", "subsampling_layers", "en_vocab")
    differ = [name for name in fields if getattr(bundle.config, name) != getattr(cfg, name)]
    if not bundle.stats.same_as(stats):
        differ.append("feature statistics")
    if not filecmp.cmp(bundle.en.path, en.path, shallow=False):
        differ.append("en.model")
    if differ:
        raise TrainError(
            f"--teacher {folder}: differs from the model trained in {', '.join(differ)}"
        )
    return bundle.model.eval().requires_grad_(False)


def validate(
    model: SpeechTranslator,
    val: Cache,
    stats: FeatureStats,
    de: Tokenizer,
    en: Tokenizer,
    chunk_frames: int,
) -> dict:
    """Greedy CTC WER and wait-k BLEU (k=3, inf) on the val slice, streaming-exact decoding."""
    import jiwer
    import sacrebleu

    model.eval()
    device = next(model.parameters()).device
    hyps, refs = [], []
    trans: dict[str, list[str]] = {"3": [], "inf": []}
    with torch.no_grad():
        for i, item in enumerate(val.items):
            x = stats.normalize(val.utterance(i))[None].to(device)
            frames, _ = model.encoder(x, torch.tensor([x.shape[1]], device=device), chunk_frames)
            hyps.append(en.decode(ctc_greedy_tokens(model.ctc_log_probs(frames)[0])))
            refs.append(item["text"])
            for name, k in (("3", 3), ("inf", None)):
                policy = WaitK(k, model.cfg.tokens_per_unit)
                translator = SpeechWaitKTranslator(model, policy, de.bos_id, de.eos_id)
                out = translate_segment(translator, speech_units(model, frames))
                trans[name].append(de.decode(out))
    model.train()
    de_refs = [item["translation"] or "" for item in val.items]
    return {
        "wer": 100 * jiwer.wer(refs, [h if h else "<empty>" for h in hyps]),
        "bleu_k3": sacrebleu.corpus_bleu(trans["3"], [de_refs]).score,
        "bleu_inf": sacrebleu.corpus_bleu(trans["inf"], [de_refs]).score,
        "example": {
            "ref": refs[0],
            "hyp": hyps[0],
            "de_ref": de_refs[0],
            "de_k3": trans["3"][0],
            "de_inf": trans["inf"][0],
        },
    }


def train(
    corpus: Path,
    work: Path,
    cfg: ModelConfig,
    tcfg: TrainConfig,
    stop_at: int | None = None,
    init: Path | None = None,
    extra: Sequence[Path] = (),
    add_encoder_layers: int = 0,
    self_condition_layers: tuple[int, ...] = (),
) -> SpeechTranslator:
    """Train (or resume) towards tcfg.steps; `stop_at` ends this run early at that step, as a
    kill would, leaving a checkpoint to resume from. `init` starts a new work folder from a
    model folder's weights, tokenizers and statistics (a warm start with a fresh optimizer),
    with `add_encoder_layers` more encoder blocks on top that start as the identity.
    `self_condition_layers` replaces the model's (the init's, or cfg's); with an init, new
    conditioners start as no change. `extra` corpora add their train splits to the training
    data."""
    if add_encoder_layers and init is None:
        raise TrainError("adding encoder layers needs an init model to add them to")
    if tcfg.teacher and tcfg.distill_weight <= 0:
        raise TrainError(f"--teacher {tcfg.teacher}: give --distill-weight W > 0 to learn from it")
    if tcfg.teacher and not (Path(tcfg.teacher) / "config.json").is_file():
        raise TrainError(f"--teacher {tcfg.teacher}: not a model folder (no config.json)")
    torch.set_num_threads(tcfg.threads)
    torch.manual_seed(tcfg.seed)
    device = train_device(tcfg.device)
    check_precision(tcfg.precision, device)
    resuming = (work / "checkpoint.pt").exists()
    if init is not None:
        # The init's shape, with lookahead frames added when asked for (they start at zero)
        # and right context; right context alone replaces the init's lookahead (its map is
        # dropped); `add_encoder_layers` blocks go on top of the init's, starting as the identity.
        # A resumed warm start has the same shape, so it passes the check below.
        init_cfg = ModelConfig.load(init / "config.json")
        if init_cfg.companion_encoder_layers:
            raise TrainError(
                f"{init}: has a companion encoder, which training would not touch: start from its"
                " main model (`streamasr export --model FOLDER --without-companion --out DIR`) and"
                " add the companion afterwards (`streamasr companion`)"
            )
        right = cfg.right_context_frames or init_cfg.right_context_frames
        lookahead = cfg.lookahead_frames or (0 if right else init_cfg.lookahead_frames)
        cfg = replace(
            init_cfg,
            lookahead_frames=lookahead,
            right_context_frames=right,
            encoder_layers=init_cfg.encoder_layers + add_encoder_layers,
        )
    if self_condition_layers:
        try:
            cfg = replace(cfg, self_condition_layers=self_condition_layers)
        except ValueError as err:
            raise TrainError(str(err)) from None
    if init is not None and not resuming:
        _warm_start_files(init, work)
    # Speech units end where unit_ms of audio completes frames: the lookahead's and the right
    # context's frames later (a run resumed from before that keeps its own units).
    shift = min(cfg.ahead_frames, cfg.unit_frames - 1)
    if resuming:
        saved = ModelConfig.from_json(json.loads((work / "config.json").read_text())["model"])
        shift = saved.unit_shift_frames
        if saved != replace(cfg, unit_shift_frames=shift):
            raise TrainError(
                f"{work} holds a checkpoint of another model shape ({saved}); pass the same options"
            )
    cfg = replace(cfg, unit_shift_frames=shift)
    chunk_choices, wait_ks = train_chunk_frames(cfg, tcfg), train_wait_ks(cfg, tcfg)
    aug = augment_config(tcfg)
    train_cache, val_cache, stats, en, de = prepare(corpus, work, cfg, tcfg.val_utterances, extra)
    model = SpeechTranslator(cfg)
    if init is not None and not resuming:
        source = load_bundle(init).model
        missing, unexpected = model.load_state_dict(source.state_dict(), strict=False)
        grown = range(init_cfg.encoder_layers, cfg.encoder_layers)
        added = [
            str(i) for i in cfg.self_condition_layers if i not in init_cfg.self_condition_layers
        ]
        new = (
            *(f"encoder.layers.{i}." for i in grown),
            *(f"encoder.conditioners.{key}." for key in added),
        )
        missing = [name for name in missing if not name.startswith(new)]
        if any(not name.startswith("encoder.lookahead.") for name in missing + unexpected):
            raise TrainError(f"{init}: its weights do not fit this model ({missing + unexpected})")
        for i in grown:
            model.encoder.layers[i].start_as_identity()
        if grown:
            log.info("%d encoder blocks added on top, starting as the identity", len(grown))
        for key in added:
            model.encoder.conditioners[key].start_as(model.encoder.norm, model.ctc_head)
        if added:
            log.info(
                "self-conditioning after blocks %s, starting as no change, its heads the CTC head",
                ", ".join(added),
            )
        if missing:
            log.info("lookahead of %d frames added, starting at zero", cfg.lookahead_frames)
        if unexpected:
            log.info(
                "the init's lookahead dropped for %d right-context frames", cfg.right_context_frames
            )
    model.to(device)
    teacher = None
    if tcfg.teacher:
        teacher = load_teacher(Path(tcfg.teacher), cfg, stats, en).to(device)
    log.info(
        "model: %.2f M parameters; %d train utterances; on %s",
        model.num_parameters / 1e6,
        len(train_cache.items),
        torch.cuda.get_device_name(device) if device.type == "cuda" else device,
    )
    lengths = train_cache.lengths()
    audio_s, t0 = 0.0, time.perf_counter()

    def loss_of(indices: list[int], step: int, rng: random.Random, gen: torch.Generator):
        nonlocal audio_s
        chunk = -1 if rng.random() < tcfg.full_context_prob else rng.choice(chunk_choices)
        k = rng.choice(wait_ks)
        augment = aug if step >= tcfg.augment_from else None
        batch = collate(train_cache, indices, stats, augment, gen, de.bos_id, de.eos_id)
        batch = to_device(batch, device)
        ctc, mt, distill, inter = loss_on_batch(model, batch, chunk, k, tcfg, teacher)
        audio_s += int(batch[1].sum()) / 100
        speed = round(audio_s / (time.perf_counter() - t0), 1)
        # audio trained on since this process began (a resumed run counts afresh), and per second
        record = {
            "ctc": round(ctc.item(), 4),
            "mt": round(mt.item(), 4),
            **({"distill": round(distill.item(), 4)} if tcfg.distill_weight else {}),
            **({"inter": round(inter.item(), 4)} if cfg.self_condition_layers else {}),
            "audio_s": round(audio_s, 2),
            "audio_s_per_s": speed,
        }
        loss = tcfg.ctc_weight * ctc + tcfg.mt_weight * mt + tcfg.distill_weight * distill
        loss = loss + tcfg.inter_ctc_weight * inter
        return loss, record

    run_steps(
        work, model, list(model.parameters()), cfg, tcfg, stop_at,
        batches=lambda epoch: make_batches(lengths, tcfg.batch_frames, tcfg.seed + epoch),
        loss_of=loss_of,
        validate=lambda: validate(model, val_cache, stats, de, en, cfg.chunk_frames(320)),
        train_mode=lambda: _train_mode(model, tcfg),
        desc="train",
    )  # fmt: skip
    return model


def run_steps(
    work: Path,
    model: SpeechTranslator,
    params: list[torch.nn.Parameter],
    cfg: ModelConfig,
    tcfg: TrainConfig,
    stop_at: int | None,
    batches: Callable[[int], list[list[int]]],
    loss_of: Callable[[list[int], int, random.Random, torch.Generator], tuple[torch.Tensor, dict]],
    validate: Callable[[], dict],
    train_mode: Callable[[], None],
    desc: str,
) -> None:
    """The resumable loop both trainers share: AdamW on `params` with the warm-up/cosine schedule,
    a JSON-lines log, validation every val_every steps and atomic checkpoints. `batches(epoch)`
    gives an epoch's index lists; `loss_of(indices, step, rng, gen)` the loss and the log fields.
    A checkpoint in `work` is resumed exactly (optimizer, position, random states)."""
    opt = torch.optim.AdamW(params, lr=tcfg.lr, weight_decay=tcfg.weight_decay)
    ckpt_path = work / "checkpoint.pt"
    step, epoch, position = 0, 0, 0
    gen = torch.Generator().manual_seed(tcfg.seed)
    rng = random.Random(tcfg.seed)
    device = params[0].device
    if ckpt_path.exists():
        # our own file, written below; its tensors go where the model is
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step, epoch, position = ckpt["step"], ckpt["epoch"], ckpt["position"]
        gen.set_state(ckpt["torch_gen"])
        rng.setstate(ckpt["py_rng"])
        torch.set_rng_state(ckpt["torch_rng"])  # dropout draws from the global generator...
        if device.type == "cuda" and "cuda_rng" in ckpt:
            torch.cuda.set_rng_state(ckpt["cuda_rng"], device)  # ...or the device's
        _truncate_log(work / "train_log.jsonl", step)
        log.info("resumed at step %d (epoch %d, batch %d)", step, epoch, position)
    (work / "config.json").write_text(
        json.dumps({"model": cfg.to_json(), "train": asdict(tcfg)}, indent=2)
    )
    train_mode()
    log_file = open(work / "train_log.jsonl", "a")
    bar = tqdm(total=tcfg.steps, initial=step, desc=desc, unit="step", dynamic_ncols=True)
    last = tcfg.steps if stop_at is None else min(stop_at, tcfg.steps)
    while step < last:
        epoch_batches = batches(epoch)
        while position < len(epoch_batches) and step < last:
            for group in opt.param_groups:
                group["lr"] = lr_at(step, tcfg)
            with autocast(device, tcfg.precision):
                loss, fields = loss_of(epoch_batches[position], step, rng, gen)
            opt.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, tcfg.grad_clip)
            opt.step()
            step, position = step + 1, position + 1
            bar.update(1)
            bar.set_postfix({k: v for k, v in fields.items()})
            record = {
                "step": step,
                **fields,
                "lr": lr_at(step, tcfg),
                "grad_norm": round(float(grad_norm), 3),
                "time": time.time(),
            }
            if step % tcfg.val_every == 0 or step == tcfg.steps:
                record["val"] = validate()
                log.info("step %d val %s", step, record["val"])
                train_mode()
            log_file.write(json.dumps(record, ensure_ascii=False) + "\n")
            log_file.flush()
            if step % tcfg.ckpt_every == 0 or step == last:
                _save_checkpoint(ckpt_path, model, opt, step, epoch, position, gen, rng)
        if position >= len(epoch_batches):
            epoch, position = epoch + 1, 0
    bar.close()
    log_file.close()


def _train_mode(model: SpeechTranslator, tcfg: TrainConfig) -> None:
    """Training mode; a frozen encoder stays in eval mode, giving exactly its inference output."""
    model.train()
    if tcfg.freeze_encoder:
        model.encoder.eval()


def _warm_start_files(init: Path, work: Path) -> ModelConfig:
    """Copy a model folder's tokenizers, statistics and word LM (spelled in the same English
    pieces, so it serves the run's export too) into a new work folder; its config."""
    work.mkdir(parents=True, exist_ok=True)
    cfg = ModelConfig.load(init / "config.json")
    names = ["en.model", "de.model", "feature_stats.safetensors"]
    if cfg.transcript_vocab:
        names.append(TRANSCRIPT_TOKENIZER)
    if lm_folder(init) is not None:
        names += [LM_FILE, LEXICON_FILE]
    for name in names:
        shutil.copyfile(init / name, work / name)
    return cfg


def _truncate_log(path: Path, step: int) -> None:
    """Drop records written after the checkpoint we resume from: they will be redone."""
    if path.exists():
        kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in kept))


def _save_checkpoint(path: Path, model, opt, step, epoch, position, gen, rng) -> None:
    tmp = path.with_suffix(".tmp")
    ckpt = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "step": step,
        "epoch": epoch,
        "position": position,
        "torch_gen": gen.get_state(),
        "py_rng": rng.getstate(),
        "torch_rng": torch.get_rng_state(),
    }
    device = next(model.parameters()).device
    if device.type == "cuda":
        ckpt["cuda_rng"] = torch.cuda.get_rng_state(device)
    torch.save(ckpt, tmp)
    tmp.replace(path)  # a kill mid-write leaves the previous checkpoint intact


def export(work: Path, out: Path, dtype: str = "float32") -> Path:
    """Write a model folder from the work folder's latest checkpoint (with the word LM of the
    model folder it started from, if that had one), the weights stored as `dtype`."""
    saved = json.loads((work / "config.json").read_text())
    cfg = ModelConfig.from_json(saved["model"])
    model = SpeechTranslator(cfg)
    ckpt = torch.load(work / "checkpoint.pt", map_location="cpu", weights_only=False)
    model.load_state_dict(ckpt["model"])
    stats = load_file(str(work / "feature_stats.safetensors"))
    bundle = Bundle(
        cfg,
        model.eval(),
        FeatureStats(stats["mean"], stats["std"]),
        Tokenizer(work / "en.model"),
        Tokenizer(work / "de.model"),
        lm_folder=lm_folder(work),
        transcript_pieces=transcript_pieces(work, cfg),
    )
    bundle.save(out, dtype)
    return out
