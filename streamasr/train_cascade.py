"""Training the cascade translator: transcript words -> German, prefix-to-prefix wait-k.

Text only: the (transcript, translation) pairs of the corpus manifests or of a Multi30k folder,
the transcript normalized as the recognizer writes it, optionally with simulated recognition
errors (`WordNoise`) or joined by what the recognizer wrote for the same sentences
(`--recognized`: `streamasr eval` folders of training-voice audio, real confusions), read as the
recognizer's pieces or as pieces of the cascade's own. The speech model (encoder, CTC head,
speech decoder) is kept as it is; the transcript encoder and its decoder are trained, a new
decoder starting from the speech decoder's weights (its German is learnt already). Resumable
like `train.train`, and the work folder exports the same way.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from .bundle import TRANSCRIPT_TOKENIZER, load_bundle, transcript_pieces
from .config import ModelConfig
from .corpus import CorpusError, read_multi30k
from .decoding import (
    DEFAULT_TRANSLATION,
    TranscriptWaitKTranslator,
    TranslationSearch,
    translate_segment_timed,
)
from .evaluate import one_row_per_utterance, read_instances
from .manifest import read_manifest
from .model import SpeechTranslator, wait_k_visible_positions
from .policy import WaitK
from .session import WordAssembler
from .text import Tokenizer, normalize_transcript, train_tokenizer
from .train import (
    TrainConfig,
    TrainError,
    _warm_start_files,
    check_precision,
    run_steps,
    train_device,
    train_wait_ks,
)
from .voices import names_reserved_voice

log = logging.getLogger(__name__)


def distinct_pairs(
    pairs: Iterable[tuple[str | None, str | None]], limit: int | None = None
) -> list[tuple[str, str]]:
    """Distinct (normalized transcript, translation) pairs, in first-seen order (a corpus speaks
    a sentence in several voices; text training needs it once); pairs missing a side are left out."""
    seen: dict[tuple[str, str], None] = {}
    for text, translation in pairs:
        text = normalize_transcript(text or "")
        if text and translation:
            seen.setdefault((text, translation), None)
    kept = list(seen)
    return kept[:limit] if limit is not None else kept


def text_pairs(manifests: Sequence[Path], limit: int | None = None) -> list[tuple[str, str]]:
    """The distinct pairs of corpus manifests."""
    rows = (row for manifest in manifests for row in read_manifest(manifest))
    return distinct_pairs(((row.text, row.translation) for row in rows), limit)


def multi30k_pairs(folder: Path, split: str, limit: int | None = None) -> list[tuple[str, str]]:
    """The distinct pairs of a Multi30k folder's split (SPLIT.en, SPLIT.de): the same text as a
    corpus built from it, without its audio."""
    english, german = read_multi30k(folder, split)
    if german is None:
        raise CorpusError(f"{folder}: no {split}.de or {split}.de.gz beside {split}.en")
    return distinct_pairs(zip(english, german), limit)


def recognized_pairs(folders: Sequence[Path]) -> list[tuple[str, str]]:
    """(recognized transcript, reference translation) of `streamasr eval` folders, one per
    utterance; refuses audio of the voices reserved for evaluation."""
    pairs = []
    for folder in folders:
        path = folder / "instances.jsonl"
        if not path.is_file():
            raise TrainError(f"{folder}: no instances.jsonl (not a `streamasr eval` folder)")
        for row in one_row_per_utterance(read_instances(folder)):
            if names_reserved_voice(row.get("voice")):
                raise TrainError(
                    f"{path}: {row['id']} is spoken by {row['voice']}, a voice reserved for "
                    "evaluation: its transcripts cannot be trained on"
                )
            pairs.append((row["transcript"], row["translation_ref"]))
    return pairs


def with_recognized(
    pairs: list[tuple[str, str]], heard: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """The train pairs, then the recognized transcripts unlike every pair (a correct one is its
    sentence's pair again); refuses transcripts of sentences outside the train pairs."""
    trained = {translation for _, translation in pairs}
    outside = sum(translation not in trained for _, translation in heard)
    if outside:
        raise TrainError(
            f"--recognized: {outside} transcripts of sentences outside the train split"
        )
    merged = distinct_pairs(pairs + heard)
    log.info(
        "%d recognized transcripts, %d of them unlike their sentence's",
        len(heard),
        len(merged) - len(pairs),
    )
    return merged


class WordNoise:
    """Simulated recognition errors, so the cascade learns to translate transcripts like the
    recognizer's: each word is, with probability `rate`, replaced by one of the `neighbours`
    vocabulary words spelled most like it (rapidfuzz's indel ratio; the beam search only writes
    lexicon words, and its errors sound alike, which spelling approximates), dropped, or
    followed by one of the `inserted` most frequent words."""

    SUBSTITUTE, DROP = 0.6, 0.85  # cumulative shares of the three edits; insertion takes the rest

    def __init__(self, sentences: Sequence[str], neighbours: int = 8, inserted: int = 50):
        import numpy as np
        from rapidfuzz import fuzz, process

        counts = Counter(word for sentence in sentences for word in sentence.split())
        vocabulary = sorted(counts)
        similarity = process.cdist(
            vocabulary, vocabulary, scorer=fuzz.ratio, dtype=np.uint8, workers=-1
        )
        np.fill_diagonal(similarity, 0)
        neighbours = min(neighbours, len(vocabulary) - 1)
        nearest = np.argpartition(similarity, -neighbours, axis=1)[:, -neighbours:]
        self.similar = {
            word: [vocabulary[j] for j in sorted(row)]
            for word, row in zip(vocabulary, nearest.tolist())
        }
        self.frequent = [word for word, _ in counts.most_common(inserted)]

    def __call__(self, words: list[str], rate: float, rng: random.Random) -> list[str]:
        noisy: list[str] = []
        for word in words:
            if rng.random() >= rate:
                noisy.append(word)
                continue
            edit = rng.random()
            if edit < self.SUBSTITUTE:
                noisy.append(rng.choice(self.similar.get(word) or self.frequent))
            elif edit >= self.DROP:
                noisy += [word, rng.choice(self.frequent)]
        return noisy or words  # a sentence never vanishes


def make_text_batches(items: list[dict], batch_tokens: int, seed: int) -> list[list[int]]:
    """Source-length-sorted buckets under a padded token budget, in a seeded random order."""
    size = [len(it["src"]) + len(it["tgt"]) for it in items]
    order = sorted(range(len(items)), key=lambda i: (len(items[i]["src"]), size[i]))
    batches, current, longest = [], [], 0
    for i in order:
        longest = max(longest, size[i])
        if current and (len(current) + 1) * longest > batch_tokens:
            batches.append(current)
            current, longest = [], size[i]
        current.append(i)
    if current:
        batches.append(current)
    random.Random(seed).shuffle(batches)
    return batches


def _pad(seqs: list[list[int]]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(s, dtype=torch.long) for s in seqs], batch_first=True
    )


