"""The browser caption server: the page, the event stream, late and slow browsers, the CLI flag."""

from __future__ import annotations

import http.client
import json
import socket

import numpy as np
import pytest
import soundfile as sf

from streamasr.cli import main
from streamasr.session import Event
from streamasr.web import CaptionServer


def event(n: int, final: bool = False) -> Event:
    return Event("mic", 0, "transcript", f"word{n}", final, 320.0 * n, 330.0 * n)


def get(server: CaptionServer, path: str) -> http.client.HTTPResponse:
    host, port = server.httpd.server_address[:2]
    connection = http.client.HTTPConnection(host, port, timeout=10)
    connection.request("GET", path)
    return connection.getresponse()


def sse_events(body: str) -> tuple[list[dict], bool]:
    """The data events of a stream's body, and whether it ended with the end event."""
    blocks = [b.strip() for b in body.split("\n\n")]
    blocks = [b for b in blocks if b and not b.startswith(":")]
    ended = blocks[-1].startswith("event: end") if blocks else False
    data = [json.loads(b.removeprefix("data: ")) for b in blocks if b.startswith("data: ")]
    return data, ended


def test_the_page_is_served_and_other_paths_are_not_found():
    with CaptionServer(port=0) as server:
        page = get(server, "/")
        assert page.status == 200 and page.getheader("Content-Type").startswith("text/html")
        assert 'new EventSource("events")' in page.read().decode()
        assert get(server, "/nope").status == 404


def test_a_browser_gets_each_event_as_published_then_the_end():
    with CaptionServer(port=0) as server:
        stream = get(server, "/events")
        assert stream.getheader("Content-Type") == "text/event-stream"
        assert stream.fp.readline() == b": still here\n"  # subscribed before anything was published
        published = [event(1), event(2), event(3, final=True)]
        for e in published:
            server.publish([e])
        server.end()
        data, ended = sse_events(stream.read().decode())
    assert data == [e.to_json() for e in published] and ended


def test_a_late_browser_starts_with_the_recent_window():
    with CaptionServer(port=0, recent_events=3) as server:
        server.publish([event(n) for n in range(5)])
        server.end()
        data, ended = sse_events(get(server, "/events").read().decode())
    assert [d["text"] for d in data] == ["word2", "word3", "word4"] and ended


def test_a_browser_that_falls_out_of_the_window_is_let_go():
    server = CaptionServer(port=0, recent_events=3)
    try:
        batch, number, _ = server.read_from(None, timeout_s=0)
        assert batch == [] and number == 0
        server.publish([event(n) for n in range(5)])  # the session never waits for a reader
        assert server.read_from(number, timeout_s=0)[0] is None  # 0 and 1 have left the window
        batch, number, ended = server.read_from(3, timeout_s=0)
        assert [json.loads(d)["text"] for d in batch] == ["word3", "word4"]
        assert number == 5 and not ended
    finally:
        server.httpd.server_close()


def test_transcribe_serves_its_captions_and_a_busy_port_is_one_line(
    capsys, tmp_path, tone, tiny_bundle_dir
):
    path = tmp_path / "talk.wav"
    sf.write(path, np.concatenate([tone, tone]), 16000)
    args = ["transcribe", str(path), "--model", str(tiny_bundle_dir), "--format", "jsonl"]
    assert main([*args, "--serve", "127.0.0.1:0"]) == 0
    out = capsys.readouterr()
    assert out.err.startswith("captions at http://127.0.0.1:") and out.out
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main([*args, "--serve", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"streamasr: error: --serve 127.0.0.1:{port}: ")
        and len(err.splitlines()) == 1
    )


@pytest.mark.parametrize("value", ["http", "1:2:x", "70000"])
def test_a_bad_serve_address_is_a_usage_error(capsys, value):
    with pytest.raises(SystemExit) as exit_:
        main(["transcribe", "x.wav", "--serve", value])
    assert exit_.value.code == 2
    assert "expected [HOST:]PORT" in capsys.readouterr().err
