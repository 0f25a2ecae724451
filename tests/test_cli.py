"""`streamasr transcribe` end to end with a tiny model: formats, clocks, bad input."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sys

import numpy as np
import pytest
import sacrebleu
import soundfile as sf
import torch
from conftest import SENTENCES_DE, SENTENCES_EN, simuleval_scores

from streamasr.bundle import load_bundle
from streamasr.cli import main
from streamasr.decoding import TranscriptWaitKTranslator, translate_segment
from streamasr.policy import WaitK
from streamasr.text import normalize_transcript
from streamasr.train_cascade import translate_transcripts


@pytest.fixture
def wav(tmp_path, tone):
    path = tmp_path / "talk.wav"
    sf.write(path, np.concatenate([tone, np.zeros(8000, np.float32), tone]), 16000)
    return path


def transcribe(capsys, *args):
    code = main(["transcribe", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_jsonl_events_follow_the_contract(capsys, wav, tiny_bundle_dir):
    code, out, _ = transcribe(
        capsys, wav, "--model", tiny_bundle_dir, "--translate", "--format", "jsonl"
    )
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    assert events
    keys = {"stream", "segment", "type", "text", "final", "delay_ms", "elapsed_ms"}
    assert all(set(e) == keys for e in events)
    assert {e["type"] for e in events} == {"transcript", "translation"}
    delays = [e["delay_ms"] for e in events]
    assert delays == sorted(delays) and all(e["elapsed_ms"] >= e["delay_ms"] for e in events)
    assert events[-1]["final"]


def test_virtual_and_wall_clock_give_the_same_text(capsys, tmp_path, tone, tiny_bundle_dir):
    short = tmp_path / "short.wav"
    sf.write(short, tone[:16000], 16000)
    texts = []
    for clock in ("virtual", "wall"):
        code, out, _ = transcribe(
            capsys, short, "--model", tiny_bundle_dir, "--clock", clock, "--format", "jsonl"
        )
        assert code == 0
        texts.append(
            [(e["type"], e["text"], e["final"]) for e in map(json.loads, out.splitlines())]
        )
    assert texts[0] == texts[1]


@pytest.mark.parametrize("kind", ["srt", "vtt"])
def test_subtitles_are_valid(capsys, wav, tiny_bundle_dir, kind, tmp_path):
    out_file = tmp_path / f"out.{kind}"
    code, _, _ = transcribe(
        capsys, wav, "--model", tiny_bundle_dir, "--translate", "--format", kind, "-o", out_file
    )
    assert code == 0
    text = out_file.read_text()
    sep = "," if kind == "srt" else r"\."
    stamp = rf"\d\d:\d\d:\d\d{sep}\d\d\d"
    cues = re.findall(rf"({stamp}) --> ({stamp})", text)
    assert cues, text
    assert all(start < end for start, end in cues)
    if kind == "vtt":
        assert text.startswith("WEBVTT\n\n")
    else:
        assert text.startswith("1\n")


def test_several_files_and_text_output(capsys, wav, tmp_path, tiny_bundle_dir):
    other = tmp_path / "other.flac"
    sf.write(other, np.zeros(16000, np.float32), 48000)  # 48 kHz, silence
    code, out, _ = transcribe(capsys, wav, other, "--model", tiny_bundle_dir)
    assert code == 0
    assert f"{wav}:" in out


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, "no such file"),
        (lambda p: p.write_text("hello"), "not a readable audio file"),
        (lambda p: sf.write(p, np.zeros(0, np.float32), 16000), "no audio samples"),
    ],
)
def test_bad_audio_is_one_line_and_nonzero(capsys, tmp_path, tiny_bundle_dir, make, message):
    path = tmp_path / "bad.wav"
    make(path)
    code, _, err = transcribe(capsys, path, "--model", tiny_bundle_dir)
    assert code != 0
    assert message in err and len(err.strip().splitlines()) == 1


def test_odd_formats_are_converted(capsys, tmp_path, tone, tiny_bundle_dir):
    stereo8k = tmp_path / "s.wav"
    sf.write(stereo8k, np.stack([tone[::2], tone[::2]], 1), 8000)
    tiny = tmp_path / "tiny.wav"
    sf.write(tiny, tone[:1600], 16000)  # 0.1 s: shorter than one chunk
    for path in (stereo8k, tiny):
        code, _, err = transcribe(capsys, path, "--model", tiny_bundle_dir, "--format", "jsonl")
        assert code == 0, err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--wait-k", "0"], "wait-k"),
        (["--wait-k", "soon"], "wait-k"),
        (["--chunk-ms", "100"], "chunk-ms"),
        (["--format", "pdf"], "invalid choice"),
        (["--translate-from", "subtitles"], "invalid choice"),
        (["--no-repeat-ngram", "-1"], "non-negative integer"),
    ],
)
def test_bad_flags_are_one_line_errors(capsys, wav, tiny_bundle_dir, args, message):
    try:  # argparse exits; errors found after parsing return a status
        code = main(["transcribe", str(wav), "--model", str(tiny_bundle_dir), *args])
    except SystemExit as exit_info:
        code = exit_info.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_missing_model_folder(capsys, wav, tmp_path):
    code, _, err = transcribe(capsys, wav, "--model", tmp_path / "nothing")
    assert code == 2 and "not a model folder" in err


@pytest.fixture
def corpus_and_model(tmp_path, wav, tiny_bundle_dir):
    """A copy of the tiny model folder and a corpus whose train and tune manifests say SENTENCES_EN."""
    import shutil

    from conftest import SENTENCES_EN

    model = tmp_path / "model"
    shutil.copytree(tiny_bundle_dir, model)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = [{"id": f"u{i}", "audio": str(wav), "text": t} for i, t in enumerate(SENTENCES_EN)]
    (corpus / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return corpus, model


def test_lm_command_adds_a_word_lm_that_transcribe_uses(capsys, tmp_path, wav, corpus_and_model):
    from conftest import SENTENCES_EN

    from streamasr.bundle import load_bundle

    corpus, model = corpus_and_model
    assert main(["lm", "--corpus", str(corpus), "--model", str(model), "--open-vocab", "0"]) == 0
    assert "1-grams" in capsys.readouterr().out
    assert load_bundle(model).has_lm
    code, out, _ = transcribe(capsys, wav, "--model", model, "--format", "jsonl")
    assert code == 0
    vocabulary = {w for s in SENTENCES_EN for w in s.split()}
    said = " ".join(json.loads(line)["text"] for line in out.splitlines()).split()
    assert said and set(said) <= vocabulary
    assert main(["lm", "--corpus", str(tmp_path / "nowhere"), "--model", str(model)]) == 2
    assert "no train.jsonl" in capsys.readouterr().err


def test_words_flag_favours_a_file_of_words_or_says_why_it_cannot(
    capsys, tmp_path, wav, corpus_and_model
):
    corpus, model = corpus_and_model
    words = tmp_path / "words.txt"
    words.write_text("meadow 3\nquokka\n")
    code, _, err = transcribe(capsys, wav, "--model", model, "--words", words)
    assert code == 2 and "--words needs the beam search" in err  # no word LM yet
    assert main(["lm", "--corpus", str(corpus), "--model", str(model), "--open-vocab", "0"]) == 0
    code, out, err = transcribe(
        capsys, wav, "--model", model, "--words", words, "--format", "jsonl"
    )
    assert code == 0 and out
    assert "cannot spell these words, so they will not be recognized: quokka" in err
    out_dir = tmp_path / "eval"
    argv = ["eval", str(corpus / "train.jsonl"), "--model", str(model), "--limit", "1"]
    assert main([*argv, "--words", str(words), "--out", str(out_dir)]) == 0
    assert json.loads((out_dir / "summary.json").read_text())["decoder"].endswith(
        f"--words {words}"
    )
    code, _, err = transcribe(
        capsys, wav, "--model", model, "--words", words, "--decoder", "greedy"
    )
    assert code == 2 and "--words needs the beam search" in err
    for path, message in ((tmp_path / "none.txt", "no such file"), (tmp_path, "not a UTF-8")):
        code, _, err = transcribe(capsys, wav, "--model", model, "--words", path)
        assert code == 2 and message in err and len(err.splitlines()) == 1
    words.write_text("\n")
    code, _, err = transcribe(capsys, wav, "--model", model, "--words", words)
    assert code == 2 and "words.txt: no words in it" in err


def test_tune_lm_prints_greedy_and_every_setting(capsys, corpus_and_model):
    corpus, model = corpus_and_model
    manifest = str(corpus / "train.jsonl")
    assert main(["tune-lm", manifest, "--model", str(model), "--limit", "2"]) == 2
    assert "no word LM" in capsys.readouterr().err
    assert main(["lm", "--corpus", str(corpus), "--model", str(model), "--open-vocab", "0"]) == 0
    capsys.readouterr()
    args = ["--limit", "2", "--lm-weights", "0.5,2", "--word-scores", "0", "--beam-sizes", "4"]
    assert main(["tune-lm", manifest, "--model", str(model), *args, "--token-beams", "0,8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[0] == "greedy"
    rows = [line.split()[:4] for line in lines[3:7]]
    assert rows == [
        ["4", "all", "0.5", "0"], ["4", "8", "0.5", "0"], ["4", "all", "2", "0"], ["4", "8", "2", "0"]
    ]  # fmt: skip
    assert all(float(line.split()[-1]) >= 0 for line in lines[3:7])  # search seconds
    assert lines[7].startswith("best: --beam-size 4")
    search = ["--blank-penalties", "0,1", "--merges", "max,logadd"]
    assert main(["tune-lm", manifest, "--model", str(model), *args, *search]) == 0
    rows = [line.split()[5:7] for line in capsys.readouterr().out.splitlines()[3:11]]
    assert rows == [[b, m] for _ in "ab" for b in ("0", "1") for m in ("max", "logadd")]
    with pytest.raises(SystemExit):
        main(["tune-lm", manifest, "--model", str(model), "--merges", "sum"])
    assert "expected max, logadd or max,logadd" in capsys.readouterr().err
    room = ["--limit", "1", "--room", "0.3,10"]
    assert main(["tune-lm", manifest, "--model", str(model), *room]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header == "1 utterances, 320 ms chunks, in a room of RT60 0.3 s, DRR 10 dB"
    rows = [json.loads(line) for line in (corpus / "train.jsonl").read_text().splitlines()]
    rows[1]["voice"] = "flite:awb"  # an evaluation voice: never tuned on
    (corpus / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["tune-lm", str(corpus / "eval.jsonl"), "--model", str(model)]) == 2
    err = capsys.readouterr().err
    assert "u1 is spoken by flite:awb, a voice reserved" in err and len(err.splitlines()) == 1


def test_lm_command_reads_multi30k_text_as_the_corpus_manifest(capsys, tmp_path, corpus_and_model):
    from conftest import SENTENCES_EN

    corpus, model = corpus_and_model
    assert main(["lm", "--corpus", str(corpus), "--model", str(model)]) == 0
    from_manifest = (model / "lm.arpa").read_text()
    (tmp_path / "train.en").write_text("".join(s + "\n" for s in SENTENCES_EN))
    assert main(["lm", "--multi30k", str(tmp_path), "--model", str(model)]) == 0
    assert (model / "lm.arpa").read_text() == from_manifest
    capsys.readouterr()
    assert main(["lm", "--multi30k", str(tmp_path / "nowhere"), "--model", str(model)]) == 2
    assert "no train.en" in capsys.readouterr().err


def test_eval_text_scores_the_cascade_on_reference_transcripts(capsys, tmp_path, tiny_bundle_dir):
    (tmp_path / "val.en").write_text("".join(s + "\n" for s in SENTENCES_EN[:4]))
    (tmp_path / "val.de").write_text("".join(s + "\n" for s in SENTENCES_DE[:4]))
    logs = tmp_path / "simuleval"
    args = ["eval-text", str(tmp_path), "--model", str(tiny_bundle_dir), "--wait-k", "2,inf"]
    assert main([*args, "--simuleval-logs", str(logs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "4 val pairs, reference transcripts; latency in source words"
    bundle = load_bundle(tiny_bundle_dir)
    texts = [normalize_transcript(s) for s in SENTENCES_EN[:4]]
    timed = translate_transcripts(bundle.model, texts, bundle.transcript_tokenizer, bundle.de, 2)
    hyps = [hyp for hyp, _ in timed]
    policy = WaitK(2, bundle.model.cfg.tokens_per_unit)
    translator = TranscriptWaitKTranslator(
        bundle.model, bundle.transcript_tokenizer, policy, bundle.de.bos_id, bundle.de.eos_id
    )
    with torch.no_grad():  # the words put together as a session's are: the pieces' decoding
        assert hyps == [
            bundle.de.decode(translate_segment(translator, [[w] for w in t.split()])) for t in texts
        ]
    bleu = sacrebleu.corpus_bleu(hyps, [SENTENCES_DE[:4]]).score
    assert lines[1].startswith(f"k=2: BLEU {bleu:.2f}")
    for (hyp, delays), text in zip(timed, texts):  # a word per delay, written after k words read
        assert len(delays) == len(hyp.split()) and delays == sorted(delays)
        assert all(min(2, len(text.split())) <= d <= len(text.split()) for d in delays)
    # k = inf writes every word once the whole sentence is read: AL = the source's length
    at_inf = translate_transcripts(
        bundle.model, texts, bundle.transcript_tokenizer, bundle.de, None
    )
    with_words = [len(t.split()) for t, (hyp, _) in zip(texts, at_inf) if hyp]
    assert (
        lines[2].startswith("k=inf: BLEU")
        and f"AL {sum(with_words) / len(with_words):.2f}" in lines[2]
    )
    # SimulEval's own scorers read the logs as text-to-text and agree with the printed figures
    for line, k in zip(lines[1:], ("2", "inf")):
        printed = dict(re.findall(r"(\w+) (\d+\.\d+)", line))
        theirs = simuleval_scores(logs / f"k{k}", ["AL", "LAAL", "DAL", "AP"])
        assert theirs["BLEU"] == pytest.approx(float(printed["BLEU"]), abs=0.005)
        for name in ("AL", "LAAL", "DAL", "AP"):
            assert theirs[name] == pytest.approx(float(printed[name]), abs=0.005), (k, name)
    assert (
        main(["eval-text", str(tmp_path), "--split", "test", "--model", str(tiny_bundle_dir)]) == 2
    )
    assert "no test.en" in capsys.readouterr().err


def test_multi30k_text_is_for_cascade_training(capsys, tmp_path):
    assert main(["train", "--work", str(tmp_path), "--multi30k", str(tmp_path)]) == 2
    assert "--multi30k is for --cascade" in capsys.readouterr().err
    assert main(["train", "--work", str(tmp_path), "--recognized", str(tmp_path)]) == 2
    assert "--recognized is for --cascade" in capsys.readouterr().err
    assert main(["train", "--work", str(tmp_path), "--cascade-whole-source"]) == 2
    assert "--cascade-whole-source is for --cascade" in capsys.readouterr().err
    argv = ["train", "--work", str(tmp_path), "--cascade", "--cascade-whole-source"]
    assert main(argv) == 2  # a config that cannot be: one line, no traceback
    assert "cascade_whole_source needs transcript_encoder_layers" in capsys.readouterr().err
    assert main(["train", "--work", str(tmp_path), "--cascade-whole-encoder"]) == 2
    assert "--cascade-whole-encoder is for --cascade" in capsys.readouterr().err
    argv = ["train", "--work", str(tmp_path), "--cascade", "--transcript-encoder-layers", "1"]
    assert main([*argv, "--cascade-whole-encoder"]) == 2
    assert "cascade_whole_encoder needs cascade_whole_source" in capsys.readouterr().err
    assert main([*argv, "--cascade-train-all"]) == 2
    assert "--cascade-train-all is for --cascade-whole-encoder" in capsys.readouterr().err
    assert main(["train", "--work", str(tmp_path)]) == 2
    assert "train needs --corpus" in capsys.readouterr().err
    argv = ["train", "--work", str(tmp_path), "--cascade", "--self-condition-layers", "2"]
    assert main(argv) == 2
    assert "--self-condition-layers changes the speech model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--work", str(tmp_path), "--self-condition-layers", "4,2"])
    assert "blocks must ascend without repeats" in capsys.readouterr().err


def test_lm_opens_its_vocabulary_with_common_english_words(capsys, corpus_and_model, monkeypatch):
    corpus, model = corpus_and_model
    assert main(["lm", "--corpus", str(corpus), "--model", str(model), "--open-vocab", "2000"]) == 0
    assert "common English words" in capsys.readouterr().out
    lexicon = (model / "lexicon.txt").read_text().splitlines()
    words = {line.split("\t")[0] for line in lexicon}
    assert {"house", "water", "because"} <= words and len(words) > 1500
    assert all(re.fullmatch(r"[a-z']+", w) for w in words)  # wordfreq writes digits as 0s
    monkeypatch.setitem(sys.modules, "wordfreq", None)  # not installed
    assert main(["lm", "--corpus", str(corpus), "--model", str(model)]) == 2
    assert "pip install 'streamasr[lm]'" in capsys.readouterr().err


def test_nonfinite_samples_are_reported_not_fatal(capsys, tmp_path, tone, tiny_bundle_dir):
    path = tmp_path / "glitch.wav"
    audio = np.concatenate([tone, tone])
    audio[len(tone)] = np.nan
    sf.write(path, audio, 16000, subtype="FLOAT")
    code, out, err = transcribe(capsys, path, "--model", tiny_bundle_dir)
    assert code == 0
    assert f"{path}: 1 samples were NaN or infinite, read as silence" in err


def test_an_unwritable_output_is_one_line(capsys, wav, tmp_path, tiny_bundle_dir):
    missing = tmp_path / "no" / "such" / "folder" / "out.txt"
    code, _, err = transcribe(capsys, wav, "--model", tiny_bundle_dir, "-o", missing)
    assert code == 2
    assert err.strip() == f"streamasr: error: {missing}: No such file or directory"


def test_a_closed_pipe_ends_quietly(monkeypatch, capsys, wav, tiny_bundle_dir):
    """`streamasr transcribe ... | head -1`: the reader leaves; no traceback, no more writes."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    closed = open(write_end, "w", buffering=1)
    monkeypatch.setattr(sys, "stdout", closed)
    code = main(["transcribe", str(wav), "--model", str(tiny_bundle_dir), "--format", "jsonl"])
    assert code == 1
    assert capsys.readouterr().err == ""
    closed.close()