def written_after_the_source(
    num_targets: int,
    unit_ends: list[list[int]],
    wait_k: int | None,
    tokens_per_unit: int,
    closing: list[int],
) -> torch.Tensor:
    """(B, U): which targets a stream writes once the segment's source has ended, when the last
    `closing[b]` words of row b arrive with its end (read, then written with the source
    finished, as a session's last uncommitted words are; 0: every word read before the end, as
    `translate_segment` reads them): under wait-k those needing more units than were read
    before the end, at k = inf all."""
    if wait_k is None:
        return torch.ones(len(unit_ends), num_targets, dtype=torch.bool)
    needed = wait_k + torch.arange(num_targets) // tokens_per_unit
    before = torch.tensor([max(0, len(ends) - m) for ends, m in zip(unit_ends, closing)])
    return needed[None, :] > before[:, None]


def cascade_loss(
    model: SpeechTranslator,
    items: list[dict],
    wait_k: int | None,
    bos: int,
    eos: int,
    tcfg,
    closing: list[int] | None = None,
) -> torch.Tensor:
    """Cross-entropy of the targets under wait-k. With `cascade_whole_source` the targets written
    after the source has ended (`written_after_the_source`, `closing` words per row arriving
    with the end; default 0) read the whole transcript encoded without the causal mask
    (`SpeechTranslator.encode_whole_source`)."""
    device = next(model.parameters()).device
    src = _pad([it["src"] for it in items]).to(device)
    de_in = _pad([[bos] + it["tgt"] for it in items]).to(device)
    de_out = _pad([it["tgt"] + [eos] for it in items]).to(device)
    ends = [it["ends"] for it in items]
    visible = wait_k_visible_positions(de_in.shape[1], ends, wait_k, model.cfg.tokens_per_unit).to(
        device
    )
    whole = None
    if model.cfg.cascade_whole_source:
        after = written_after_the_source(
            de_in.shape[1], ends, wait_k, model.cfg.tokens_per_unit, closing or [0] * len(items)
        )
        whole = (model.encode_whole_source(src), after.to(device))
    logits = model.transcript_decoder(de_in, model.transcript_encoder(src), visible, whole)
    return F.cross_entropy(
        logits.transpose(1, 2), de_out, ignore_index=0, label_smoothing=tcfg.label_smoothing
    )


