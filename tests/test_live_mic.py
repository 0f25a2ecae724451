"""The live path through a real PortAudio device: a virtual PulseAudio microphone fed in real time."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import soundfile as sf

pytestmark = pytest.mark.mic
SECONDS = 5.0


@pytest.fixture
def virtual_mic(tmp_path):
    """A PulseAudio daemon whose default source reads s16le 16 kHz mono from a FIFO."""
    if not (shutil.which("pulseaudio") and shutil.which("pactl")):
        pytest.skip("pulseaudio not installed (make test installs it)")
    env = dict(os.environ, PULSE_RUNTIME_PATH=str(tmp_path / "pulse"), HOME=str(tmp_path))
    os.makedirs(env["PULSE_RUNTIME_PATH"])
    fifo = tmp_path / "mic.fifo"
    subprocess.run(
        ["pulseaudio", "-D", "--exit-idle-time=-1", "-n", "--load=module-native-protocol-unix",
         "--load=module-null-sink sink_name=nul"],
        env=env, check=True, timeout=30,
    )  # fmt: skip
    try:
        for _ in range(50):
            if subprocess.run(["pactl", "info"], env=env, capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        subprocess.run(
            ["pactl", "load-module", "module-pipe-source", "source_name=virtmic", f"file={fifo}",
             "format=s16le", "rate=16000", "channels=1"],
            env=env, check=True, capture_output=True, timeout=10,
        )  # fmt: skip
        subprocess.run(["pactl", "set-default-source", "virtmic"], env=env, check=True, timeout=10)
        yield env, fifo
    finally:
        subprocess.run(["pulseaudio", "--kill"], env=env, capture_output=True, timeout=30)


def speech(tmp_path, tone) -> np.ndarray:
    """An utterance from espeak-ng when it is there, else the test tone."""
    if shutil.which("espeak-ng"):
        from streamasr.audio import load_audio

        wav = tmp_path / "say.wav"
        subprocess.run(
            ["espeak-ng", "-w", str(wav), "a man in an orange hat is looking at a dog"], check=True
        )
        sf.info(str(wav))
        return np.concatenate([load_audio(wav), tone])
    return tone


def feed(fifo, audio: np.ndarray, stop: threading.Event) -> None:
    """Write audio, then silence, in real time, until stopped."""
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    silence = bytes(3200)  # 100 ms
    with contextlib.suppress(BrokenPipeError), open(fifo, "wb") as f:  # until the mic is unloaded
        t0, sent = time.perf_counter(), 0
        position = 0
        while not stop.is_set():
            block = pcm[position : position + 3200] if position < len(pcm) else silence
            position += 3200
            f.write(block)
            f.flush()
            sent += 0.1
            time.sleep(max(0.0, t0 + sent - time.perf_counter()))


def test_live_emits_transcript_events_from_a_real_device(
    virtual_mic, tmp_path, tone, tiny_bundle_dir
):
    env, fifo = virtual_mic
    command = [sys.executable, "-m", "streamasr.cli", "live", "--model", str(tiny_bundle_dir), "--translate",
               "--seconds", str(SECONDS), "--format", "jsonl", "--record", str(tmp_path / "heard.wav")]  # fmt: skip
    live = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    stop = threading.Event()
    try:
        stderr = []
        for line in live.stderr:  # feed the microphone once the stream is open, as a speaker would
            stderr.append(line)
            if "listening on" in line:
                break
        writer = threading.Thread(
            target=feed, args=(fifo, speech(tmp_path, tone), stop), daemon=True
        )
        writer.start()
        stdout, rest = live.communicate(timeout=60)
    finally:
        stop.set()
        live.kill()
    stderr = "".join(stderr) + rest
    assert live.returncode == 0, stderr
    events = [json.loads(line) for line in stdout.splitlines()]
    transcript = [e for e in events if e["type"] == "transcript"]
    assert any(e["text"] for e in transcript), stdout
    assert transcript[-1]["final"]  # the open segment is closed when the stream stops
    assert all(e["elapsed_ms"] >= e["delay_ms"] for e in events)
    assert "dropped pieces: 0" in stderr
    heard = sf.info(str(tmp_path / "heard.wav"))  # what the device gave while the stream was open
    assert heard.samplerate == 16000 and SECONDS - 1 < heard.duration <= SECONDS + 1


def test_list_devices_shows_the_virtual_mic(virtual_mic):
    env, _ = virtual_mic
    result = subprocess.run(
        [sys.executable, "-m", "streamasr.cli", "live", "--list-devices"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
