"""`streamasr eval`: the contract's outputs, transcript-only manifests, CA metrics by formula."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import jiwer
import numpy as np
import pytest
import soundfile as sf
from conftest import simuleval_scores

from streamasr.cli import build_parser, main
from streamasr.evaluate import PARTIAL_FILE, paired_wer_bootstrap, partial_captions
from streamasr.manifest import read_manifest
from streamasr.metrics import (
    AWARE,
    PLAIN,
    average_lagging,
    average_token_delay,
    length_adaptive_average_lagging,
)
from streamasr.session import Event, SessionOptions
from streamasr.text import normalize_transcript

RUN_KEYS = {"wait_k", "wer", "wer_full_context", "bleu", "chrf", "AL", "LAAL", "DAL", "AP", "StartOffset", "EndOffset",
            "ATD", "AL_CA", "LAAL_CA", "DAL_CA", "ATD_CA", "asr_delay_ms", "asr_partial_delay_ms", "asr_partial_changes_per_word", "rtf"}  # fmt: skip


@pytest.fixture
def manifest(tmp_path, tone):
    (tmp_path / "wav").mkdir()
    sf.write(tmp_path / "wav" / "a.wav", tone, 16000)
    sf.write(tmp_path / "wav" / "b.wav", np.concatenate([tone[::-1], tone]).copy(), 16000)
    rows = [
        {
            "id": "a",
            "audio": "wav/a.wav",
            "text": "A man in an orange hat.",
            "translation": "Ein Mann mit Hut.",
        },
        {
            "id": "b",
            "audio": "wav/b.wav",
            "text": "Two dogs play.",
            "translation": "Zwei Hunde spielen.",
            "voice": "x",
        },
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_eval_writes_summary_instances_and_plot(manifest, tmp_path, tiny_bundle_dir, capsys):
    out = tmp_path / "eval"
    code = main(
        [
            "eval",
            str(manifest),
            "--model",
            str(tiny_bundle_dir),
            "--wait-k",
            "1,3,inf",
            "--translate-from",
            "transcript",
            "--no-repeat-ngram",
            "3",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["chunk_ms"] == 320 and summary["model"] == tiny_bundle_dir.name
    assert summary["translate_from"] == "transcript" and summary["translation_search"] == {
        "beam": 4,
        "no_repeat_ngram": 3,
    }
    assert [r["wait_k"] for r in summary["runs"]] == [1, 3, "inf"]
    for run in summary["runs"]:
        assert set(run) == RUN_KEYS
        assert (
            set(run["asr_delay_ms"]) == set(run["asr_partial_delay_ms"]) == {"mean", "p50", "p90"}
        )
        assert run["bleu"] is not None and run["wer"] is not None and run["rtf"] > 0
    instances = [json.loads(line) for line in (out / "instances.jsonl").read_text().splitlines()]
    assert len(instances) == 6
    assert [i["voice"] for i in instances if i["wait_k"] == 1] == [None, "x"]
    # WER per voice the manifest names: "b" alone is voice "x"; "a" names none
    b = next(i for i in instances if i["id"] == "b")
    wer_b = [
        100 * jiwer.wer("two dogs play", normalize_transcript(b[key]))
        for key in ("transcript", "full_context_transcript")
    ]
    assert summary["wer_by_voice"] == {
        "x": {"utterances": 1, "wer": pytest.approx(wer_b[0]), "wer_full_context": pytest.approx(wer_b[1])}
    }  # fmt: skip
    first_wrong = [
        sum(i[key].split()[:1] != [ref] for i, ref in zip(instances[:2], ("a", "two")))
        for key in ("transcript", "full_context_transcript")
    ]
    assert summary["first_words_wrong"] == {
        "utterances": 2, "streaming": first_wrong[0], "full_context": first_wrong[1]
    }  # fmt: skip
    assert len({r["wer_full_context"] for r in summary["runs"]}) == 1  # one offline pass per file
    for utt in ("a", "b"):
        assert len({i["full_context_transcript"] for i in instances if i["id"] == utt}) == 1
    for ins in instances:
        assert len(ins["delays_ms"]) == len(ins["elapsed_ms"]) == len(ins["translation"].split())
        assert len(ins["transcript_word_ms"]) == len(ins["transcript"].split())
        shown, committed = ins["transcript_word_shown_ms"], ins["transcript_word_ms"]
        assert len(shown) == len(committed) and all(s <= c for s, c in zip(shown, committed))
    assert (out / "latency_quality.png").stat().st_size > 1000
    table = capsys.readouterr().out
    assert "LAAL" in table and "inf" in table and "x: WER" in table
    assert "first word wrong: " in table

    # The README section names the run's settings and holds its table.
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- results:begin -->\nold\n<!-- results:end -->\nrest\n")
    assert main(["results", str(out), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "translation from the transcript" in text and "no repeated 3-grams" in text
    assert "| inf |" in text and "old" not in text and text.endswith("rest\n")

    # The compute-aware metrics are the plain formulas applied to elapsed times.
    inf_run = [ins for ins in instances if ins["wait_k"] == "inf" and ins["elapsed_ms"]]
    ca = [
        average_lagging(i["elapsed_ms"], i["source_ms"], len(i["translation_ref"].split(" ")))
        for i in inf_run
    ]
    laal = [
        length_adaptive_average_lagging(
            i["elapsed_ms"], i["source_ms"], len(i["translation_ref"].split(" "))
        )
        for i in inf_run
    ]
    run = summary["runs"][2]
    assert run["AL_CA"] == pytest.approx(sum(ca) / len(ca), abs=0.2)
    assert run["LAAL_CA"] == pytest.approx(sum(laal) / len(laal), abs=0.2)
    assert run["AL_CA"] >= run["AL"]
    atd = [average_token_delay(i["delays_ms"], i["elapsed_ms"]) for i in inf_run]
    assert run["ATD_CA"] == pytest.approx(sum(atd) / len(atd), abs=0.2)


def test_transcript_only_manifest(tmp_path, tone, tiny_bundle_dir):
    sf.write(tmp_path / "a.wav", tone, 16000)
    (tmp_path / "m.jsonl").write_text(
        json.dumps({"id": "a", "audio": "a.wav", "text": "a dog"}) + "\n"
    )
    out = tmp_path / "eval"
    assert (
        main(
            [
                "eval",
                str(tmp_path / "m.jsonl"),
                "--model",
                str(tiny_bundle_dir),
                "--wait-k",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    run = json.loads((out / "summary.json").read_text())["runs"][0]
    assert run["wer"] is not None
    for key in ("bleu", "chrf", *PLAIN, *AWARE):  # every latency metric too
        assert run[key] is None, key


def test_bad_manifest_is_one_line(tmp_path, capsys, tiny_bundle_dir):
    (tmp_path / "m.jsonl").write_text("{not json\n")
    assert main(["eval", str(tmp_path / "m.jsonl"), "--model", str(tiny_bundle_dir)]) == 2
    err = capsys.readouterr().err
    assert "expected a JSON object" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["eval", "bench", "tune-lm"])
@pytest.mark.parametrize(
    "rows, message",
    [
        ("", "no utterances"),
        ('{"id": "a", "audio": "gone.wav"}\n', "1 audio files missing"),
        (
            '{"id": 7, "audio": "x.wav"}\n{"id": "7", "audio": "y.wav"}\n',
            "1 ids name several utterances, first '7'",
        ),
    ],
)
def test_manifests_without_playable_audio_are_one_line(
    tmp_path, capsys, tiny_bundle_dir, command, rows, message
):
    (tmp_path / "m.jsonl").write_text(rows)
    assert main([command, str(tmp_path / "m.jsonl"), "--model", str(tiny_bundle_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"streamasr: error: {tmp_path / 'm.jsonl'}: {message}")
    assert len(err.strip().splitlines()) == 1


def test_manifest_voices_are_names(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"id": "a", "audio": "a.wav", "voice": 3}\n{"id": "b", "audio": "b.wav"}\n')
    assert [u.voice for u in read_manifest(path)] == ["3", None]  # sortable beside other names


def test_lead_silence_is_the_same_as_silence_in_the_files(
    manifest, tmp_path, tone, tiny_bundle_dir, capsys
):
    """--lead-silence-ms streams each file after that much digital silence: the outputs equal
    those of files that hold the silence themselves, latencies counted from its start."""
    padded = tmp_path / "padded"
    (padded / "wav").mkdir(parents=True)
    for name in ("a", "b"):
        audio, rate = sf.read(tmp_path / "wav" / f"{name}.wav", dtype="float32")
        sf.write(padded / "wav" / f"{name}.wav", np.concatenate([np.zeros(8000), audio]), rate)
    (padded / "m.jsonl").write_text(manifest.read_text())

    def run(path, out, *extra):
        args = ["eval", str(path), "--model", str(tiny_bundle_dir), "--wait-k", "2,inf"]
        assert main([*args, "--out", str(out), *extra]) == 0
        lines = (out / "instances.jsonl").read_text().splitlines()
        keep = ("transcript", "translation", "source_ms", "delays_ms", "full_context_transcript")
        instances = [{k: json.loads(line)[k] for k in keep} for line in lines]
        return json.loads((out / "summary.json").read_text()), instances

    silent, silent_instances = run(manifest, tmp_path / "e1", "--lead-silence-ms", "500")
    files, file_instances = run(padded / "m.jsonl", tmp_path / "e2")
    assert silent["lead_silence_ms"] == 500 and files["lead_silence_ms"] == 0
    assert silent["pause_lookback_ms"] == SessionOptions().pause_lookback_ms
    assert silent_instances == file_instances
    assert silent_instances[0]["source_ms"] == pytest.approx(500 + len(tone) / 16)
    capsys.readouterr()
    assert main(["results", str(tmp_path / "e1")]) == 0
    heading = capsys.readouterr().out
    assert "each after 500 ms of silence" in heading
    assert f"pause lookback {SessionOptions().pause_lookback_ms} ms" in heading


def test_room_plays_each_file_reverberated(manifest, tmp_path, tiny_bundle_dir, capsys):
    def run(out, *extra):
        args = ["eval", str(manifest), "--model", str(tiny_bundle_dir), "--wait-k", "inf"]
        assert main([*args, "--out", str(out), *extra]) == 0
        return json.loads((out / "summary.json").read_text())

    dry, wet = run(tmp_path / "dry"), run(tmp_path / "wet", "--room", "0.6,0")
    assert dry["room"] is None and wet["room"] == {"rt60_s": 0.6, "drr_db": 0.0}
    outputs = [
        [
            json.loads(line)["full_context_transcript"]
            for line in open(tmp_path / d / "instances.jsonl")
        ]
        for d in ("dry", "wet")
    ]
    assert outputs[0] != outputs[1]  # the tiny model reads the reverberant audio otherwise
    capsys.readouterr()
    assert main(["results", str(tmp_path / "wet")]) == 0
    assert "in a room of RT60 0.6 s, DRR 0 dB" in capsys.readouterr().out
    for bad in ("0.5", "0,6", "x,1", "0.5,nan"):
        with pytest.raises(SystemExit):
            main(["eval", str(manifest), "--room", bad])
    assert "--room: expected RT60,DRR" in capsys.readouterr().err


def test_bench_streams_whole_utterances_and_scores_their_transcripts(manifest, tone, tiny_bundle):
    import dataclasses

    from streamasr import bench

    utterances = read_manifest(manifest)  # a: 2.3 s, b: 4.6 s
    plan = bench.stream_plan(utterances, 0.15, bench.PAUSE_MS)  # 9 s: a, b, then a again
    assert [u.id for u in plan] == ["a", "b", "a"]
    played = sum(len(piece) for piece in bench.long_stream(plan, bench.PAUSE_MS, 100))
    assert played == 4 * len(tone) + 3 * 16000
    words = "a man in an orange hat two dogs play a man in an orange hat".split()
    assert bench.stream_wer(plan, words) == 0
    assert bench.stream_wer(plan, ["A", "Man,"] + words[2:-1]) == pytest.approx(100 / 15)
    no_text = [dataclasses.replace(u, text=None) for u in plan]
    assert bench.stream_wer(no_text, words) is None
    options = SessionOptions(translate=False)
    result = bench.bench_stream(tiny_bundle, utterances, 0.15, options)
    assert result.wer is not None and result.wer >= 0 and result.segments >= 1


def test_bench_gives_each_utterance_the_segments_that_lie_in_its_span(manifest):
    from streamasr import bench
    from streamasr.session import Segment

    plan = bench.stream_plan(read_manifest(manifest), 0.15, bench.PAUSE_MS)  # a 2.3 s, b 4.6 s, a
    # the utterances start at 0, 3.3 and 8.9 s of the stream
    segments = [
        Segment(0, 40, 2200, "a man in", ""),
        Segment(1, 2400, 3000, "an orange hat", ""),  # split at a pause inside a, ends in its pause
        Segment(2, 3200, 7800, "two dogs", ""),  # begins just before b's start: its middle is in b
        Segment(3, 9000, 11000, "", ""),  # nothing read
    ]
    transcripts = bench.utterance_transcripts(plan, bench.PAUSE_MS, segments)
    assert transcripts == ["a man in an orange hat", "two dogs", ""]
    records = bench.utterance_records(plan, transcripts)
    assert [(r["id"], r["words"], r["errors"]) for r in records] == [
        ("a", 6, 0),
        ("b", 3, 1),
        ("a", 6, 6),
    ]
    assert records[1]["reference"] == "two dogs play" and records[2]["transcript"] == ""


def test_bench_prints_speed_memory_and_wer(manifest, tiny_bundle_dir, tmp_path, capsys):
    lines = tmp_path / "per-utterance.jsonl"
    args = ["bench", str(manifest), "--model", str(tiny_bundle_dir), "--minutes", "0.1"]
    assert main([*args, "--per-utterance", str(lines)]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert header.split()[-2:] == ["WER", "%"]
    assert len(row.split()) == 9 and float(row.split()[-1]) >= 0
    records = [json.loads(line) for line in lines.read_text().splitlines()]
    assert [r["id"] for r in records] == ["a", "b"] and {r["minutes"] for r in records} == {0.1}
    assert all(r["errors"] is not None and r["words"] > 0 for r in records)
    assert main([*args, "--per-utterance", str(tmp_path / "missing" / "x.jsonl")]) == 2
    assert "--per-utterance: No such file or directory" in capsys.readouterr().err


def test_tune_beam_reads_each_file_as_the_playback_plays_it(manifest, tiny_bundle, monkeypatch):
    import streamasr.evaluate as evaluate

    heard = []

    def recording(bundle, audio, chunk_frames):
        heard.append(audio)
        return log_probs(bundle, audio, chunk_frames)

    log_probs = evaluate.ctc_log_probs
    monkeypatch.setattr(evaluate, "ctc_log_probs", recording)
    utterances = read_manifest(manifest)
    room = evaluate.Playback(room=(0.6, 0.0))
    (greedy,) = evaluate.tune_beam(tiny_bundle, utterances, 320, [], room)
    assert greedy.options is None and 0 <= greedy.wer
    assert [len(a) for a in heard] == [len(room.audio(u)) for u in utterances]
    assert all(np.array_equal(a, room.audio(u)) for a, u in zip(heard, utterances))
    assert not np.array_equal(heard[0], evaluate.Playback().audio(utterances[0]))
    assert room.describe() == ", in a room of RT60 0.6 s, DRR 0 dB"


def _eval_folder(
    folder, transcripts, refs, wait_ks=(3, "inf"), translations=None, full=None, voices=None
):
    """instances.jsonl of an eval run; each translation's words 1 s apart after `1 + 5 - words`
    s of a 5 s source (ending with it); the full-context transcripts `full`, or the refs; each
    utterance's voice from `voices` where given."""
    folder.mkdir()
    with open(folder / "instances.jsonl", "w") as f:
        for k in wait_ks:
            for i, (hyp, ref) in enumerate(zip(transcripts, refs)):
                row = {"id": f"u{i}", "wait_k": k, "text_ref": ref, "transcript": hyp}
                if voices is not None:
                    row["voice"] = voices[i]
                if translations is not None:
                    words = len(translations[i].split())
                    row |= {
                        "translation_ref": f"ein Mann reitet Pferd {i}",
                        "translation": translations[i],
                        "source_ms": 5000.0,
                        "delays_ms": [1000.0 * (6 - words + j) for j in range(words)],
                    }
                offline = ref if full is None else full[i]
                f.write(json.dumps({**row, "full_context_transcript": offline}) + "\n")