def translate_transcripts(
    model: SpeechTranslator,
    texts: Iterable[str],
    en: Tokenizer,
    de: Tokenizer,
    wait_k: int | None,
    search: TranslationSearch = DEFAULT_TRANSLATION,
) -> list[tuple[str, list[int]]]:
    """The cascade's translations of normalized transcripts, each read word by word under wait-k
    exactly as a stream's committed words are (`en`: the cascade's source pieces): each
    translation (its words put together as a session's are) with its words' delays, how many
    source words had been read when the word's last piece was written."""
    policy = WaitK(wait_k, model.cfg.tokens_per_unit)
    translator = TranscriptWaitKTranslator(model, en, policy, de.bos_id, de.eos_id, search)
    out = []
    with torch.no_grad():
        for text in texts:
            words, assembler = [], WordAssembler(de)
            for token, read in translate_segment_timed(translator, [[w] for w in text.split()]):
                words += assembler.push(token, read, read)
            words += assembler.flush()
            out.append((" ".join(w for w, _ in words), [delay for _, (delay, _) in words]))
    return out


def validate_cascade(
    model: SpeechTranslator,
    pairs: list[tuple[str, str]],
    en: Tokenizer,
    de: Tokenizer,
    suffix: str = "",
) -> dict:
    """BLEU of streaming-exact wait-k decoding (k=3, inf) of the pairs' transcripts (keys
    bleu_k3, bleu_kinf, example_k3, example_kinf, each followed by `suffix`)."""
    import sacrebleu

    model.eval()
    out: dict = {}
    for name, k in (("3", 3), ("inf", None)):
        timed = translate_transcripts(model, [text for text, _ in pairs], en, de, k)
        hyps = [hyp for hyp, _ in timed]
        out[f"bleu_k{name}{suffix}"] = sacrebleu.corpus_bleu(hyps, [[t for _, t in pairs]]).score
        out[f"example_k{name}{suffix}"] = hyps[0]
    model.train()
    return out


# The ModelConfig fields that shape the cascade (the `train --cascade` flags).
CASCADE_FIELDS = (
    "transcript_encoder_layers",
    "transcript_vocab",
    "cascade_dropout",
    "cascade_whole_source",
    "cascade_whole_encoder",
)


def _start_cascade(
    init: Path, work: Path, cascade: dict, sentences: list[str]
) -> tuple[ModelConfig, bool]:
    """A new run's config (the init's with `cascade` set) and whether the init's own cascade has
    its shape (layers and source pieces). The files of the init are copied into `work`; a cascade
    of a new shape gets its source pieces trained on `sentences`."""
    base = _warm_start_files(init, work)
    cfg = dataclasses.replace(base, **cascade, translate_from="transcript")
    same_shape = bool(base.transcript_encoder_layers) and all(
        getattr(base, name) == getattr(cfg, name)
        for name in ("transcript_encoder_layers", "transcript_vocab")
    )
    if cfg.transcript_vocab and not same_shape:
        prefix = work / Path(TRANSCRIPT_TOKENIZER).stem
        train_tokenizer(sentences, prefix, cfg.transcript_vocab)
    return cfg, same_shape


def _initial_cascade_weights(
    init: Path, same_shape: bool, cfg: ModelConfig
) -> dict[str, torch.Tensor]:
    """The init's weights; for a cascade of a new shape, its decoder the speech decoder's; a
    whole-source encoder the init lacks starts as its causal encoder."""
    initial = load_bundle(init).model.state_dict()
    if same_shape:
        if cfg.cascade_whole_encoder and not any(k.startswith("whole_encoder.") for k in initial):
            prefix = "transcript_encoder."
            initial |= {
                f"whole_encoder.{k.removeprefix(prefix)}": v.clone()
                for k, v in initial.items()
                if k.startswith(prefix)
            }
        return initial
    initial = {k: v for k, v in initial.items() if not k.startswith("transcript_")}
    return initial | {f"transcript_{k}": v for k, v in initial.items() if k.startswith("decoder.")}


