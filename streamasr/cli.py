"""The `streamasr` command. argparse stays here; every subcommand calls the library."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .voices import VoiceError

# `streamasr lm --open-vocab`: common English words admitted beside the transcripts' (chosen on
# the tuning set of training voices among 10k-100k; model card, "An open vocabulary")
OPEN_VOCAB = 50_000
MERGES = ("max", "logadd")  # the beam's hypothesis merging, by BeamOptions.log_add
DTYPE_ARGUMENT = dict(
    choices=("float32", "float16", "bfloat16"),
    default="float32",
    help="how model.safetensors stores the weights (half precision: half the file; loading "
    "casts to float32; default float32)",
)

log = logging.getLogger("streamasr")


class UsageError(ValueError):
    """Anything the user can fix; printed as one line, exit status 2."""


def _add_data(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="build the synthetic speech corpus")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    build = data_sub.add_parser("build", help="speak Multi30k sentences with TTS voices")
    build.add_argument("--multi30k", type=Path, required=True, help="folder of Multi30k files")
    build.add_argument("--out", type=Path, required=True, help="corpus folder to write")
    build.add_argument("--splits", default="train,val,test_2016_flickr", help="comma-separated")
    build.add_argument(
        "--voices",
        help="train voice pool, ENGINE:VOICE,... (default: all); kokoro voices blend with +,"
        " read another accent's phonemes after @, and drawn-N is a speaker drawn beyond the five"
        " (seed N), e.g. kokoro:jf_alpha+jm_kumo@en-gb-x-rp, kokoro:drawn-7@en-gb; gnuspeech"
        " voices (male, female, large_child, small_child, baby) need `make gnuspeech`",
    )
    build.add_argument("--limit", type=_positive_int, help="at most N sentences per split")
    build.add_argument(
        "--start",
        type=_non_negative_int,
        default=0,
        help="first sentence (0-based line) of each split to speak (default 0)",
    )
    build.add_argument(
        "--pool-voices",
        action="store_true",
        help="every split speaks with train-pool voices (a tuning set that keeps the evaluation"
        " voices unseen)",
    )
    _add_jobs_and_seed(build, "voice and prosody")
    build.set_defaults(func=cmd_data_build)
    vocode = data_sub.add_parser(
        "vocode",
        help="re-synthesize a built corpus through a parametric vocoder, so training voices also"
        " sound like statistical parametric speech",
    )
    vocode.add_argument(
        "sources",
        nargs="+",
        type=_manifest_count,
        metavar="MANIFEST[:N]",
        help="manifests of training voices to re-synthesize; :N draws N of its rows (seeded)",
    )
    vocode.add_argument("--out", type=Path, required=True, help="corpus folder to write")
    vocode.add_argument("--split", default="train", help="manifest name to write (default train)")
    vocode.add_argument(
        "--held-out",
        action="store_true",
        help="every utterance in one setting beyond the training draw on every axis (a tuning"
        " set), instead of a setting drawn per utterance",
    )
    vocode.add_argument(
        "--vocoder",
        choices=("world", "mlsa"),
        default="world",
        help="world: WORLD's own synthesis; mlsa: a mel-cepstrum through SPTK's MLSA filter with"
        " pulse/noise excitation, as HTS (default world)",
    )
    _add_jobs_and_seed(vocode, "row and setting")
    vocode.set_defaults(func=cmd_data_vocode)


def _add_jobs_and_seed(parser: argparse.ArgumentParser, drawn: str) -> None:
    parser.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    parser.add_argument("--seed", type=int, default=0, help=f"{drawn} seed (default 0)")


def cmd_data_build(args: argparse.Namespace) -> int:
    from . import corpus
    from .voices import default_train_pool, parse_train_voices

    pool = parse_train_voices(args.voices) if args.voices else default_train_pool()
    corpus.check_voices(pool)
    splits = [s for s in args.splits.split(",") if s]
    args.out.mkdir(parents=True, exist_ok=True)
    summary = corpus.BuildSummary()
    for split in splits:
        english, german = corpus.read_multi30k(args.multi30k, split)
        jobs = corpus.plan_jobs(
            split, english, german, pool, args.seed, args.limit, args.pool_voices, args.start
        )
        manifest = corpus.build_split(jobs, args.out, args.jobs, summary)
        print(f"wrote {manifest}", file=sys.stderr)
    for line in summary.lines():
        print(line)
    return 0


def cmd_data_vocode(args: argparse.Namespace) -> int:
    from . import vocoder
    from .corpus import BuildSummary

    sources = [(path, vocoder.read_source(path, limit, args.seed)) for path, limit in args.sources]
    args.out.mkdir(parents=True, exist_ok=True)
    fixed = vocoder.HELD_OUT if args.held_out else None
    summary = BuildSummary()
    manifest = vocoder.vocode_corpus(
        sources, args.out, args.split, args.seed, args.jobs, summary, fixed, args.vocoder
    )
    print(f"wrote {manifest}", file=sys.stderr)
    for line in summary.lines():
        print(line)
    return 0


# Training and model fields the `train` command exposes as flags (same names, dashes for _).
TRAIN_OPTIONS = (
    "steps",
    "batch_frames",
    "val_every",
    "seed",
    "lr",
    "warmup_steps",
    "ctc_weight",
    "mt_weight",
    "augment_from",
    "speed_range",
    "warp_range",
    "eq_db",
    "lead_silence_ms",
    "reverb_prob",
    "mt_detach",
    "freeze_encoder",
    "cascade_train_all",
    "batch_tokens",
    "source_noise",
    "full_context_prob",
    "distill_weight",
    "inter_ctc_weight",
    "teacher",
    "train_chunk_ms",
    "train_wait_k",
    "val_utterances",
    "threads",
    "device",
    "precision",
)
OPTION_HELP = {
    "threads": "torch threads (default 2: this machine's cores; 1 each for two runs at once)",
    "device": "torch device the training steps run on: cpu, cuda, cuda:1, mps (default cpu; "
    "features are still made on the CPU, and checkpoints resume on any device)",
    "precision": "fp32, or bf16: the losses under torch.autocast in bfloat16, weights and "
    "optimizer in float32 (on this project's CPU 1.16 times the audio per second over a "
    "1,200-step run, up to 1.37 over short ones; default fp32)",
    "full_context_prob": "share of batches trained without the chunk mask (default 0.2)",
    "inter_ctc_weight": "with --self-condition-layers: weight of the intermediate heads' CTC "
    "loss, their mean, beside the final head's (default 0.3)",
    "distill_weight": "in-place distillation: on chunked batches, this weight times the KL "
    "divergence of the streamed CTC posteriors from the same weights' full-context ones, per "
    "frame (default 0: none; costs a full-context encoder pass per batch)",
    "teacher": "model folder whose full-context transcript posteriors (with its companion's, if"
    " it has one) --distill-weight distils on every batch, in place of the model's own: an"
    " ensemble's knowledge in one encoder (default: none; costs the teacher's full-context"
    " pass per batch)",
    "train_wait_k": "wait-k values drawn per batch, e.g. inf or 1,3,inf: a value named twice "
    "is drawn twice as often (default: the model's, 1,2,3,4,5,7,9,inf, uniformly)",
    "train_chunk_ms": "chunk sizes in ms drawn for the other batches, e.g. 160,160,320,640: a "
    "size named twice is drawn twice as often (default: the model's sizes, uniformly)",
    "val_utterances": "val utterances (text pairs with --cascade) validated on (default 60)",
    "eq_db": "augmentation: a smooth random colouring of the mel axis (spectral tilt and broad "
    "bumps), at most this many dB (default 0: none)",
    "lead_silence_ms": "augmentation: digital silence of random length up to this many ms before "
    "each utterance, as before a sentence in a stream (default 0: none)",
    "transcript_vocab": "--cascade: sentencepiece pieces of the translator's own source "
    "tokenizer, trained on the train transcripts (default 0: the recognizer's en.model)",
    "cascade_dropout": "--cascade: dropout of the transcript translator (default 0.1)",
    "cascade_whole_source": "--cascade: once a segment's source has ended, the rest of its "
    "translation reads the whole transcript encoded again without the causal mask (default: "
    "off, the causal encoding throughout)",
    "cascade_whole_encoder": "--cascade-whole-source: that reading by a second encoder of its "
    "own, started from the causal one and trained alone (every other weight kept as the "
    "init's; needs an init with a trained cascade)",
    "cascade_train_all": "--cascade-whole-encoder: train the second encoder together with the "
    "causal encoder and the decoder (default: it alone)",
    "lookahead_frames": "right context: encoder frames (40 ms each) every chunk also sees "
    "after it, for that much latency; with --init, added to the init's model (default 0)",
    "right_context_frames": "right context inside the blocks (Emformer's): encoder frames "
    "every chunk's attention and convolution also run over, recomputed per chunk, for that "
    "much latency; with --init, replaces the init's lookahead unless --lookahead-frames is "
    "given (default 0)",
}
MODEL_OPTIONS = (
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "d_ff",
    "en_vocab",
    "de_vocab",
    "transcript_encoder_layers",
    "transcript_vocab",
    "cascade_dropout",
    "cascade_whole_source",
    "cascade_whole_encoder",
    "lookahead_frames",
    "right_context_frames",
)


def _add_train(sub: argparse._SubParsersAction) -> None:
    from .augment import AugmentConfig
    from .config import ModelConfig
    from .train import TrainConfig

    train = sub.add_parser("train", help="train a model on a built corpus (resumable)")
    train.add_argument("--corpus", type=Path, help="corpus folder (train.jsonl, val.jsonl)")
    train.add_argument(
        "--work", type=Path, required=True, help="folder for caches, checkpoints and logs"
    )
    train.add_argument(
        "--extra-train",
        type=Path,
        action="append",
        default=[],
        metavar="CORPUS",
        help="another corpus folder whose train.jsonl joins the training data (repeatable; a"
        " corpus named twice is drawn twice as often)",
    )
    train.add_argument("--stop-at", type=int, help="end this run at that step (resume later)")
    train.add_argument("--init", type=Path, help="start from a model folder's weights (warm start)")
    train.add_argument(
        "--add-encoder-layers",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="with --init: N more encoder blocks on top of the init's, starting as the identity "
        "(their output projections zero), so the deeper model begins where the init was",
    )
    train.add_argument(
        "--self-condition-layers",
        type=_block_list,
        default=(),
        metavar="I,J",
        help="self-conditioned CTC: after these encoder blocks (1-based, below the last) an "
        "intermediate CTC head's posteriors are fed back into the frames (with --init: grafted "
        "on, starting as no change), and its CTC loss is trained (--inter-ctc-weight)",
    )
    train.add_argument(
        "--cascade",
        action="store_true",
        help="train only the transcript translator (text pairs, no audio) of the --init model; "
        "needs --transcript-encoder-layers",
    )
    train.add_argument(
        "--multi30k",
        type=Path,
        metavar="DIR",
        help="--cascade: read the text pairs from this Multi30k folder (train.en/.de, val.en/.de)"
        " instead of the corpus manifests, so no audio need be built",
    )
    train.add_argument(
        "--recognized",
        type=Path,
        action="append",
        default=[],
        metavar="EVAL_DIR",
        help="--cascade: a `streamasr eval` folder of train-split audio in training voices whose"
        " transcripts join the text pairs as sources of the same translations (repeatable)",
    )
    aug = AugmentConfig()
    speed, warp = (",".join(f"{f:g}" for f in r) for r in (aug.speed_range, aug.warp_range))
    help_text = OPTION_HELP | {
        "speed_range": f"LO,HI: tempo factors of the speed augmentation (default {speed})",
        "warp_range": "LO,HI: mel-axis warp factors of the vocal-tract-length augmentation "
        f"(default {warp})",
        "reverb_prob": "augmentation: share of utterances given late reverberation (RT60 "
        f"{'–'.join(f'{v:g}' for v in aug.rt60_range)} s, the tail "
        f"{'–'.join(f'{v:g}' for v in aug.drr_db_range)} dB below the direct sound; default 0: "
        "none)",
    }
    for cls, names in ((TrainConfig, TRAIN_OPTIONS), (ModelConfig, MODEL_OPTIONS)):
        for name in names:
            default = getattr(cls, name)
            flag = f"--{name.replace('_', '-')}"
            if isinstance(default, bool):
                train.add_argument(
                    flag,
                    action=argparse.BooleanOptionalAction,
                    default=default,
                    help=help_text.get(name, f"default {default}"),
                )
            else:
                train.add_argument(
                    flag,
                    type=type(default),
                    default=default,
                    help=help_text.get(name, f"default {default}"),
                )
    train.set_defaults(func=cmd_train)
    export = sub.add_parser(
        "export", help="write a model folder from a training work folder or another model folder"
    )
    source = export.add_mutually_exclusive_group(required=True)
    source.add_argument("--work", type=Path, help="training work folder (its latest checkpoint)")
    source.add_argument(
        "--model",
        type=Path,
        help="model folder (to store it in another --dtype or without its companion)",
    )
    export.add_argument("--out", type=Path, required=True, help="model folder to write")
    export.add_argument("--dtype", **DTYPE_ARGUMENT)
    export.add_argument(
        "--without-companion",
        action="store_true",
        help="with --model: write its main recognizer alone, the companion encoder dropped (what"
        " training starts from)",
    )
    export.set_defaults(func=cmd_export)
    average = sub.add_parser(
        "average",
        help="average the weights of model folders fine-tuned one from another into one folder",
    )
    average.add_argument(
        "models", type=Path, nargs="+", help="model folders (same config and tokenizers)"
    )
    average.add_argument("--out", type=Path, required=True, help="model folder to write")
    average.add_argument("--dtype", **DTYPE_ARGUMENT)
    average.set_defaults(func=cmd_average)

    companion = sub.add_parser(
        "companion",
        help="a model folder whose transcript also reads a second model's encoder (an ensemble)",
        description="Write MAIN's folder with SECOND's encoder and CTC head beside its own: the"
        " transcript's CTC posteriors become a weighted mean of the two recognizers' (the"
        " encoder compute of both); translation and everything else stay MAIN's.",
    )
    companion.add_argument("main", type=Path, help="model folder: everything but the companion")
    companion.add_argument(
        "second", type=Path, help="model folder whose encoder and CTC head join it"
    )
    companion.add_argument(
        "--weight",
        type=_fraction,
        default=0.5,
        help="the companion's share of the posterior mean, in (0, 1) (default 0.5)",
    )
    companion.add_argument("--out", type=Path, required=True, help="model folder to write")
    companion.add_argument("--dtype", **DTYPE_ARGUMENT)
    companion.set_defaults(func=cmd_companion)
    lm = sub.add_parser(
        "lm", help="add a word LM of the training transcripts to a model folder (beam search)"
    )
    source = lm.add_mutually_exclusive_group()
    source.add_argument("--corpus", type=Path, help="corpus folder (train.jsonl)")
    source.add_argument(
        "--multi30k", type=Path, help="or a Multi30k folder (train.en): the same sentences"
    )
    lm.add_argument(
        "--text",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="also your own text, a sentence per line: its words become recognizable and its"
        " phrasing likely (repeatable; a file named twice counts twice)",
    )
    lm.add_argument("--model", type=Path, required=True, help="model folder to add it to")
    lm.add_argument("--order", type=_positive_int, default=3, help="n-gram order (default 3)")
    lm.add_argument(
        "--open-vocab",
        type=_non_negative_int,
        default=OPEN_VOCAB,
        metavar="N",
        help="also admit the N most common English words (wordfreq), ranked by their frequency "
        f"in general text, so that words the transcripts lack can be recognized (default "
        f"{OPEN_VOCAB}; 0: the transcripts' words only)",
    )
    lm.set_defaults(func=cmd_lm)


def cmd_train(args: argparse.Namespace) -> int:
    from .config import ModelConfig
    from .train import TrainConfig, TrainError, train
    from .train_cascade import CASCADE_FIELDS, train_cascade

    for flag, value in (
        ("--multi30k", args.multi30k),
        ("--recognized", args.recognized),
        ("--cascade-whole-source", args.cascade_whole_source),
        ("--cascade-whole-encoder", args.cascade_whole_encoder),
    ):
        if value and not args.cascade:
            raise UsageError(f"{flag} is for --cascade training (the transcript translator)")
    try:
        model_cfg = ModelConfig(**{name: getattr(args, name) for name in MODEL_OPTIONS})
    except ValueError as err:
        raise UsageError(str(err)) from None
    train_cfg = TrainConfig(**{name: getattr(args, name) for name in TRAIN_OPTIONS})
    if args.cascade_train_all and not args.cascade_whole_encoder:
        raise UsageError("--cascade-train-all is for --cascade-whole-encoder training")
    if args.teacher and args.cascade:
        raise UsageError("--teacher distils into the speech model, not the --cascade translator")
    if args.self_condition_layers and args.cascade:
        raise UsageError(
            "--self-condition-layers changes the speech model, not the --cascade translator"
        )
    if args.add_encoder_layers and args.cascade:
        raise UsageError(
            "--add-encoder-layers grows the speech model, not the --cascade translator"
        )
    if args.corpus is None and args.multi30k is None:
        raise UsageError("train needs --corpus DIR (or, with --cascade, --multi30k DIR)")
    needed = [folder / "train.jsonl" for folder in args.extra_train]
    if args.multi30k is None:
        needed = [args.corpus / "train.jsonl", args.corpus / "val.jsonl", *needed]
    for path in needed:
        if not path.is_file():
            raise UsageError(
                f"{path.parent}: no {path.name} (build it with `streamasr data build`)"
            )
    try:
        if args.cascade:
            if args.init is None or not args.transcript_encoder_layers:
                raise UsageError("--cascade needs --init MODEL and --transcript-encoder-layers N")
            train_cascade(
                args.corpus, args.work, args.init, train_cfg,
                {name: getattr(args, name) for name in CASCADE_FIELDS},
                stop_at=args.stop_at, extra=args.extra_train, multi30k=args.multi30k,
                recognized=args.recognized,
            )  # fmt: skip
        else:
            train(
                args.corpus, args.work, model_cfg, train_cfg,
                stop_at=args.stop_at, init=args.init, extra=args.extra_train,
                add_encoder_layers=args.add_encoder_layers,
                self_condition_layers=args.self_condition_layers,
            )  # fmt: skip
    except TrainError as err:
        raise UsageError(str(err)) from None
    return 0


def cmd_lm(args: argparse.Namespace) -> int:
    from .lm import LEXICON_FILE, LM_FILE, build_transcript_lm, english_word_frequencies
    from .text import Tokenizer

    if not (args.model / "en.model").is_file():
        raise UsageError(f"{args.model}: no en.model (not a model folder)")
    if args.corpus is None and args.multi30k is None and not args.text:
        raise UsageError("lm needs --corpus DIR, --multi30k DIR or --text FILE")
    texts = _lm_texts(args) if args.corpus or args.multi30k else []
    own = [line.strip() for path in args.text for line in _user_text(path).splitlines()]
    own = [line for line in own if line]
    texts += own
    try:
        prior = english_word_frequencies(args.open_vocab) if args.open_vocab else None
    except ImportError as err:
        raise UsageError(f"{err} (or --open-vocab 0)") from None
    en = Tokenizer(args.model / "en.model")
    sizes, words, unspelled = build_transcript_lm(texts, en, args.model, args.order, prior)
    counts = ", ".join(f"{count} {n}-grams" for n, count in sizes.items())
    print(
        f"wrote {args.model / LM_FILE} ({counts} from {len(texts)} sentences"
        f"{f', {len(own)} of them from --text' if args.text else ''}"
        f"{f' and {len(prior)} common English words' if prior else ''}), "
        f"{LEXICON_FILE} ({words} words)"
    )
    if unspelled:
        shown = ", ".join(unspelled[:10]) + (", ..." if len(unspelled) > 10 else "")
        print(
            f"warning: en.model's pieces cannot spell these words, so they will not be"
            f" recognized ({len(unspelled)}): {shown}",
            file=sys.stderr,
        )
    return 0


def _lm_texts(args: argparse.Namespace) -> list[str]:
    """The train split's English sentences, from the corpus manifest or the Multi30k folder."""
    from .corpus import CorpusError, read_multi30k
    from .manifest import read_manifest

    if args.multi30k is not None:
        try:
            return read_multi30k(args.multi30k, "train")[0]
        except CorpusError as err:
            raise UsageError(str(err)) from None
    manifest = args.corpus / "train.jsonl"
    if not manifest.is_file():
        raise UsageError(f"{args.corpus}: no train.jsonl (build it with `streamasr data build`)")
    return [row.text for row in read_manifest(manifest) if row.text]