def test_compare_bootstraps_the_wer_difference_over_utterances(tmp_path, capsys):
    refs = [f"a man rides a horse number {i}" for i in range(40)]
    worse = [r.replace("horse", "house") if i % 2 else r for i, r in enumerate(refs)]
    german = [f"ein Mann reitet Pferd {i}" for i in range(40)]
    _eval_folder(tmp_path / "a", refs, refs, translations=german)
    cased = [r.capitalize() + "." for r in refs]
    _eval_folder(tmp_path / "b", worse, cased, wait_ks=(3,), translations=["ein Haus"] * 40)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--samples", "500"]) == 0
    streamed, full, bleu, al, laal = capsys.readouterr().out.splitlines()[1:]  # B has no k=inf
    # 20 substitutions in 280 words, every resample worse; full context the same in both
    assert "A 0.00 %  B 7.14 %  B - A +7.14" in streamed
    assert "B higher in 100.0 % of resamples" in streamed
    assert "B - A +0.00 [+0.00, +0.00]  B higher in 0.0 %" in full
    assert "BLEU k=3: A 100.00  B 0.00  B - A -100.00  p = 0.002" in bleu  # (0 + 1) / (500 + 1)
    # A's five words at 1..5 s lag 1 s each (AL 1000); B's two at 4 and 5 s: (4000 + 4000) / 2
    assert (
        "AL k=3: A 1000 ms  B 4000 ms  B - A +3000 [+3000, +3000] ms (40 translated by both)" in al
    )
    assert "LAAL k=3: A 1000 ms  B 4000 ms" in laal  # B's two words are shorter than the reference

    difference = paired_wer_bootstrap(refs, refs, worse, samples=2000, seed=1)
    assert 0 < difference.low < difference.b - difference.a < difference.high
    assert difference == paired_wer_bootstrap(refs, refs, worse, samples=2000, seed=1)