def test_a_missing_input_device_is_one_line_before_the_live_view(capsys, tiny_bundle_dir):
    assert main(["live", "--device", "99", "--model", str(tiny_bundle_dir)]) == 2
    out = capsys.readouterr()
    assert out.out == ""  # the live view never drew
    assert out.err.startswith("streamasr: error: audio input: no usable input device 99")
    assert len(out.err.strip().splitlines()) == 1


class _Stdin:
    """Standard input as a pipe (`isatty` false) holding `data`, or a terminal."""

    def __init__(self, data: bytes = b"", tty: bool = False):
        self.buffer, self.tty = io.BytesIO(data), tty

    def isatty(self) -> bool:
        return self.tty


def test_pcm_piped_into_stdin_streams_like_the_same_audio_in_a_file(
    monkeypatch, capsys, tmp_path, tone, tiny_bundle_dir
):
    audio = np.concatenate([tone, np.zeros(8000, np.float32), tone])
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2")
    sf.write(tmp_path / "same.wav", pcm, 16000, subtype="PCM_16")
    args = ["--model", tiny_bundle_dir, "--translate", "--format", "jsonl"]
    _, from_file, _ = transcribe(capsys, tmp_path / "same.wav", *args)
    monkeypatch.setattr(sys, "stdin", _Stdin(pcm.tobytes() + b"\x01"))  # and half a sample
    code, from_pipe, err = transcribe(capsys, "-", *args)
    assert code == 0
    events = [json.loads(line) for line in from_pipe.splitlines()]
    assert {e["stream"] for e in events} == {"stdin"}

    def timed_words(output):  # elapsed_ms holds measured compute time, which varies
        return [(e["segment"], e["type"], e["text"], e["final"], e["delay_ms"]) for e in output]

    file_events = [json.loads(line) for line in from_file.splitlines()]
    assert timed_words(events) == timed_words(file_events)
    assert any(e["text"] for e in events)
    assert "stdin: the stream ended mid-sample" in err


