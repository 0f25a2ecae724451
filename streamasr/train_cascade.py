"""Training the cascade translator: transcript words -> German, prefix-to-prefix wait-k.

Text only: the corpus manifests' (transcript, translation) pairs, the transcript normalized as
the recognizer writes it. The speech model (encoder, CTC head, speech decoder) is kept as it is;
the transcript encoder and its decoder are trained, the decoder starting from the speech
decoder's weights (its German is learnt already). Resumable like `train.train`, and the work
folder exports the same way.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .bundle import load_bundle
from .config import ModelConfig
from .decoding import TranscriptWaitKTranslator, translate_segment
from .manifest import read_manifest
from .model import SpeechTranslator, wait_k_visible_positions
from .policy import WaitK
from .text import Tokenizer, normalize_transcript
from .train import TrainConfig, _save_checkpoint, _truncate_log, _warm_start_files, lr_at

log = logging.getLogger(__name__)


def text_pairs(manifests: Sequence[Path], limit: int | None = None) -> list[tuple[str, str]]:
    """Distinct (normalized transcript, translation) pairs of the manifests, in first-seen order
    (a corpus speaks a sentence in several voices; text training needs it once)."""
    seen: dict[tuple[str, str], None] = {}
    for manifest in manifests:
        for row in read_manifest(manifest):
            text = normalize_transcript(row.text or "")
            if text and row.translation:
                seen.setdefault((text, row.translation), None)
    pairs = list(seen)
    return pairs[:limit] if limit is not None else pairs


def encode_source(en: Tokenizer, words: Sequence[str]) -> tuple[list[int], list[int]]:
    """Transcript words -> subword ids and the position just after each word (its unit end)."""
    ids: list[int] = []
    ends: list[int] = []
    for word in words:
        ids += en.encode(word)
        ends.append(len(ids))
    return ids, ends


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


def cascade_loss(
    model: SpeechTranslator, items: list[dict], wait_k: int | None, bos: int, eos: int, tcfg
) -> torch.Tensor:
    src = _pad([it["src"] for it in items])
    de_in = _pad([[bos] + it["tgt"] for it in items])
    de_out = _pad([it["tgt"] + [eos] for it in items])
    visible = wait_k_visible_positions(
        de_in.shape[1], [it["ends"] for it in items], wait_k, model.cfg.tokens_per_unit
    )
    logits = model.transcript_decoder(de_in, model.transcript_encoder(src), visible)
    return F.cross_entropy(
        logits.transpose(1, 2), de_out, ignore_index=0, label_smoothing=tcfg.label_smoothing
    )


def validate_cascade(
    model: SpeechTranslator, pairs: list[tuple[str, str]], en: Tokenizer, de: Tokenizer
) -> dict:
    """BLEU of streaming-exact wait-k decoding (k=3, inf) of reference transcripts."""
    import sacrebleu

    model.eval()
    out: dict = {}
    with torch.no_grad():
        for name, k in (("3", 3), ("inf", None)):
            policy = WaitK(k, model.cfg.tokens_per_unit)
            translator = TranscriptWaitKTranslator(model, en, policy, de.bos_id, de.eos_id)
            hyps = [
                de.decode(translate_segment(translator, [[w] for w in text.split()]))
                for text, _ in pairs
            ]
            out[f"bleu_k{name}"] = sacrebleu.corpus_bleu(hyps, [[t for _, t in pairs]]).score
            out[f"example_k{name}"] = hyps[0]
    model.train()
    return out


def train_cascade(
    corpus: Path,
    work: Path,
    init: Path,
    tcfg: TrainConfig,
    layers: int,
    stop_at: int | None = None,
    extra: Sequence[Path] = (),
) -> SpeechTranslator:
    """Train (or resume) the transcript translator of the model in `init` towards tcfg.steps."""
    torch.set_num_threads(tcfg.threads)
    torch.manual_seed(tcfg.seed)
    ckpt_path = work / "checkpoint.pt"
    fresh = not ckpt_path.exists()
    if fresh:
        base = _warm_start_files(init, work)
        cfg = dataclasses.replace(
            base,
            transcript_encoder_layers=base.transcript_encoder_layers or layers,
            translate_from="transcript",
        )
    else:
        cfg = ModelConfig.from_json(json.loads((work / "config.json").read_text())["model"])
    en, de = Tokenizer(work / "en.model"), Tokenizer(work / "de.model")
    manifests = [corpus / "train.jsonl"] + [e / "train.jsonl" for e in extra]
    items = []
    for text, translation in text_pairs(manifests):
        src, ends = encode_source(en, text.split())
        items.append({"src": src, "ends": ends, "tgt": de.encode(translation)})
    val_pairs = text_pairs([corpus / "val.jsonl"], tcfg.val_utterances)
    model = SpeechTranslator(cfg)
    params = [*model.transcript_encoder.parameters(), *model.transcript_decoder.parameters()]
    opt = torch.optim.AdamW(params, lr=tcfg.lr, weight_decay=tcfg.weight_decay)
    step, epoch, position = 0, 0, 0
    gen = torch.Generator().manual_seed(tcfg.seed)  # saved with the checkpoint, as train does
    rng = random.Random(tcfg.seed)
    if fresh:
        initial = load_bundle(init).model.state_dict()
        if (
            not base.transcript_encoder_layers
        ):  # a new cascade: its decoder starts as the speech one's
            initial.update(
                {f"transcript_{k}": v for k, v in initial.items() if k.startswith("decoder.")}
            )
        model.load_state_dict(initial, strict=False)
    else:
        ckpt = torch.load(ckpt_path, weights_only=False)  # our own file
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step, epoch, position = ckpt["step"], ckpt["epoch"], ckpt["position"]
        rng.setstate(ckpt["py_rng"])
        torch.set_rng_state(ckpt["torch_rng"])
        _truncate_log(work / "train_log.jsonl", step)
        log.info("resumed at step %d (epoch %d, batch %d)", step, epoch, position)
    (work / "config.json").write_text(
        json.dumps({"model": cfg.to_json(), "train": asdict(tcfg)}, indent=2)
    )
    log.info(
        "cascade: %.2f M trained parameters; %d sentence pairs",
        sum(p.numel() for p in params) / 1e6,
        len(items),
    )
    model.train()
    model.encoder.eval()  # not trained here
    log_file = open(work / "train_log.jsonl", "a")
    bar = tqdm(total=tcfg.steps, initial=step, desc="train cascade", unit="step")
    last = tcfg.steps if stop_at is None else min(stop_at, tcfg.steps)
    t0 = time.perf_counter()
    while step < last:
        batches = make_text_batches(items, tcfg.batch_tokens, tcfg.seed + epoch)
        while position < len(batches) and step < last:
            k = rng.choice(cfg.wait_k_choices) or None
            for group in opt.param_groups:
                group["lr"] = lr_at(step, tcfg)
            loss = cascade_loss(
                model, [items[i] for i in batches[position]], k, de.bos_id, de.eos_id, tcfg
            )
            opt.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, tcfg.grad_clip)
            opt.step()
            step, position = step + 1, position + 1
            bar.update(1)
            bar.set_postfix(mt=f"{loss.item():.3f}")
            record = {
                "step": step,
                "mt": round(loss.item(), 4),
                "lr": lr_at(step, tcfg),
                "grad_norm": round(float(grad_norm), 3),
                "seconds": round(time.perf_counter() - t0, 1),
            }
            if step % tcfg.val_every == 0 or step == tcfg.steps:
                record["val"] = validate_cascade(model, val_pairs, en, de)
                log.info("step %d val %s", step, record["val"])
                model.encoder.eval()
            log_file.write(json.dumps(record, ensure_ascii=False) + "\n")
            log_file.flush()
            if step % tcfg.ckpt_every == 0 or step == last:
                _save_checkpoint(ckpt_path, model, opt, step, epoch, position, gen, rng)
        if position >= len(batches):
            epoch, position = epoch + 1, 0
    bar.close()
    log_file.close()
    return model
