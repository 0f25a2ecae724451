"""Our model through SimulEval's own evaluator: same words, same delays as our Session."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from streamasr.bundle import load_bundle
from streamasr.runner import run_stream
from streamasr.session import Session, SessionOptions
from streamasr.sources import FileSource

pytest.importorskip("simuleval")


def test_simuleval_scores_our_agent(tmp_path, tone, tiny_bundle_dir):
    files = [tmp_path / "a.wav", tmp_path / "b.wav"]
    sf.write(files[0], tone, 16000)
    sf.write(files[1], np.concatenate([tone[::-1], tone]).copy(), 16000)
    (tmp_path / "src.txt").write_text("".join(f"{f}\n" for f in files))
    (tmp_path / "tgt.txt").write_text("Ein Hund rennt .\nZwei Katzen spielen im Gras .\n")
    simuleval = shutil.which("simuleval", path=str(sys.executable).rsplit("/", 1)[0])
    result = subprocess.run(
        [simuleval, "--agent", "streamasr/simuleval_agent.py", "--source", str(tmp_path / "src.txt"),
         "--target", str(tmp_path / "tgt.txt"), "--source-type", "speech", "--target-type", "text",
         "--source-segment-size", "320", "--model-dir", str(tiny_bundle_dir), "--wait-k", "2",
         "--output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    logged = [
        json.loads(line) for line in (tmp_path / "out" / "instances.log").read_text().splitlines()
    ]
    assert len(logged) == 2

    bundle = load_bundle(tiny_bundle_dir)
    for path, instance in zip(files, logged, strict=True):
        session = Session(bundle, SessionOptions(chunk_ms=320, wait_k=2), stream=str(path))
        events = []
        run_stream(session, FileSource(path), events.extend)
        words = [(w, e.delay_ms) for e in events if e.type == "translation" for w in e.text.split()]
        assert instance["prediction"] == " ".join(w for w, _ in words)
        assert instance["delays"] == pytest.approx([d for _, d in words])
        assert words, "the tiny model should translate something"