@pytest.mark.parametrize(
    "audio, stdin, message",
    [
        (["-"], _Stdin(tty=True), "-: standard input is a terminal; pipe raw 16 kHz mono"),
        (["-", "-"], _Stdin(), "-: standard input can be read once"),
    ],
)
def test_stdin_misuse_is_one_line(monkeypatch, capsys, tiny_bundle_dir, audio, stdin, message):
    monkeypatch.setattr(sys, "stdin", stdin)
    code, out, err = transcribe(capsys, *audio, "--model", tiny_bundle_dir)
    assert code == 2 and out == ""
    assert err.startswith(f"streamasr: error: {message}") and len(err.splitlines()) == 1


def test_text_and_live_views_show_partials_only_until_words_are_committed():
    from rich.console import Console

    from streamasr.live import LiveView
    from streamasr.outputs import TextWriter
    from streamasr.session import Event
    from streamasr.sources import Source

    def ev(kind, text, final=False):
        return Event("mic", 0, kind, text, final, 0.0, 0.0)

    def screen(view):
        console = Console(file=io.StringIO(), width=60, record=True)
        console.print(view.render())
        return console.export_text()

    view, out = LiveView(Source(), translate=False), io.StringIO()
    writer = TextWriter(out)
    for batch in ([ev("partial", "a man")], [ev("transcript", "a"), ev("partial", "men run")]):
        view.events(batch)
        writer.events(batch)
    assert "a men run" in screen(view)
    final = [ev("transcript", "man runs", final=True)]
    view.events(final)
    writer.events(final)
    assert "a man runs" in screen(view) and "men" not in screen(view)
    assert out.getvalue() == "a man runs\n"  # the text format writes committed words only


