"""Audio sources behind one interface: a file (simulated streaming) and a microphone.

A source hands out pieces of 16 kHz mono float32 audio through `read`, which returns None
once the source has ended. Live sources fill a bounded queue from their capture thread (or
PortAudio's callback); a full queue drops the piece and counts it, never silently.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .audio import SAMPLE_RATE, AudioReader, StreamResampler, ms_to_samples

log = logging.getLogger(__name__)


class DeviceError(ValueError):
    """No usable input device (none present, bad name or index)."""


class Source:
    """Base: a bounded queue between a producer thread and the session thread."""

    name = "source"
    duration_ms: float | None = None  # known in advance for files only
    odd_bytes = 0  # a pipe that ended mid-sample: the half sample's bytes, not audio

    def __init__(self, queue_pieces: int = 200):
        self.queue: queue.Queue[np.ndarray | None] = queue.Queue(maxsize=queue_pieces)
        self.dropped_pieces = 0  # queue full: the session could not keep up
        self.device_overflows = 0  # the device reported lost input
        self.stop_event = threading.Event()

    def _offer(self, piece: np.ndarray | None) -> None:
        try:
            self.queue.put_nowait(piece)
        except queue.Full:
            self.dropped_pieces += 1

    def start(self) -> None:
        raise NotImplementedError

    def read(self, timeout: float = 0.5) -> np.ndarray | None:
        """The next piece; None when the source has ended. Waits while a live source is quiet."""
        while True:
            try:
                return self.queue.get(timeout=timeout)
            except queue.Empty:
                if self.stop_event.is_set():
                    return None

    def stop(self) -> None:
        self.stop_event.set()


class FileSource(Source):
    """A sound file handed out in pieces, decoded a block at a time as they are needed (memory
    does not grow with the file); `pace=True` releases them in real time."""

    def __init__(
        self,
        path: str | Path,
        piece_ms: float = 100,
        pace: bool = False,
        audio: np.ndarray | None = None,
    ):
        """`audio`, when given, is the already decoded 16 kHz signal of `path` (decoded once)."""
        super().__init__()
        self.name = str(path)
        self.audio = audio
        self.reader = AudioReader(path) if audio is None else None  # checks the file now
        self.piece_samples = max(1, ms_to_samples(piece_ms))
        self.pace = pace
        self._pieces = self._split()
        self._thread: threading.Thread | None = None

    @property
    def duration_ms(self) -> float:
        if self.reader is not None:
            return self.reader.duration_ms
        return len(self.audio) * 1000 / SAMPLE_RATE

    def _split(self) -> Iterator[np.ndarray]:
        """The signal in pieces of `piece_ms` (the last one shorter), read once."""
        blocks = [self.audio] if self.reader is None else self.reader.blocks()
        carry = np.zeros(0, np.float32)
        for block in blocks:
            carry = np.concatenate([carry, block]) if len(carry) else block
            whole = len(carry) // self.piece_samples * self.piece_samples
            for start in range(0, whole, self.piece_samples):
                yield carry[start : start + self.piece_samples]
            carry = carry[whole:]
        if len(carry):
            yield carry

    def start(self) -> None:
        if self.pace:
            self._thread = threading.Thread(target=self._paced, name="file-capture", daemon=True)
            self._thread.start()

    def _paced(self) -> None:
        t0 = time.perf_counter()
        sent = 0
        for piece in self._pieces:
            if self.stop_event.is_set():
                break
            sent += len(piece)
            time.sleep(max(0.0, t0 + sent / SAMPLE_RATE - time.perf_counter()))
            self._offer(piece)
        self.queue.put(None)  # end of stream is never dropped

    def read(self, timeout: float = 0.5) -> np.ndarray | None:
        if self.pace:
            return super().read(timeout)
        return next(self._pieces, None)


class PipeSource(Source):
    """Raw 16 kHz mono signed 16-bit little-endian PCM from a pipe (`transcribe -`), read in the
    session's thread as it arrives: nothing is dropped, and a reader slower than the writer holds
    the writer back through the pipe instead."""

    def __init__(self, stream: BinaryIO, name: str = "stdin", piece_ms: float = 100):
        super().__init__()
        self.name = name
        self.stream = stream
        self.piece_bytes = 2 * max(1, ms_to_samples(piece_ms))
        self._carry = b""

    def start(self) -> None:
        pass

    def read(self, timeout: float = 0.5) -> np.ndarray | None:
        data = self._carry + self.stream.read(self.piece_bytes)  # blocks until a piece or EOF
        whole = len(data) // 2 * 2
        self._carry = data[whole:]
        if not whole:
            self.odd_bytes = len(self._carry)
            return None
        return np.frombuffer(data[:whole], dtype="<i2").astype(np.float32) / 32768.0


def list_input_devices() -> list[str]:
    import sounddevice as sd

    lines = []
    for index, dev in enumerate(sd.query_devices()):
        if dev["max_input_channels"] > 0:
            lines.append(
                f"{index}: {dev['name']} ({dev['max_input_channels']} ch, {dev['default_samplerate']:.0f} Hz)"
            )
    return lines


class MicSource(Source):
    """A sounddevice input stream; its callback only copies into the bounded queue. A device
    that is not there is a DeviceError at construction, before any view or session starts."""

    def __init__(
        self, device: str | int | None = None, block_ms: float = 100, queue_pieces: int = 200
    ):
        import sounddevice as sd

        super().__init__(queue_pieces)
        self.device = int(device) if isinstance(device, str) and device.isdigit() else device
        self.block_ms = block_ms
        self.name = f"mic:{device if device is not None else 'default'}"
        self.stream = None
        self.rate = SAMPLE_RATE
        self.resampler: StreamResampler | None = None  # when the device opens at another rate
        try:
            self.info = sd.query_devices(self.device, kind="input")
        except (ValueError, sd.PortAudioError) as err:
            raise DeviceError(f"no usable input device {self.device!r}: {err}") from None

    def _callback(self, indata, frames, time_info, status) -> None:
        if status.input_overflow:
            self.device_overflows += 1
        self._offer(indata[:, 0].copy())

    def start(self) -> None:
        import sounddevice as sd

        for rate in (SAMPLE_RATE, int(self.info["default_samplerate"])):
            try:
                self.stream = sd.InputStream(
                    device=self.device, samplerate=rate, channels=1, dtype="float32",
                    blocksize=int(rate * self.block_ms / 1000), callback=self._callback,
                )  # fmt: skip
                self.rate = rate
                self.resampler = StreamResampler(rate) if rate != SAMPLE_RATE else None
                break
            except sd.PortAudioError as err:
                log.debug("input at %d Hz failed: %s", rate, err)
        if self.stream is None:
            raise DeviceError(
                f"input device {self.info['name']!r} opens at neither 16 kHz nor its default rate"
            )
        self.stream.start()
        log.info("listening on %s at %d Hz", self.info["name"], self.rate)

    def read(self, timeout: float = 0.5) -> np.ndarray | None:
        piece = super().read(timeout)
        if self.resampler is None:
            return piece
        if piece is None:  # the end: the samples the resampler still holds, then None
            tail, self.resampler = self.resampler.flush(), None
            return tail if len(tail) else None
        return self.resampler.push(piece)

    def stop(self) -> None:
        super().stop()
        if self.stream is not None:
            self.stream.stop()
            self.stream.close()
            self.stream = None