def test_compare_gives_each_voice_its_own_difference(tmp_path, capsys):
    refs = [f"a man rides a horse number {i}" for i in range(40)]
    voices = ["flite:awb" if i < 20 else "flite:slt" for i in range(40)]
    worse = [r.replace("horse", "house") if v == "flite:awb" else r for r, v in zip(refs, voices)]
    _eval_folder(tmp_path / "a", refs, refs, voices=voices)
    _eval_folder(tmp_path / "b", worse, refs, voices=voices)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--samples", "200"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert "streamed: A 0.00 %  B 7.14 %  B - A +7.14" in lines[0]  # 20 of 280 words
    awb = [line for line in lines if "flite:awb:" in line]
    slt = [line for line in lines if "flite:slt:" in line]
    assert len(awb) == len(slt) == 2  # streamed and full context
    assert "streamed flite:awb: A 0.00 %  B 14.29 %  B - A +14.29 [+14.29, +14.29]" in awb[0]
    assert "streamed flite:slt: A 0.00 %  B 0.00 %  B - A +0.00" in slt[0]
    assert "full context flite:awb: A 0.00 %  B 0.00 %" in awb[1]


def test_compare_pools_pairs_of_folders_of_other_manifests(tmp_path, capsys):
    refs = [f"a man rides a horse number {i}" for i in range(20)]  # 7 words each
    worse = [r.replace("horse", "house") for r in refs]
    _eval_folder(tmp_path / "a", refs, refs)
    _eval_folder(tmp_path / "b", worse, refs)  # 20 of 140 words wrong
    other = [f"two dogs run {i}" for i in range(40)]  # 4 words each, the same ids u0..u19 and on
    _eval_folder(tmp_path / "a2", other, other)
    _eval_folder(tmp_path / "b2", other, other)  # none wrong
    pool = ["--pool", str(tmp_path / "a2"), str(tmp_path / "b2")]
    assert (
        main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), *pool, "--samples", "200"]) == 0
    )
    head, streamed = capsys.readouterr().out.splitlines()[:2]
    assert head.startswith("60 utterances of 2 pairs of folders, pooled")
    assert "A 0.00 %  B 6.67 %  B - A +6.67" in streamed  # 20 of 140 + 160 words
    _eval_folder(tmp_path / "b3", other[:39], other[:39])
    bad = ["--pool", str(tmp_path / "a2"), str(tmp_path / "b3")]
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), *bad]) == 2
    assert "b3 did not read the same utterances" in capsys.readouterr().err