def test_live_keeps_its_captions_and_the_audio_it_heard(
    monkeypatch, capsys, tmp_path, tone, tiny_bundle_dir
):
    """`live -o` keeps the events it shows, `--record` the audio the session heard (a NaN as the
    silence it was read as), and transcribing the recording gives the same words at the same
    delays. The microphone is a file here; tests/test_live_mic.py has a real device."""
    from streamasr import sources

    audio = np.concatenate([tone, np.zeros(8000, np.float32), tone])
    audio[100] = np.nan
    monkeypatch.setattr(sources, "MicSource", lambda device: sources.FileSource("mic", audio=audio))
    kept, heard = tmp_path / "kept.jsonl", tmp_path / "heard.wav"
    args = ["--model", str(tiny_bundle_dir), "--translate", "--format", "jsonl"]
    before = signal.getsignal(signal.SIGINT)  # ignored when pytest runs in the background
    assert main(["live", *args, "-o", str(kept), "--record", str(heard)]) == 0
    assert signal.getsignal(signal.SIGINT) is before  # live restored it
    shown = capsys.readouterr().out
    assert kept.read_text() == shown and any(
        json.loads(line)["text"] for line in shown.splitlines()
    )
    recorded, rate = sf.read(heard, dtype="float32")
    assert rate == 16000 and len(recorded) == len(audio) and recorded[100] == 0
    assert np.abs(recorded - np.nan_to_num(audio)).max() < 1 / 16000  # 16-bit PCM

    def timed_words(output):  # elapsed_ms holds measured compute time, which varies
        events = [json.loads(line) for line in output.splitlines()]
        return [(e["segment"], e["type"], e["text"], e["final"], e["delay_ms"]) for e in events]

    _, again, _ = transcribe(capsys, heard, *args)
    assert timed_words(again) == timed_words(shown)