def train_cascade(
    corpus: Path | None,
    work: Path,
    init: Path,
    tcfg: TrainConfig,
    cascade: dict,
    stop_at: int | None = None,
    extra: Sequence[Path] = (),
    multi30k: Path | None = None,
    recognized: Sequence[Path] = (),
) -> SpeechTranslator:
    """Train (or resume) the transcript translator of the model in `init` towards tcfg.steps.

    `cascade` sets CASCADE_FIELDS. The init's own cascade is trained on when it has that shape
    (layers and source pieces); otherwise a new one starts, its decoder from the speech decoder.
    The text pairs come from a Multi30k folder (`multi30k`) or from the corpus manifests; the
    recognized transcripts of `recognized` eval folders join them, those that differ from every
    pair (a correct transcript is its sentence's pair again)."""
    torch.set_num_threads(tcfg.threads)
    torch.manual_seed(tcfg.seed)
    device = train_device(tcfg.device)
    check_precision(tcfg.precision, device)
    fresh = not (work / "checkpoint.pt").exists()
    if multi30k is not None:
        pairs = multi30k_pairs(multi30k, "train")
        val_pairs = multi30k_pairs(multi30k, "val", tcfg.val_utterances)
    else:
        pairs = text_pairs([corpus / "train.jsonl"] + [e / "train.jsonl" for e in extra])
        val_pairs = text_pairs([corpus / "val.jsonl"], tcfg.val_utterances)
    sentences = pairs  # what the tokenizer and the word noise learn from
    if recognized:
        pairs = with_recognized(sentences, recognized_pairs(recognized))
    if fresh:
        cfg, same_shape = _start_cascade(init, work, cascade, [text for text, _ in sentences])
        if cfg.cascade_whole_encoder and not same_shape:
            raise TrainError(
                f"--cascade-whole-encoder trains a second encoder beside a trained cascade: "
                f"{init} has none of this shape (train the cascade first)"
            )
    else:
        cfg = ModelConfig.from_json(json.loads((work / "config.json").read_text())["model"])
    en = transcript_pieces(work, cfg) or Tokenizer(work / "en.model")  # the source pieces
    de = Tokenizer(work / "de.model")
    items = []
    for text, translation in pairs:
        words = text.split()
        src, ends = en.encode_words(words)
        items.append({"words": words, "src": src, "ends": ends, "tgt": de.encode(translation)})
    noise = None
    if tcfg.source_noise > 0:
        noise = WordNoise([text for text, _ in sentences])
        val_rng = random.Random(0)  # the same noisy validation transcripts at every validation
        noisy_val = [
            (" ".join(noise(text.split(), tcfg.source_noise / 2, val_rng)), translation)
            for text, translation in val_pairs
        ]
    model = SpeechTranslator(cfg)
    if fresh:
        model.load_state_dict(_initial_cascade_weights(init, same_shape, cfg), strict=False)
    model.to(device)
    params = [*model.transcript_encoder.parameters(), *model.transcript_decoder.parameters()]
    if cfg.cascade_whole_encoder:  # alone, the rest kept as it is, unless all are trained
        params = [*model.whole_encoder.parameters(), *(params if tcfg.cascade_train_all else [])]
    log.info(
        "cascade: %.2f M trained parameters; %d sentence pairs; word error rate per sentence "
        "uniform in [0, %g]",
        sum(p.numel() for p in params) / 1e6,
        len(items),
        tcfg.source_noise,
    )

    wait_ks = train_wait_ks(cfg, tcfg)

    def corrupted(item: dict, rng: random.Random) -> dict:
        words = noise(item["words"], rng.uniform(0, tcfg.source_noise), rng)
        src, ends = en.encode_words(words)
        return {**item, "src": src, "ends": ends}

    def loss_of(indices: list[int], step: int, rng: random.Random, gen: torch.Generator):
        k = rng.choice(wait_ks)
        batch = [items[i] for i in indices]
        if noise is not None:
            batch = [corrupted(item, rng) for item in batch]
        closing = None
        if cfg.cascade_whole_source:  # words arriving with the segment's end: 0, 1 or 2
            closing = [rng.randrange(3) for _ in batch]
        loss = cascade_loss(model, batch, k, de.bos_id, de.eos_id, tcfg, closing)
        return loss, {"mt": round(loss.item(), 4)}

    def validate() -> dict:
        scores = validate_cascade(model, val_pairs, en, de)
        if noise is not None:  # the same pairs with errors at half the highest training rate
            scores |= validate_cascade(model, noisy_val, en, de, suffix="_noisy")
        return scores

    def train_mode() -> None:
        model.train()
        model.encoder.eval()  # the speech model is not trained here

    run_steps(
        work, model, params, cfg, tcfg, stop_at,
        batches=lambda epoch: make_text_batches(items, tcfg.batch_tokens, tcfg.seed + epoch),
        loss_of=loss_of,
        validate=validate,
        train_mode=train_mode,
        desc="train cascade",
    )  # fmt: skip
    return model