def _user_text(path: Path) -> str:
    """A text file the user names (`lm --text`, `--words`); a wrong one is a usage error."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except (UnicodeDecodeError, IsADirectoryError):
        raise UsageError(f"{path}: not a UTF-8 text file") from None


def cmd_export(args: argparse.Namespace) -> int:
    from .bundle import load_bundle, without_companion
    from .train import export

    if args.without_companion and args.model is None:
        raise UsageError("--without-companion reads a model folder: give --model")
    if args.model is not None:
        bundle = load_bundle(args.model)
        if args.without_companion:
            bundle = without_companion(bundle, args.model)
        bundle.save(args.out, args.dtype)
    elif (args.work / "checkpoint.pt").is_file():
        export(args.work, args.out, args.dtype)
    else:
        raise UsageError(f"{args.work}: no checkpoint.pt to export")
    _report_written(args.out, args.dtype)
    return 0


def cmd_companion(args: argparse.Namespace) -> int:
    from .bundle import with_companion

    with_companion(args.main, args.second, args.weight).save(args.out, args.dtype)
    _report_written(args.out, args.dtype, f"{args.main} with {args.second}'s encoder, ")
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    from .bundle import average_bundles

    average_bundles(args.models).save(args.out, args.dtype)
    _report_written(args.out, args.dtype, f"the mean of {len(args.models)} models, ")
    return 0


def _report_written(folder: Path, dtype: str, what: str = "") -> None:
    size = (folder / "model.safetensors").stat().st_size / 1e6
    print(f"wrote {folder}: {what}{dtype} weights, model.safetensors {size:.1f} MB")


def _int_at_least(minimum: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected a {what} integer, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1, "positive")
_non_negative_int = _int_at_least(0, "non-negative")


def _block_list(text: str) -> tuple[int, ...]:
    """I,J,...: encoder blocks, 1-based, ascending and distinct."""
    blocks = tuple(_positive_int(item) for item in text.split(",") if item.strip())
    if list(blocks) != sorted(set(blocks)):
        raise argparse.ArgumentTypeError(f"blocks must ascend without repeats, got {text}")
    return blocks


def _manifest_count(text: str) -> tuple[Path, int | None]:
    """MANIFEST or MANIFEST:N."""
    path, sep, count = text.rpartition(":")
    return (Path(path), _positive_int(count)) if sep else (Path(text), None)


def _fraction(text: str) -> float:
    """A number strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text!r}")
    return value