def test_compare_refuses_folders_of_other_utterances(tmp_path, capsys):
    _eval_folder(tmp_path / "a", ["a dog"] * 3, ["a dog"] * 3)
    _eval_folder(tmp_path / "b", ["a dog"] * 2, ["a dog"] * 2)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "did not read the same utterances" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "none")]) == 2
    assert "no instances.jsonl" in capsys.readouterr().err


def test_word_errors_by_how_often_the_training_text_holds_the_word(tmp_path, capsys):
    refs = ["A man rides a zebra.", "A dog runs"]
    _eval_folder(
        tmp_path / "run", ["a man rides the zebra", "a dog runs fast"], refs, wait_ks=(3, 5),
        full=["a man rides a zebra", "a dog"],
    )  # fmt: skip
    (tmp_path / "train.en").write_text("a man rides a horse\nA man walks.\n")
    row = {"id": "t0", "audio": "t0.wav", "text": "A dog."}
    (tmp_path / "train.jsonl").write_text(json.dumps(row) + "\n")
    train = [str(tmp_path / "train.en"), str(tmp_path / "train.jsonl")]
    assert main(["word-errors", str(tmp_path / "run"), "--train-text", *train, "--top", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("8 reference words; 6 distinct words in the training text")
    # never seen: zebra, runs (deleted in full context); 1-9 times: a a a man rides dog (one
    # "a" read as "the" when streamed); the same utterances at two wait-k count once
    assert lines[2].split() == "0 | 2 | 25.0 % | 0.0 % | 50.0 % | 0.0 %".split()
    assert lines[3].split() == "1-9 | 6 | 75.0 % | 16.7 % | 0.0 % | 100.0 %".split()
    assert lines[4].split() == "10-99 | 0 | 0.0 % | - | - | 0.0 %".split()
    assert lines[6].split() == "all | 8 | 100.0 % | 12.5 % | 12.5 % | 100.0 %".split()
    assert lines[7] == "inserted words: 1 streamed, 0 full context"
    assert lines[9] == "  a (4) 1/3, as the 1 time"
    assert main(["word-errors", str(tmp_path / "run"), "--train-text", "nothing.en"]) == 2
    assert "nothing.en: no such file" in capsys.readouterr().err
    assert main(["word-errors", str(tmp_path), "--train-text", *train]) == 2
    assert "no instances.jsonl" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_results_has_the_command_of_every_committed_results_folder(tmp_path):
    """`make results` names one `streamasr eval` per results/ folder, and each committed summary
    was written by its folder's command: chunk, wait-k list, source, search kind, silence, room,
    utterance count."""
    root = Path(__file__).parents[1]
    dry_run = subprocess.run(
        ["make", "-n", "-B", "results", f"RESULTS={tmp_path}"],
        cwd=root, capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = dry_run.stdout.replace("\\\n", " ").splitlines()
    commands = [
        shlex.split(line.split(" > ")[0]) for line in lines if "bin/streamasr eval " in line
    ]
    evals = [build_parser().parse_args(argv[argv.index("eval") :]) for argv in commands]
    assert {args.out.parent for args in evals} == {tmp_path}
    committed = sorted(p.parent.name for p in (root / "results").glob("*/summary.json"))
    assert sorted(args.out.name for args in evals) == committed
    counts = {}
    for args in evals:
        folder = root / "results" / args.out.name
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["chunk_ms"] == args.chunk_ms
        assert [run["wait_k"] for run in summary["runs"]] == [k or "inf" for k in args.wait_k]
        assert summary["translate_from"] == (args.translate_from or "transcript")
        assert (summary["decoder"] == "greedy") == (args.decoder == "greedy")
        assert summary["lead_silence_ms"] == args.lead_silence_ms
        room = summary["room"] and (summary["room"]["rt60_s"], summary["room"]["drr_db"])
        assert room == args.room
        rows = (folder / "instances.jsonl").read_text().splitlines()
        counts.setdefault(args.manifest, set()).add((args.limit, len(rows) // len(args.wait_k)))
    for manifest, pairs in counts.items():  # a limit is met; without one, the whole manifest
        whole = {n for limit, n in pairs if limit is None}
        assert len(whole) <= 1, manifest
        assert all(n == limit < min(whole, default=limit + 1) for limit, n in pairs if limit)


def test_a_word_is_shown_from_when_the_partials_put_it_in_its_place_for_good():
    def ev(segment, kind, text, delay_ms, final=False):
        return Event("s", segment, kind, text, final, delay_ms, delay_ms)

    events = [
        ev(0, "partial", "a men", 640),
        ev(0, "partial", "a man walks", 960),  # "men" revised: "man" is shown from 960
        ev(0, "transcript", "a", 1280),
        ev(0, "partial", "man runs", 1280),  # "runs" replaces "walks"
        ev(0, "translation", "Ein", 1600),  # no change to the display
        ev(0, "transcript", "man runs", 1920, final=True),
        ev(1, "transcript", "dogs", 2560),  # a new segment, no partial before: its commit
        ev(1, "partial", "bark", 2560),
        ev(1, "transcript", "bark", 2880, final=True),
    ]
    # changed: "men" (at 960), "walks" (at 1280)
    assert partial_captions(events) == ([640, 960, 1280, 2560, 2560], 2)
    plain = [e for e in events if e.type != "partial"]  # without partials: the commits
    assert partial_captions(plain) == ([1280, 1920, 1920, 2560, 2880], 0)


def test_simuleval_scores_the_exported_logs_as_the_summary_does(
    manifest, tmp_path, tiny_bundle_dir
):
    """`simuleval-logs` writes what `simuleval --score-only` reads (its own argument parsing and
    evaluator, in process), and SimulEval's BLEU and latencies equal the summary's."""
    out = tmp_path / "eval"
    argv = ["eval", str(manifest), "--model", str(tiny_bundle_dir), "--wait-k", "1,inf"]
    assert main([*argv, "--out", str(out)]) == 0
    assert main(["simuleval-logs", str(out), "--out", str(tmp_path / "se")]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for run in summary["runs"]:
        assert run["AL"] is not None and run["bleu"] is not None  # words were written
        metrics = ["AL", "LAAL", "DAL", "AP", "ATD", "StartOffset", "EndOffset"]
        theirs = simuleval_scores(tmp_path / "se" / f"k{run['wait_k']}", metrics)
        assert theirs["BLEU"] == pytest.approx(run["bleu"], abs=1e-3)
        for name in metrics:
            assert theirs[name] == pytest.approx(run[name], abs=1e-3), name


def test_an_eval_stopped_midway_resumes_where_it_stopped(
    manifest, tmp_path, tiny_bundle_dir, monkeypatch, capsys
):
    """Each finished run is kept as it ends; the same command resumes from them (a cut last line
    read as unfinished) and writes what an eval never stopped writes; other settings start
    afresh."""
    from streamasr import evaluate as evaluation

    argv = ["eval", str(manifest), "--model", str(tiny_bundle_dir), "--wait-k", "1,inf"]
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0
    assert not (tmp_path / "whole" / PARTIAL_FILE).exists()  # removed once the outputs are written
    run_instance, runs = evaluation.run_instance, []

    def stop_at_the_fourth(*args):
        if len(runs) == 3:
            raise KeyboardInterrupt
        runs.append(args[1].id)
        return run_instance(*args)

    monkeypatch.setattr(evaluation, "run_instance", stop_at_the_fourth)
    out = tmp_path / "stopped"
    assert main([*argv, "--out", str(out)]) == 130  # Ctrl-C
    log = out / PARTIAL_FILE
    assert len(log.read_text().splitlines()) == 1 + 3
    with open(log, "a") as f:
        f.write('{"id": "b", "wait_k": "in')  # the line being written when it stopped
    monkeypatch.setattr(evaluation, "run_instance", run_instance)
    capsys.readouterr()
    assert main([*argv, "--out", str(out)]) == 0
    assert "resuming: 3 of 4 runs kept" in capsys.readouterr().err
    whole = [json.loads(line) for line in (tmp_path / "whole" / "instances.jsonl").open()]
    resumed = [json.loads(line) for line in (out / "instances.jsonl").open()]
    timeless = lambda rows: [{k: v for k, v in r.items() if k != "elapsed_ms"} for r in rows]  # noqa: E731
    assert timeless(resumed) == timeless(whole)  # elapsed_ms is measured compute time
    assert not log.exists()

    log.write_text('{"other": "settings"}\n' + (out / "instances.jsonl").read_text())
    assert main([*argv, "--out", str(out)]) == 0
    assert "resuming" not in capsys.readouterr().err


def test_an_eval_instance_is_what_transcribe_writes_for_its_file(manifest, tiny_lm_bundle, capsys):
    """The eval streams each file as `transcribe` does: the same words at the same delays (the eval
    turns partial captions on to measure them, and they must change nothing else)."""
    model = str(tiny_lm_bundle.lm_folder)
    flags = ["--model", model, "--wait-k", "1", "--translate-from", "transcript"]
    assert main(["eval", str(manifest), *flags, "--out", str(manifest.parent / "ev")]) == 0
    instances = [json.loads(line) for line in (manifest.parent / "ev" / "instances.jsonl").open()]
    capsys.readouterr()
    for ins, wav in zip(instances, ("a.wav", "b.wav"), strict=True):
        path = str(manifest.parent / "wav" / wav)
        assert main(["transcribe", path, *flags, "--translate", "--format", "jsonl"]) == 0
        events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        for kind, text, delays in (
            ("transcript", ins["transcript"], ins["transcript_word_ms"]),
            ("translation", ins["translation"], ins["delays_ms"]),
        ):
            words = [
                (w, e["delay_ms"]) for e in events if e["type"] == kind for w in e["text"].split()
            ]
            assert [w for w, _ in words] == text.split()
            assert [d for _, d in words] == delays
    assert any(ins["translation"] for ins in instances)
