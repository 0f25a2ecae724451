"""Re-synthesis through WORLD: what it keeps, determinism, resume, reserved voices."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf

from streamasr.cli import main
from streamasr.vocoder import HELD_OUT, VocoderDraw, vocode

RATE = 16000


def vowel(seconds: float = 0.6, f0: float = 120.0) -> np.ndarray:
    """A pulse train at f0 through two formant resonances: a crude sustained vowel."""
    n = int(seconds * RATE)
    x = np.zeros(n)
    x[:: int(RATE / f0)] = 1.0
    for formant, bandwidth in ((700.0, 80.0), (1200.0, 100.0)):
        r = np.exp(-np.pi * bandwidth / RATE)
        a1, a2 = -2 * r * np.cos(2 * np.pi * formant / RATE), r * r
        y = np.zeros(n)
        for i in range(n):  # a two-pole resonator
            y[i] = x[i] - a1 * y[i - 1] - a2 * y[i - 2]
        x = y
    return (0.5 * x / np.abs(x).max()).astype(np.float32)


DRAWS = [VocoderDraw(), HELD_OUT, VocoderDraw(vocoder="mlsa"), replace(HELD_OUT, vocoder="mlsa")]


@pytest.mark.parametrize("draw", DRAWS, ids=["world", "world-held-out", "mlsa", "mlsa-held-out"])
def test_vocode_keeps_length_peak_and_the_formants(draw):
    x = vowel()
    y = vocode(x, RATE, draw)
    assert y.shape == x.shape and y.dtype == np.float32
    assert np.abs(y).max() == pytest.approx(np.abs(x).max(), rel=1e-5)
    assert np.array_equal(y, vocode(x, RATE, draw))
    # the spectral peak stays at the first formant; the re-synthesis is not the input
    spectrum = np.abs(np.fft.rfft(y[RATE // 10 : -RATE // 10]))
    peak_hz = np.argmax(spectrum) * RATE / (len(y) - RATE // 5)
    assert 500 < peak_hz < 900
    assert not np.allclose(y, x, atol=1e-2)


def test_the_held_out_setting_lies_beyond_the_training_draw():
    draws = [VocoderDraw.draw(random.Random(i)) for i in range(500)]
    assert all(d.envelope_dims > HELD_OUT.envelope_dims for d in draws)
    assert all(d.variance_scale > HELD_OUT.variance_scale for d in draws)
    assert all(d.smooth_frames < HELD_OUT.smooth_frames for d in draws)
    assert len({d.envelope_dims for d in draws}) > 10


def write_corpus(folder, voices):
    (folder / "wav").mkdir(parents=True)
    with open(folder / "train.jsonl", "w") as f:
        for i, voice in enumerate(voices):
            sf.write(folder / "wav" / f"{i}.flac", vowel(0.4, 100.0 + 20 * i), RATE)
            row = {"id": f"train-{i:05d}", "audio": f"wav/{i}.flac", "text": "a dog",
                   "translation": "ein Hund", "voice": voice, "duration_ms": 400.0}  # fmt: skip
            f.write(json.dumps(row) + "\n")
    return folder / "train.jsonl"


def test_data_vocode_writes_a_corpus_and_resumes(tmp_path, capsys):
    source = write_corpus(tmp_path / "corpus-a", ["flite:rms", "espeak:en-us+m1", "flite:kal16"])
    out = tmp_path / "world"
    args = ["data", "vocode", f"{source}:2", "--out", str(out), "--jobs", "1", "--seed", "3"]
    assert main(args) == 0
    assert "utterances: 2" in capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert [r["id"][: len("corpus-a-train-")] for r in rows] == ["corpus-a-train-"] * 2
    for row in rows:
        assert row["voice"].startswith("world:") and row["text"] == "a dog"
        assert row["translation"] == "ein Hund"
        assert VocoderDraw(**row["vocoder"]) == VocoderDraw.draw(random.Random(f"3:{row['id']}"))
        assert sf.info(out / row["audio"]).samplerate == RATE
        assert row["duration_ms"] == pytest.approx(400.0, abs=1)
    # a second run keeps what is there and writes the same manifest
    written = {r["audio"]: (out / r["audio"]).stat().st_mtime_ns for r in rows}
    manifest = (out / "train.jsonl").read_text()
    assert main(args) == 0
    assert {a: (out / a).stat().st_mtime_ns for a in written} == written
    assert (out / "train.jsonl").read_text() == manifest


def test_data_vocode_held_out_uses_one_setting(tmp_path):
    source = write_corpus(tmp_path / "corpus-a", ["flite:rms", "flite:kal16"])
    out = tmp_path / "tune"
    assert main(["data", "vocode", str(source), "--out", str(out), "--split", "val",
                 "--held-out", "--vocoder", "mlsa", "--jobs", "1"]) == 0  # fmt: skip
    rows = [json.loads(line) for line in (out / "val.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert all(VocoderDraw(**r["vocoder"]) == replace(HELD_OUT, vocoder="mlsa") for r in rows)
    assert [r["voice"] for r in rows] == ["mlsa:flite:rms", "mlsa:flite:kal16"]


@pytest.mark.parametrize(
    "voice", ["flite:awb", "festival:cmu_us_slt_arctic_hts", "espeak:en-us+f5"]
)
def test_data_vocode_refuses_reserved_voices(tmp_path, capsys, voice):
    source = write_corpus(tmp_path / "corpus-a", ["flite:rms", voice])
    assert main(["data", "vocode", str(source), "--out", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip()
    assert "reserved" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "w").exists()


def test_data_vocode_missing_manifest_is_a_one_line_error(tmp_path, capsys):
    assert main(["data", "vocode", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "w")]) == 2
    assert "no such manifest" in capsys.readouterr().err