def _room(text: str) -> tuple[float, float]:
    try:
        rt60, drr = (float(part) for part in text.split(","))
    except ValueError:
        rt60 = None
    if rt60 is None or not 0 < rt60 <= 10 or not math.isfinite(drr):
        raise argparse.ArgumentTypeError(
            f"expected RT60,DRR with 0 < RT60 <= 10 seconds, e.g. 0.5,6; got {text!r}"
        )
    return rt60, drr


def _wait_k(text: str) -> int | None:
    from .policy import parse_wait_k

    try:
        return parse_wait_k(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _add_decoder_options(p: argparse.ArgumentParser) -> None:
    from .config import TRANSLATION_SOURCES
    from .decoding import DEFAULT_BEAM as default
    from .lm import WORD_BOOST
    from .session import SessionOptions

    p.add_argument(
        "--decoder",
        choices=("beam", "greedy"),
        default="beam",
        help="transcript search: beam (with the model folder's word LM; greedy when it has"
        " none) or greedy CTC (default beam)",
    )
    p.add_argument(
        "--beam-size",
        type=_positive_int,
        default=default.beam_size,
        help=f"default {default.beam_size}",
    )
    p.add_argument(
        "--lm-weight", type=float, default=default.lm_weight, help=f"default {default.lm_weight}"
    )
    p.add_argument(
        "--word-score", type=float, default=default.word_score, help=f"default {default.word_score}"
    )
    p.add_argument(
        "--token-beam",
        type=_non_negative_int,
        metavar="N",
        default=default.token_beam or 0,
        help="try only this many of a frame's most likely pieces (faster); 0: every piece"
        f" (default {default.token_beam or 0})",
    )
    p.add_argument(
        "--words",
        type=Path,
        metavar="FILE",
        help="words to favour (names, terms), a word or phrase per line, optionally followed by"
        " its bonus in log10 LM probability (default"
        f" {WORD_BOOST:g}); words the LM lacks are added. Needs the beam search",
    )
    p.add_argument(
        "--commit-ms",
        type=_ms_or_none,
        default=default.commit_ms,
        help="commit the beam's best words once they are this old (bounds the transcript's"
        f" delay); none: only when every hypothesis agrees (default {default.commit_ms})",
    )
    p.add_argument(
        "--blank-penalty",
        type=float,
        default=default.blank_penalty,
        help="subtract this from the CTC blank's log-prob before the search (fewer deleted"
        f" words, more inserted ones; default {default.blank_penalty:g})",
    )
    p.add_argument(
        "--merge",
        choices=MERGES,
        default=MERGES[default.log_add],
        help="how the search merges hypotheses that reach the same words: max keeps the better"
        f" path, logadd sums the paths (default {MERGES[default.log_add]})",
    )
    session = SessionOptions()
    for flag, parse, value, help_text in (
        (
            "--pause-lookback-ms", _ms_or_none, session.pause_lookback_ms,
            "before speech and in pauses, the encoder looks back at most this far, so a pause's"
            " silence is forgotten; none: the model's whole lookback",
        ),
        (
            "--sound-margin-db", _db_or_none, session.sound_margin_db,
            "...but it keeps every frame since the sound now heard began: frames this many dB"
            " above the noise floor; none: only the transcript's first piece says speech began",
        ),
    ):  # fmt: skip
        metavar = flag.rsplit("-", 1)[1].upper()
        p.add_argument(
            flag,
            type=parse,
            metavar=metavar,
            default=value,
            help=f"{help_text} (default {value:g})",
        )
    p.add_argument(
        "--translate-from",
        choices=TRANSLATION_SOURCES,
        help="translation source: speech (encoder frames, a wait-k unit per unit_ms) or "
        "transcript (the committed words, a unit per word; models with a transcript "
        "translator). Default: the model's",
    )
    add_translation_search_options(p)


def add_translation_search_options(p: argparse.ArgumentParser) -> None:
    """The translation search flags (also the SimulEval agent's); `translation_search` reads them."""
    from .decoding import DEFAULT_TRANSLATION as default

    p.add_argument(
        "--translation-beam",
        type=_positive_int,
        default=default.beam,
        metavar="N",
        help="once a segment's source has ended, search the rest of its translation with a beam"
        f" of N (at k = inf the whole sentence); 1: greedy (default {default.beam})",
    )
    p.add_argument(
        "--no-repeat-ngram",
        type=_non_negative_int,
        default=default.no_repeat_ngram,
        metavar="N",
        help="the translation never repeats an N-gram of pieces, which stops decoding loops; "
        f"0: off (default {default.no_repeat_ngram})",
    )


def translation_search(args: argparse.Namespace):
    from .decoding import TranslationSearch

    return TranslationSearch(args.translation_beam, args.no_repeat_ngram)


def _or_none(cast, unit: str):
    """An argparse type: `none`, or a finite number >= 0 read by cast."""

    def parse(text: str):
        if text.strip().lower() == "none":
            return None
        try:
            value = cast(text)
        except ValueError:
            value = -1
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"expected {unit} >= 0 or none, got {text!r}")
        return value

    return parse