@pytest.mark.parametrize(
    "flag, path, message",
    [
        ("--record", "heard.xyz", "heard.xyz: not a sound file name (.wav, .flac, .ogg)"),
        ("--record", "no/such/heard.wav", "no/such/heard.wav: cannot be written"),
        ("-o", "no/such/kept.srt", "no/such/kept.srt: No such file or directory"),
    ],
)
def test_live_files_that_cannot_be_written_are_one_line(
    monkeypatch, capsys, tmp_path, tone, tiny_bundle_dir, flag, path, message
):
    from streamasr import sources

    monkeypatch.setattr(sources, "MicSource", lambda device: sources.FileSource("mic", audio=tone))
    monkeypatch.chdir(tmp_path)
    assert main(["live", "--model", str(tiny_bundle_dir), "--format", "jsonl", flag, path]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith(f"streamasr: error: {message}")
    assert len(out.err.splitlines()) == 1


def test_subtitles_of_files_with_one_name_are_refused_not_overwritten(
    capsys, tmp_path, wav, tiny_bundle_dir
):
    (tmp_path / "other").mkdir()
    again = tmp_path / "other" / wav.name
    again.write_bytes(wav.read_bytes())
    code, out, err = transcribe(
        capsys, wav, again, "--model", tiny_bundle_dir, "--format", "srt", "-o", tmp_path / "subs"
    )
    assert code == 2 and out == "" and not (tmp_path / "subs").exists()
    assert (
        err
        == f"streamasr: error: several inputs are named talk: each would write {tmp_path / 'subs' / 'talk'}.srt\n"
    )


def _ctrl_c():
    raise KeyboardInterrupt


@pytest.mark.parametrize("stop", [_ctrl_c, lambda: os.kill(os.getpid(), signal.SIGTERM)])
def test_ctrl_c_or_sigterm_in_transcribe_keeps_the_subtitles_heard_so_far(
    monkeypatch, capsys, tmp_path, wav, tiny_bundle_dir, stop
):
    from streamasr import sources

    read = sources.FileSource.read
    pieces = iter(range(1000))

    def read_then_stop(self, timeout=0.5):  # stopped once 1.5 s have been read
        if next(pieces) == 15:
            stop()
        return read(self, timeout)

    monkeypatch.setattr(sources.FileSource, "read", read_then_stop)
    srt = tmp_path / "talk.srt"
    code, _, err = transcribe(capsys, wav, "--model", tiny_bundle_dir, "--format", "srt", "-o", srt)
    assert code == 130 and err == f"streamasr: interrupted: {wav} kept up to 1.5 s\n"
    cues = srt.read_text().strip().split("\n\n")
    assert cues[0].startswith("1\n00:00:00,") and all(cue.strip() for cue in cues)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


def test_live_ended_before_its_seconds_leaves_no_timer_behind(
    monkeypatch, capsys, tone, tiny_bundle_dir
):
    import threading

    from streamasr import sources

    monkeypatch.setattr(sources, "MicSource", lambda device: sources.FileSource("mic", audio=tone))
    assert (
        main(["live", "--model", str(tiny_bundle_dir), "--format", "jsonl", "--seconds", "3600"])
        == 0
    )
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer) and t.is_alive()]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_export_stores_the_weights_in_half_precision(capsys, tmp_path, tiny_bundle_dir, dtype):
    out = tmp_path / dtype
    args = ["export", "--model", str(tiny_bundle_dir), "--out", str(out), "--dtype", dtype]
    assert main(args) == 0
    sizes = [(folder / "model.safetensors").stat().st_size for folder in (tiny_bundle_dir, out)]
    assert sizes[1] < 0.6 * sizes[0]
    full, half = load_bundle(tiny_bundle_dir).model, load_bundle(out).model
    stored = getattr(torch, dtype)
    for (name, a), b in zip(full.state_dict().items(), half.state_dict().values(), strict=True):
        assert b.dtype == a.dtype == torch.float32, name  # loading casts back to float32
        assert torch.equal(b, a.to(stored).float()), name
    with pytest.raises(SystemExit):  # a source is required: --work or --model
        main(["export", "--out", str(tmp_path / "none")])
    assert "--work" in capsys.readouterr().err