_ms_or_none = _or_none(int, "milliseconds")
_db_or_none = _or_none(float, "decibels")


def _ms_or_none_list(text: str) -> list[int | None]:
    return [_ms_or_none(item) for item in text.split(",") if item.strip()]


def _beam_options(args: argparse.Namespace):
    from .decoding import BeamOptions

    if args.decoder == "greedy":
        return None
    return BeamOptions(
        args.beam_size,
        args.lm_weight,
        args.word_score,
        args.commit_ms,
        args.token_beam or None,
        args.blank_penalty,
        args.merge == "logadd",
    )


def _translate_from(args: argparse.Namespace, bundle) -> str:
    """The translation source the flags and the model give; one the model lacks is a usage error."""
    source = args.translate_from or bundle.config.translate_from
    if source == "transcript" and not bundle.model.has_cascade:
        raise UsageError("--translate-from transcript: this model has no transcript translator")
    return source


def _add_session_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, help="model folder (default: the shipped models/base)")
    p.add_argument("--translate", action="store_true", help="also translate into German")
    p.add_argument(
        "--wait-k", type=_wait_k, default=3, help="wait-k policy: K >= 1 or inf (default 3)"
    )
    p.add_argument(
        "--chunk-ms", type=_positive_int, default=320, help="encoder chunk (default 320)"
    )
    _add_decoder_options(p)


def _add_stream_commands(sub: argparse._SubParsersAction) -> None:
    from .outputs import FORMATS

    tr = sub.add_parser("transcribe", help="transcribe (and translate) audio files as live streams")
    tr.add_argument(
        "audio",
        nargs="+",
        type=Path,
        help="wav/flac/ogg files, any rate and channels; - reads raw 16 kHz mono 16-bit"
        " little-endian PCM from standard input as it arrives",
    )
    _add_session_options(tr)
    tr.add_argument(
        "--clock",
        choices=("virtual", "wall"),
        default="virtual",
        help="virtual: as fast as possible, latencies simulated; wall: real-time pacing",
    )
    tr.add_argument(
        "--format", choices=FORMATS, default="text", help="output format (default text)"
    )
    tr.add_argument(
        "-o", "--output", type=Path, help="output file (a folder for srt/vtt of several files)"
    )
    _add_caption_options(tr)
    tr.set_defaults(func=cmd_transcribe)

    live = sub.add_parser("live", help="live captions from a microphone")
    _add_session_options(live)
    live.add_argument("--device", help="input device name or index (default: the system default)")
    live.add_argument("--seconds", type=float, help="stop after this many seconds")
    live.add_argument(
        "--format",
        choices=("text", "jsonl"),
        default="text",
        help="text: a live terminal view; jsonl: events on stdout",
    )
    live.add_argument(
        "-o",
        "--output",
        type=Path,
        help="also keep the captions in this file: events for .jsonl, subtitles for .srt and"
        " .vtt (written when the stream ends), text lines otherwise",
    )
    live.add_argument(
        "--record",
        type=Path,
        metavar="FILE",
        help="also keep the audio the session heard in this sound file (16 kHz mono; .wav,"
        " .flac or .ogg), written as it comes: `streamasr transcribe FILE` reads it again",
    )
    live.add_argument("--list-devices", action="store_true", help="list input devices and exit")
    _add_caption_options(live)
    live.set_defaults(func=cmd_live)


def _load_model(args: argparse.Namespace, **options):
    """The model and session options the flags (and `options`) ask for; a chunk size the model
    cannot serve is a usage error."""
    from .bundle import load_bundle
    from .session import SessionOptions

    bundle = load_bundle(args.model)
    try:
        bundle.config.chunk_frames(args.chunk_ms)
    except ValueError as err:
        raise UsageError(f"--chunk-ms: {err}") from None
    if args.words is not None:
        _boost_words(bundle, args)
    return bundle, SessionOptions(
        chunk_ms=args.chunk_ms,
        translate_from=_translate_from(args, bundle),
        beam=_beam_options(args),
        translation=translation_search(args),
        pause_lookback_ms=args.pause_lookback_ms,
        sound_margin_db=args.sound_margin_db,
        **options,
    )


def _boost_words(bundle, args: argparse.Namespace) -> None:
    """`--words FILE`: the transcript search favours the file's words."""
    from .lm import parse_word_boosts

    if args.decoder == "greedy" or not bundle.has_lm:
        raise UsageError("--words needs the beam search (a model folder with a word LM)")
    try:
        boost = parse_word_boosts(_user_text(args.words))
    except ValueError as err:
        raise UsageError(f"{args.words}: {err}") from None
    unspelled = bundle.boost_words(boost)
    if unspelled:
        print(
            f"warning: {args.words}: the model's pieces cannot spell these words, so they will"
            f" not be recognized: {', '.join(unspelled)}",
            file=sys.stderr,
        )


def _open_source(path: Path, clock: str):
    """A file streamed as if live, or `-`: raw PCM piped into standard input."""
    from .sources import FileSource, PipeSource

    if str(path) != "-":
        return FileSource(path, pace=clock == "wall")
    if sys.stdin.isatty():
        raise UsageError(
            "-: standard input is a terminal; pipe raw 16 kHz mono 16-bit little-endian PCM"
            " into it, e.g. ffmpeg -i talk.mp3 -f s16le -ac 1 -ar 16000 - | streamasr transcribe -"
        )
    return PipeSource(sys.stdin.buffer)


def cmd_transcribe(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .audio import AudioError
    from .outputs import make_writer
    from .session import Session

    subtitles = args.format in ("srt", "vtt")
    if subtitles and len(args.audio) > 1 and args.output is not None and args.output.suffix:
        raise UsageError(
            f"--format {args.format} of several files writes one file each: -o must be a folder"
        )
    if [str(path) for path in args.audio].count("-") > 1:
        raise UsageError("-: standard input can be read once")
    per_file = subtitles and len(args.audio) > 1 and args.output is not None
    stems = ["stdin" if str(path) == "-" else Path(path).stem for path in args.audio]
    if per_file and (clash := next((s for s in stems if stems.count(s) > 1), None)):
        raise UsageError(
            f"several inputs are named {clash}: each would write {args.output / clash}.{args.format}"
        )
    bundle, options = _load_model(
        args, translate=args.translate, wait_k=args.wait_k, partials=args.partials
    )
    failures = 0
    single = (
        open(args.output, "w", encoding="utf-8")
        if args.output and not (subtitles and len(args.audio) > 1)
        else None
    )
    with contextlib.ExitStack() as closing:
        if single is not None:
            closing.enter_context(single)
        web = closing.enter_context(_caption_server(args.serve))
        closing.enter_context(_sigterm_as_ctrl_c())
        files = tqdm(args.audio, unit="file", disable=len(args.audio) == 1 or None)
        for path in files:
            try:
                source = _open_source(path, args.clock)
            except AudioError as err:
                print(f"streamasr: error: {err}", file=sys.stderr)
                failures += 1
                continue
            with contextlib.ExitStack() as its_file:
                out = single
                if out is None and args.output is not None:
                    args.output.mkdir(parents=True, exist_ok=True)
                    name = f"{Path(source.name).stem}.{args.format}"
                    out = its_file.enter_context(open(args.output / name, "w", encoding="utf-8"))
                writer = make_writer(
                    args.format, out or sys.stdout, args.translate, show_stream=len(args.audio) > 1
                )
                session = Session(bundle, options, stream=source.name, clock=args.clock)
                interrupted = _transcribe_stream(session, source, writer, web)
            if interrupted:
                print(
                    f"streamasr: interrupted: {source.name} kept up to"
                    f" {session.audio_ms / 1000:.1f} s",
                    file=sys.stderr,
                )
                return 130
    return 1 if failures else 0


def _transcribe_stream(session, source, writer, web) -> bool:
    """Run one source through its session into `writer` (and the caption page), with a progress
    bar for a file over a minute long; whether Ctrl-C cut it short (what was heard is written all
    the same)."""
    from tqdm import tqdm

    from .runner import run_stream

    duration_ms = source.duration_ms or 0  # None from a pipe: no progress bar
    bar = tqdm(
        total=round(duration_ms / 1000, 1),
        unit="s",
        desc=Path(source.name).name,
        leave=False,
        disable=duration_ms < 60_000 or None,
    )
    write = _fan_out(writer.events, web and web.publish)

    def on_events(events):
        write(events)
        bar.n = round(session.audio_ms / 1000, 1)
        bar.refresh()

    interrupted = False
    try:
        run_stream(session, source, on_events)
    except KeyboardInterrupt:  # the open segment is closed: keep what was heard
        interrupted = True
    bar.close()
    _warn_about_input(source, session)
    writer.end_stream(source.name, session.segments)
    return interrupted


@contextlib.contextmanager
def _sigterm_as_ctrl_c():
    """SIGTERM (a supervisor's stop) read as Ctrl-C for the block, so what was heard is kept."""
    import signal

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _warn_about_input(source, session) -> None:
    """What of a stream's input was not audio: counted, said once at its end."""
    if session.nonfinite_samples:
        print(
            f"streamasr: warning: {source.name}: {session.nonfinite_samples} samples were NaN or"
            " infinite, read as silence",
            file=sys.stderr,
        )
    if source.odd_bytes:
        print(
            f"streamasr: warning: {source.name}: the stream ended mid-sample; its last byte was"
            " not audio",
            file=sys.stderr,
        )


def cmd_live(args: argparse.Namespace) -> int:
    import signal
    import threading

    from .audio import AudioRecorder
    from .live import LiveView
    from .outputs import JsonlWriter, make_writer
    from .runner import run_stream
    from .session import Session
    from .sources import DeviceError, MicSource, list_input_devices

    try:
        if args.list_devices:
            print("\n".join(list_input_devices()) or "no input devices")
            return 0
        bundle, options = _load_model(
            args, translate=args.translate, wait_k=args.wait_k, partials=args.partials
        )
        source = MicSource(args.device)
    except (OSError, DeviceError) as err:
        raise UsageError(f"audio input: {err}") from None
    session = Session(bundle, options, stream=source.name, clock="wall")
    with contextlib.ExitStack() as closing:
        record = closing.enter_context(AudioRecorder(args.record)).write if args.record else None
        kept = None
        if args.output is not None:
            kind = {".jsonl": "jsonl", ".srt": "srt", ".vtt": "vtt"}.get(args.output.suffix, "text")
            out = closing.enter_context(open(args.output, "w", encoding="utf-8"))
            kept = make_writer(kind, out, args.translate)
        web = closing.enter_context(_caption_server(args.serve))
        stop = lambda *_: source.stop()  # noqa: E731 - Ctrl-C and SIGTERM end the stream cleanly
        for sig in (signal.SIGINT, signal.SIGTERM):
            closing.callback(signal.signal, sig, signal.signal(sig, stop))  # restored after
        if args.seconds is not None:
            timer = threading.Timer(args.seconds, source.stop)
            timer.start()
            closing.callback(timer.join)  # a stream ended sooner leaves no timer to wait for:
            closing.callback(timer.cancel)  # cancelled, then joined (callbacks run last first)
        also = [kept and kept.events, web and web.publish]
        try:
            if args.format == "jsonl":
                run_stream(session, source, _fan_out(JsonlWriter(sys.stdout).events, *also), record)
            else:
                with LiveView(source, args.translate) as view:
                    run_stream(session, source, _fan_out(view.events, *also), record)
        except (OSError, DeviceError) as err:
            raise UsageError(f"audio input: {err}") from None
        if kept is not None:
            kept.end_stream(source.name, session.segments)
    print(
        f"dropped pieces: {source.dropped_pieces}, device overflows: {source.device_overflows},"
        f" non-finite samples: {session.nonfinite_samples}",
        file=sys.stderr,
    )
    return 0


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(
            f"expected [HOST:]PORT such as 8000 or 0.0.0.0:8000, got {text!r}"
        )
    return host or "127.0.0.1", int(port)


def _add_caption_options(parser: argparse.ArgumentParser) -> None:
    """`transcribe` and `live`: tentative words, and the captions in a browser."""
    parser.add_argument(
        "--partials",
        action="store_true",
        help="also show the beam's tentative words before they are committed (jsonl: events of"
        " type partial, each replacing the last; the live view and the browser page: dimmed)",
    )
    parser.add_argument(
        "--serve",
        metavar="[HOST:]PORT",
        type=_host_port,
        help="also show the captions in a browser: a page and its event stream on this port,"
        " while the command runs (HOST default 127.0.0.1; 0.0.0.0 for other machines)",
    )


@contextlib.contextmanager
def _caption_server(address: tuple[str, int] | None):
    """The browser caption server `--serve` asks for, running for the block (or None)."""
    if address is None:
        yield None
        return
    from .web import CaptionServer

    try:
        server = CaptionServer(*address)
    except OSError as err:
        raise UsageError(f"--serve {address[0]}:{address[1]}: {err.strerror or err}") from None
    with server:
        print(f"captions at {server.url}", file=sys.stderr, flush=True)
        yield server


def _fan_out(*handlers):
    """One events handler that hands each batch to every one of `handlers` not None, in order
    (the view or writer first, then a file kept, then the caption server)."""
    handlers = [handler for handler in handlers if handler is not None]

    def every(events):
        for handler in handlers:
            handler(events)

    return handlers[0] if len(handlers) == 1 else every


def _wait_k_list(text: str) -> list[int | None]:
    values = [_wait_k(item) for item in text.split(",") if item.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected a comma-separated list such as 1,3,5,inf")
    return values


def _add_room_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--room",
        type=_room,
        metavar="RT60,DRR",
        help="play each file in a synthetic room: reverberation falling 60 dB in RT60 seconds,"
        " DRR dB below the direct sound, e.g. 0.5,6 (default: the files as they are)",
    )


def _add_eval(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser("eval", help="wait-k latency/quality evaluation over a manifest")
    ev.add_argument(
        "manifest", type=Path, help="JSON Lines manifest (id, audio, text, translation)"
    )
    ev.add_argument("--model", type=Path, help="model folder (default: the shipped models/base)")
    ev.add_argument(
        "--wait-k", type=_wait_k_list, default=[1, 3, 5, None], help="default 1,3,5,inf"
    )
    ev.add_argument(
        "--chunk-ms", type=_positive_int, default=320, help="encoder chunk (default 320)"
    )
    ev.add_argument("--limit", type=_positive_int, help="first N utterances only")
    ev.add_argument(
        "--lead-silence-ms",
        type=_non_negative_int,
        default=0,
        help="digital silence put before each utterance, as after a pause in a live stream;"
        " latencies count from its start (default 0: none)",
    )
    _add_room_option(ev)
    ev.add_argument(
        "--out",
        type=Path,
        default=Path("runs/eval"),
        help="output folder (default runs/eval); each finished run is kept there as it ends, so"
        " the same command, stopped, resumes where it stopped",
    )
    _add_decoder_options(ev)
    ev.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .bundle import DEFAULT_MODEL_DIR
    from .evaluate import (
        COLUMNS,
        PARTIAL_FILE,
        InstanceLog,
        Playback,
        eval_settings,
        evaluate,
        table_rows,
        write_outputs,
    )
    from .manifest import read_audio_manifest

    utterances = read_audio_manifest(args.manifest, args.limit)
    bundle, options = _load_model(args)
    playback = Playback(args.lead_silence_ms, args.room)
    model_dir = args.model or DEFAULT_MODEL_DIR
    settings = eval_settings(model_dir, args.manifest, args.limit, args.wait_k, options, playback)
    if args.words is not None:  # the words favoured, as read (a resumed eval keeps to them)
        settings["words"] = _user_text(args.words)
    log = InstanceLog(args.out / PARTIAL_FILE, settings)
    if log.done:
        print(
            f"resuming: {len(log.done)} of {len(utterances) * len(args.wait_k)} runs kept"
            f" in {log.path}",
            file=sys.stderr,
        )
    try:
        runs, instances = evaluate(bundle, utterances, args.wait_k, options, playback, log)
    finally:
        log.close()
    model_name = model_dir.resolve().name
    decoder = str(options.beam) if bundle.beam_search(options.beam) is not None else "greedy"
    if args.words is not None:
        decoder += f" --words {args.words}"
    summary = write_outputs(args.out, model_name, options, runs, instances, decoder, playback)
    log.remove()
    table = Table(
        title=f"{model_name} on {args.manifest} ({len(utterances)} utt, {args.chunk_ms} ms chunks)"
    )
    for column in COLUMNS:
        table.add_column(column, justify="right")
    for row in table_rows(runs):
        table.add_row(*row)
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    for voice, wer in summary["wer_by_voice"].items():
        if wer["wer"] is not None:
            print(
                f"{voice}: WER {wer['wer']:.1f} % ({wer['wer_full_context']:.1f} % full context),"
                f" {wer['utterances']} utt"
            )
    first = summary["first_words_wrong"]
    if first["utterances"]:
        print(
            f"first word wrong: {first['streaming']} of {first['utterances']} utt"
            f" ({first['full_context']} full context)"
        )
    print(f"wrote {args.out}/summary.json, instances.jsonl, latency_quality.png")
    return 0


def _add_eval_text(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser(
        "eval-text",
        help="BLEU of the cascade translator on reference transcripts (no audio, no recognition"
        " errors): its wait-k quality on clean text",
    )
    ev.add_argument("multi30k", type=Path, help="Multi30k folder (SPLIT.en, SPLIT.de)")
    ev.add_argument("--split", default="val", help="split to translate (default val)")
    ev.add_argument("--model", type=Path, help="model folder (default: the shipped models/base)")
    ev.add_argument("--wait-k", type=_wait_k_list, default=[3, None], help="default 3,inf")
    ev.add_argument("--limit", type=_positive_int, help="first N sentence pairs only")
    ev.add_argument(
        "--simuleval-logs",
        type=Path,
        metavar="DIR",
        help="also write DIR/k<K>/instances.log and config.yaml for each wait-k, in SimulEval "
        "1.1.4's text-to-text format (delays in source words): `simuleval --score-only --output "
        "DIR/k<K>` scores them with its own scorers",
    )
    add_translation_search_options(ev)
    ev.set_defaults(func=cmd_eval_text)


def cmd_eval_text(args: argparse.Namespace) -> int:
    import sacrebleu
    from tqdm import tqdm

    from .bundle import DEFAULT_MODEL_DIR, load_bundle
    from .evaluate import write_instance_log
    from .metrics import corpus_latency
    from .train_cascade import multi30k_pairs, translate_transcripts

    pairs = multi30k_pairs(args.multi30k, args.split, args.limit)
    if not pairs:
        raise UsageError(f"{args.multi30k}: no sentence pairs in {args.split}")
    bundle = load_bundle(args.model)
    if not bundle.model.has_cascade:
        raise UsageError(
            f"{args.model or DEFAULT_MODEL_DIR}: this model has no transcript translator"
        )
    texts, refs = [t for t, _ in pairs], [r for _, r in pairs]
    search = translation_search(args)
    if args.simuleval_logs is not None:  # refused now, not after the first translations
        args.simuleval_logs.mkdir(parents=True, exist_ok=True)
    print(f"{len(pairs)} {args.split} pairs, reference transcripts; latency in source words")
    for k in args.wait_k:
        k_name = "inf" if k is None else str(k)
        progress = tqdm(texts, desc=f"k={k_name}", unit="sent", leave=False)
        timed = translate_transcripts(
            bundle.model, progress, bundle.transcript_tokenizer, bundle.de, k, search
        )
        hyps = [hyp for hyp, _ in timed]
        bleu, chrf = sacrebleu.corpus_bleu(hyps, [refs]), sacrebleu.corpus_chrf(hyps, [refs])
        latency = corpus_latency(
            [(delays, len(text.split()), ref) for (_, delays), text, ref in zip(timed, texts, refs)]
        )
        figures = "  ".join(
            f"{name} {'-' if latency[name] is None else f'{latency[name]:.{digits}f}'}"
            for name, digits in (("AL", 2), ("LAAL", 2), ("DAL", 2), ("AP", 3))
        )
        print(f"{progress.desc}: BLEU {bleu.score:.2f}  chrF {chrf.score:.2f}  {figures}")
        if args.simuleval_logs is not None:
            instances = [
                {
                    "prediction": hyp,
                    "delays": delays,
                    "elapsed": delays,  # text in, no computation time measured
                    "reference": ref,
                    "source": f"{args.split}:{line}",
                    "source_length": len(text.split()),
                }
                for line, ((hyp, delays), text, ref) in enumerate(zip(timed, texts, refs), 1)
            ]
            write_instance_log(args.simuleval_logs / f"k{k_name}", instances, "text")
    return 0


def _float_list(text: str) -> list[float]:
    try:
        values = [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers such as 0.5,1,2, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected numbers such as 0.5,1,2")
    return values


def _add_tune_lm(sub: argparse._SubParsersAction) -> None:
    from .decoding import DEFAULT_BEAM

    tune = sub.add_parser(
        "tune-lm", help="transcript WER of greedy search and of beam-search settings on a manifest"
    )
    tune.add_argument("manifest", type=Path, help="a tuning set: never the evaluation voices")
    tune.add_argument("--model", type=Path, help="model folder (default: the shipped models/base)")
    tune.add_argument("--chunk-ms", type=_positive_int, default=320, help="default 320")
    tune.add_argument("--limit", type=_positive_int, help="first N utterances only")
    _add_room_option(tune)
    tune.add_argument(
        "--lm-weights", type=_float_list, default=[0.5, 1.0, 2.0], help="default 0.5,1,2"
    )
    tune.add_argument(
        "--word-scores", type=_float_list, default=[-1.0, 0.0, 1.0], help="default -1,0,1"
    )
    tune.add_argument("--beam-sizes", type=_float_list, default=[16], help="default 16")
    tune.add_argument(
        "--token-beams",
        type=_float_list,
        default=[DEFAULT_BEAM.token_beam or 0],
        help="pieces tried per frame, e.g. 8,16; 0: every piece"
        f" (default {DEFAULT_BEAM.token_beam or 0})",
    )
    commit = DEFAULT_BEAM.commit_ms
    tune.add_argument(
        "--commit-ms",
        type=_ms_or_none_list,
        default=[commit],
        help=f"commit lookbacks, e.g. none,320,640 (default {commit})",
    )
    tune.add_argument(
        "--blank-penalties",
        type=_float_list,
        default=[DEFAULT_BEAM.blank_penalty],
        help=f"e.g. 0,0.5,1 (default {DEFAULT_BEAM.blank_penalty:g})",
    )
    tune.add_argument(
        "--merges",
        type=_merge_list,
        default=[MERGES[DEFAULT_BEAM.log_add]],
        help=f"max, logadd or max,logadd (default {MERGES[DEFAULT_BEAM.log_add]})",
    )
    tune.set_defaults(func=cmd_tune_lm)


def _merge_list(text: str) -> list[str]:
    merges = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [m for m in merges if m not in MERGES]
    if unknown or not merges:
        raise argparse.ArgumentTypeError(f"expected max, logadd or max,logadd, not {text!r}")
    return merges


def cmd_tune_lm(args: argparse.Namespace) -> int:
    from .bundle import load_bundle
    from .decoding import BeamOptions
    from .evaluate import Playback, tune_beam
    from .manifest import read_audio_manifest
    from .voices import names_reserved_voice

    utterances = [u for u in read_audio_manifest(args.manifest, args.limit) if u.text]
    if not utterances:
        raise UsageError(f"{args.manifest}: no utterances with text")
    reserved = next((u for u in utterances if names_reserved_voice(u.voice)), None)
    if reserved is not None:
        raise UsageError(
            f"{args.manifest}: {reserved.id} is spoken by {reserved.voice}, a voice reserved for"
            " evaluation: the search is never tuned on it"
        )
    bundle = load_bundle(args.model)
    if not bundle.has_lm:
        raise UsageError("the model folder has no word LM: add one with `streamasr lm`")
    try:
        bundle.config.chunk_frames(args.chunk_ms)
    except ValueError as err:
        raise UsageError(f"--chunk-ms: {err}") from None
    grid = [
        BeamOptions(int(size), weight, score, commit, int(tokens) or None, blank, merge == "logadd")
        for size in args.beam_sizes
        for weight in args.lm_weights
        for score in args.word_scores
        for commit in args.commit_ms
        for tokens in args.token_beams
        for blank in args.blank_penalties
        for merge in args.merges
    ]
    playback = Playback(room=args.room)
    rows = tune_beam(bundle, utterances, args.chunk_ms, grid, playback)
    print(f"{len(utterances)} utterances, {args.chunk_ms} ms chunks{playback.describe()}")
    print(
        "beam_size  token_beam  lm_weight  word_score  commit_ms  blank  merge   WER %"
        "  delay ms  search s"
    )
    for row in rows:
        if row.options is None:
            print(f"{'greedy':>9}{'':>63}  {row.wer:6.2f}")
            continue
        o = row.options
        delay = "-" if row.delay_ms is None else f"{row.delay_ms:.0f}"
        print(
            f"{o.beam_size:>9}  {str(o.token_beam or 'all'):>10}  {o.lm_weight:>9g}"
            f"  {o.word_score:>10g}  {str(o.commit_ms):>9}  {o.blank_penalty:>5g}"
            f"  {MERGES[o.log_add]:>6}  {row.wer:6.2f}  {delay:>8}  {row.search_s:8.1f}"
        )
    best = min(rows[1:], key=lambda row: row.wer)
    o = best.options
    print(
        f"best: --beam-size {o.beam_size} --lm-weight {o.lm_weight:g}"
        f" --word-score {o.word_score:g} --commit-ms {o.commit_ms}"
        f" --token-beam {o.token_beam or 0} --blank-penalty {o.blank_penalty:g}"
        f" --merge {MERGES[o.log_add]} ({best.wer:.2f} % WER)"
    )
    return 0


def _add_bench(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="speed and memory of long simulated streams")
    bench.add_argument("manifest", type=Path, help="utterances to join into long streams")
    _add_session_options(bench)
    bench.add_argument("--minutes", default="2,30", help="stream lengths (default 2,30)")
    bench.add_argument(
        "--per-utterance",
        type=Path,
        metavar="FILE",
        help="also write each played utterance's share of the stream's transcript and its word"
        " errors to this JSON-lines file (a line per utterance per stream)",
    )
    bench.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    from .bench import bench_stream, utterance_records
    from .manifest import read_audio_manifest

    try:
        lengths = [float(m) for m in args.minutes.split(",")]
    except ValueError:
        raise UsageError(
            f"--minutes: expected numbers such as 2,30, got {args.minutes!r}"
        ) from None
    utterances = read_audio_manifest(args.manifest, limit=200)
    with contextlib.ExitStack() as stack:
        out = None
        if args.per_utterance is not None:  # a bad path fails before the model loads
            try:
                out = stack.enter_context(open(args.per_utterance, "w", encoding="utf-8"))
            except OSError as err:
                raise UsageError(f"--per-utterance: {err.strerror}: {args.per_utterance}") from None
        bundle, options = _load_model(args, translate=args.translate, wait_k=args.wait_k)
        print(
            "minutes  RTF    chunk p50 ms  chunk p99 ms  RSS start MB  RSS peak MB  RSS end MB"
            "  segments  WER %"
        )
        for minutes in lengths:
            r = bench_stream(bundle, utterances, minutes, options)
            print(
                f"{r.minutes:7.1f}  {r.rtf:.3f}  {r.chunk_p50_ms:12.1f}  {r.chunk_p99_ms:12.1f}  "
                f"{r.rss_start_mb:12.0f}  {r.rss_peak_mb:11.0f}  {r.rss_end_mb:10.0f}"
                f"  {r.segments:8d}  {'-' if r.wer is None else f'{r.wer:5.2f}'}",
                flush=True,
            )
            for line in utterance_records(r.plan, r.transcripts) if out is not None else ():
                out.write(json.dumps({"minutes": minutes, **line}, ensure_ascii=False) + "\n")
    return 0


def _add_results(sub: argparse._SubParsersAction) -> None:
    res = sub.add_parser("results", help="write eval runs into the README's Results section")
    res.add_argument(
        "eval_dirs", nargs="+", type=Path, help="folders written by `streamasr eval --out`"
    )
    res.add_argument("--readme", type=Path, help="README to update (default: print the section)")
    res.set_defaults(func=cmd_results)


def cmd_results(args: argparse.Namespace) -> int:
    from .evaluate import results_section, update_readme

    missing = [d for d in args.eval_dirs if not (d / "summary.json").is_file()]
    if missing:
        raise UsageError(f"{missing[0]}: no summary.json (run `streamasr eval --out` first)")
    section = results_section(args.eval_dirs)
    if args.readme is None:
        print(section)
        return 0
    try:
        update_readme(args.readme, section)
    except ValueError as err:
        raise UsageError(str(err)) from None
    print(f"updated {args.readme}")
    return 0


def _add_compare(sub: argparse._SubParsersAction) -> None:
    cmp = sub.add_parser(
        "compare",
        help="two eval runs' WER, BLEU and latency on the same utterances, by paired bootstrap",
        description="B's WER minus A's, streamed and with full context, on the utterances both "
        "eval folders read, with a 95 % interval from resampling utterances (paired bootstrap), "
        "and the same for each voice where the utterances have several; then, at each wait-k "
        "both folders ran, B's BLEU against A's (sacrebleu's paired bootstrap) and B's AL and LAAL against A's on the utterances both translated (paired "
        "bootstrap). With --pool, the same over several pairs of folders at once.",
    )
    cmp.add_argument("a", type=Path, help="an eval folder (`streamasr eval --out`): the baseline")
    cmp.add_argument("b", type=Path, help="an eval folder of the same manifest: the candidate")
    cmp.add_argument(
        "--pool",
        nargs=2,
        action="append",
        type=Path,
        metavar=("A2", "B2"),
        default=[],
        help="one more pair of eval folders (of another manifest), pooled with A and B: every "
        "figure is over the utterances of all pairs, resampled together (repeatable)",
    )
    cmp.add_argument("--samples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    cmp.add_argument("--seed", type=int, default=0, help="resampling seed (default 0)")
    cmp.set_defaults(func=cmd_compare)


def _require_eval_folder(folder: Path) -> None:
    if not (folder / "instances.jsonl").is_file():
        raise UsageError(f"{folder}: no instances.jsonl (run `streamasr eval --out` first)")


def cmd_compare(args: argparse.Namespace) -> int:
    from .evaluate import (
        one_row_per_utterance,
        paired_bleu_bootstrap,
        paired_latency_bootstrap,
        paired_wer_bootstrap,
        read_instances,
        transcripts_by_id,
        translations_by_k,
    )

    if args.samples < 1:
        raise UsageError(f"--samples {args.samples}: must be at least 1")
    pairs = [(args.a, args.b), *args.pool]
    rows_a, rows_b, a, b = [], [], {}, {}
    for n, (folder_a, folder_b) in enumerate(pairs):
        for folder in (folder_a, folder_b):
            _require_eval_folder(folder)
        pair_a, pair_b = read_instances(folder_a), read_instances(folder_b)
        if len(pairs) > 1:  # ids are a manifest's own: pooled, each pair's are told apart
            pair_a, pair_b = (
                [{**r, "id": f"{n}/{r['id']}"} for r in rows] for rows in (pair_a, pair_b)
            )
        pair_texts_a, pair_texts_b = transcripts_by_id(pair_a), transcripts_by_id(pair_b)
        common = pair_texts_a.keys() & pair_texts_b.keys()
        if not pair_texts_a or pair_texts_a.keys() != pair_texts_b.keys():
            raise UsageError(
                f"{folder_a} and {folder_b} did not read the same utterances with reference "
                f"transcripts ({len(pair_texts_a)} and {len(pair_texts_b)}, {len(common)} in common)"
            )
        if any(pair_texts_a[i][0] != pair_texts_b[i][0] for i in common):
            raise UsageError(
                f"{folder_a} and {folder_b}: the same ids with other reference transcripts"
            )
        rows_a += pair_a
        rows_b += pair_b
        a |= pair_texts_a
        b |= pair_texts_b
    ids = sorted(a)
    pooled = f" of {len(pairs)} pairs of folders, pooled" if len(pairs) > 1 else ""
    print(
        f"{len(ids)} utterances{pooled}; B - A in WER points, 95 % interval over {args.samples} "
        "resamples"
    )
    voice_of = {row["id"]: row.get("voice") for row in one_row_per_utterance(rows_a)}
    voices = sorted({voice_of[i] for i in ids if voice_of[i]})
    groups = [("", ids)]  # all utterances, then each voice's where there are several
    if len(voices) > 1:
        groups += [(f" {v}", [i for i in ids if voice_of[i] == v]) for v in voices]
    for label, group in groups:
        refs = [a[i][0] for i in group]
        for name, column in (("streamed", 1), ("full context", 2)):
            hyps_a, hyps_b = [a[i][column] for i in group], [b[i][column] for i in group]
            d = paired_wer_bootstrap(refs, hyps_a, hyps_b, args.samples, args.seed)
            print(
                f"{name:>12}{label}: A {d.a:.2f} %  B {d.b:.2f} %  B - A {d.b - d.a:+.2f} "
                f"[{d.low:+.2f}, {d.high:+.2f}]  B higher in {100 * d.b_higher:.1f} % of resamples"
            )
    translations_a, translations_b = translations_by_k(rows_a), translations_by_k(rows_b)
    for k, pairs in translations_a.items():
        other = translations_b.get(k, {})
        if not pairs or pairs.keys() != other.keys():
            continue  # B translated at other k, or other utterances
        ids = sorted(pairs)
        d = paired_bleu_bootstrap(
            [pairs[i][0] for i in ids],
            [pairs[i][1] for i in ids],
            [other[i][1] for i in ids],
            args.samples,
        )
        print(
            f"{'BLEU k=' + k:>12}: A {d.a:.2f}  B {d.b:.2f}  B - A {d.b - d.a:+.2f}  "
            f"p = {d.p_value:.3f} (sacrebleu's paired bootstrap)"
        )
        at_k = [[row for row in rows if str(row["wait_k"]) == k] for rows in (rows_a, rows_b)]
        for metric in ("AL", "LAAL"):
            paired = paired_latency_bootstrap(*at_k, metric, args.samples, args.seed)
            if paired is not None:
                d, count = paired
                print(
                    f"{metric + ' k=' + k:>12}: A {d.a:.0f} ms  B {d.b:.0f} ms  B - A "
                    f"{d.b - d.a:+.0f} [{d.low:+.0f}, {d.high:+.0f}] ms ({count} translated by both)"
                )
    return 0


SIMULEVAL_LOGS_ABOUT = (
    "OUT/k<K>/instances.log and config.yaml for each wait-k of an eval folder, in SimulEval "
    "1.1.4's format: `simuleval --score-only --output OUT/k<K>` scores the same translations "
    "and delays with SimulEval's scorers (BLEU, AL, LAAL, DAL, AP, ATD, StartOffset, EndOffset)."
)


def _add_simuleval_logs(sub: argparse._SubParsersAction) -> None:
    logs = sub.add_parser(
        "simuleval-logs",
        help="an eval folder's translations as SimulEval instance logs, for its own scorers",
        description=f"{SIMULEVAL_LOGS_ABOUT} With --computation-aware, SimulEval 1.1.4 reports "
        "the computation-aware figures under the plain names too.",
    )
    logs.add_argument("eval_dir", type=Path, help="a folder written by `streamasr eval --out`")
    logs.add_argument("--out", type=Path, required=True, help="folder for the k<K> logs")
    logs.set_defaults(func=cmd_simuleval_logs)


def cmd_simuleval_logs(args: argparse.Namespace) -> int:
    from .evaluate import write_simuleval_logs

    _require_eval_folder(args.eval_dir)
    written = write_simuleval_logs(args.eval_dir, args.out)
    if not written:
        raise UsageError(f"{args.eval_dir}: no reference translations, nothing for SimulEval")
    for k, (folder, count) in written.items():
        print(f"k = {k}: {count} instances in {folder}")
    metrics = "AL LAAL DAL AP ATD StartOffset EndOffset"
    print(f"score one: simuleval --score-only --output {folder} --latency-metrics {metrics}")
    return 0


def _add_word_errors(sub: argparse._SubParsersAction) -> None:
    words = sub.add_parser(
        "word-errors",
        help="an eval run's missed words by how often the training text holds them",
        description="The reference words of an eval folder's transcripts, in bands of how often "
        "the training text holds each, and the share of them the streamed and the full-context "
        "transcripts missed (substituted or deleted in the WER alignment); then the words "
        "missed most.",
    )
    words.add_argument("eval_dir", type=Path, help="an eval folder (`streamasr eval --out`)")
    words.add_argument(
        "--train-text",
        type=Path,
        nargs="+",
        required=True,
        metavar="FILE",
        help="the training text: manifests (.jsonl) or text files, one sentence a line (e.g. "
        "../shared/data/multi30k/train.en, whose sentences every training corpus here speaks)",
    )
    words.add_argument("--top", type=int, default=15, help="most-missed words listed (default 15)")
    words.add_argument("--voice", help="only the utterances of this voice (the manifest's name)")
    words.set_defaults(func=cmd_word_errors)


def cmd_word_errors(args: argparse.Namespace) -> int:
    from .evaluate import frequency_band_rows, read_instances, training_word_counts, word_errors

    _require_eval_folder(args.eval_dir)
    for path in args.train_text:
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
    if args.top < 0:
        raise UsageError(f"--top {args.top}: give a count >= 0")
    counts = training_word_counts(args.train_text)
    rows = read_instances(args.eval_dir)
    if args.voice is not None:
        voices = sorted({row.get("voice") or "" for row in rows} - {""})
        rows = [row for row in rows if row.get("voice") == args.voice]
        if not rows:
            raise UsageError(f"--voice {args.voice}: not in {args.eval_dir} ({', '.join(voices)})")
    streamed, full = word_errors(rows)
    total = sum(streamed.words.values())
    if not total:
        raise UsageError(f"{args.eval_dir}: no reference transcripts")
    print(
        f"{total} reference words; {len(counts)} distinct words in the training text; "
        "missed: substituted or deleted"
    )
    print("times in training text | words | share | missed streamed | missed full context "
          "| share of the streamed misses")  # fmt: skip
    for line in frequency_band_rows(streamed, full, counts):
        print(line)
    print(f"inserted words: {streamed.inserted} streamed, {full.inserted} full context")
    if args.top:
        print(
            "missed most (streamed): word (times in training text) missed/in reference, "
            "the word most often read in its place"
        )
        for word, n in streamed.missed.most_common(args.top):
            line = f"  {word} ({counts[word]}) {n}/{streamed.words[word]}"
            if read_as := streamed.most_read_as(word):
                heard, times = read_as
                line += f", as {heard} {times} time{'s' * (times != 1)}"
            print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamasr",
        description="Streaming English speech recognition and English->German translation.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_data(sub)
    _add_train(sub)
    _add_stream_commands(sub)
    _add_eval(sub)
    _add_eval_text(sub)
    _add_tune_lm(sub)
    _add_bench(sub)
    _add_results(sub)
    _add_compare(sub)
    _add_simuleval_logs(sub)
    _add_word_errors(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("matplotlib", "sacrebleu"):  # their INFO lines are not ours
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from .audio import AudioError
    from .bundle import ModelFolderError
    from .corpus import CorpusError
    from .manifest import ManifestError

    try:
        return args.func(args)
    except (
        UsageError,
        VoiceError,
        AudioError,
        CorpusError,
        ModelFolderError,
        ManifestError,
    ) as err:
        print(f"streamasr: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("streamasr: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout's reader left (`| head`): stop quietly, as the Python docs do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as err:  # a path given cannot be read or written: missing folder, permissions
        where = f"{err.filename}: " if err.filename else ""
        print(f"streamasr: error: {where}{err.strerror or err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
