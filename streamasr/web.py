"""Live captions in a browser: the session's events as Server-Sent Events, and a page that shows them.

`CaptionServer` (stdlib `http.server`, one thread per browser) serves `/` (the page) and `/events`
(`text/event-stream`, one `data:` line per event, in the `--format jsonl` shape). The server keeps
the recent events in a window; a browser starts at the window's oldest, so a page opened mid-stream
shows the recent segments at once. The session thread only appends to the window: a browser that
falls out of it is disconnected (its page reconnects and starts again), never waited for.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .session import Event

log = logging.getLogger(__name__)

END = "end"  # the SSE event name sent when the stream is over
KEEPALIVE_S = 15  # a comment line this often keeps proxies from closing a quiet stream

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>streamasr live captions</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body { background: #111; color: #eee; font: 28px/1.35 system-ui, sans-serif; margin: 1em 2em; }
 .seg { margin: 0 0 .6em; }
 .de { color: #fc6; }
 .open { opacity: .6; }
 .partial { font-style: italic; opacity: .6; }
 #status { position: fixed; bottom: .4em; right: 1em; font-size: 14px; color: #888; }
</style></head>
<body><div id="captions"></div><div id="status">connecting</div>
<script>
const captions = document.getElementById("captions"), status = document.getElementById("status");
const segments = new Map();  // "stream/segment" -> {transcript, translation} elements
function line(key, type) {
  if (!segments.has(key)) {
    const div = document.createElement("div"); div.className = "seg";
    const en = document.createElement("div"), de = document.createElement("div");
    const words = document.createElement("span"), partial = document.createElement("span");
    partial.className = "partial"; en.append(words, partial);
    en.className = "en open"; de.className = "de open"; div.append(en, de); captions.append(div);
    segments.set(key, {transcript: words, partial, translation: de, en, div});
    while (segments.size > 50) { const [k, s] = segments.entries().next().value; s.div.remove(); segments.delete(k); }
  }
  return segments.get(key)[type];
}
const source = new EventSource("events");
source.onopen = () => { captions.textContent = ""; segments.clear(); status.textContent = "live"; };
source.onmessage = (message) => {
  const e = JSON.parse(message.data), key = e.stream + "/" + e.segment, el = line(key, e.type);
  if (e.type === "partial") {  // the tentative words after the committed ones, replaced each time
    el.textContent = e.text && (segments.get(key).transcript.textContent ? " " : "") + e.text;
    return;
  }
  if (e.text) el.textContent = (el.textContent ? el.textContent + " " : "") + e.text;
  if (e.type === "transcript") segments.get(key).partial.textContent = "";
  if (e.final) (e.type === "transcript" ? segments.get(key).en : el).classList.remove("open");
  status.textContent = "live, " + (e.delay_ms / 1000).toFixed(1) + " s of audio";
  window.scrollTo(0, document.body.scrollHeight);
};
source.addEventListener("end", () => { status.textContent = "the stream has ended"; source.close(); });
source.onerror = () => { status.textContent = "reconnecting"; };
</script></body></html>
"""


class CaptionServer:
    """Serves the caption page and the event stream on `host:port` (port 0: any free port)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8000, recent_events: int = 500):
        self.window: deque[tuple[int, str]] = deque(maxlen=recent_events)  # (number, JSON)
        self.published = 0  # events published so far: the next one's number
        self.ended = False
        self.changed = threading.Condition()
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="captions", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def __enter__(self) -> CaptionServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.end()
        self.httpd.shutdown()
        self.httpd.server_close()

    def publish(self, events: list[Event]) -> None:
        """Append events to the window and wake the browsers; never waits for one."""
        if not events:
            return
        with self.changed:
            for event in events:
                self.window.append(
                    (self.published, json.dumps(event.to_json(), ensure_ascii=False))
                )
                self.published += 1
            self.changed.notify_all()

    def end(self) -> None:
        """The stream is over: every browser is told so once it has read the window."""
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def read_from(self, number: int | None, timeout_s: float) -> tuple[list[str] | None, int, bool]:
        """The events from `number` on (None: the window's oldest), waiting up to `timeout_s` for
        one; returns them (None when `number` has left the window), the next number, and whether
        the stream has ended."""
        with self.changed:
            self.changed.wait_for(
                lambda: self.ended or number is None or self.published > number, timeout_s
            )
            oldest = self.window[0][0] if self.window else self.published
            number = oldest if number is None else number
            if number < oldest:
                return None, number, self.ended
            return [data for n, data in self.window if n >= number], self.published, self.ended

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                if self.path in ("/", "/index.html"):
                    body = PAGE.encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif self.path == "/events":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.end_headers()
                    try:
                        self._stream()
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # the page was closed
                else:
                    self.send_error(404)

            def _stream(self) -> None:
                number = None
                while True:
                    batch, number, ended = server.read_from(number, KEEPALIVE_S)
                    if batch is None:  # fell out of the window: close; the page starts again
                        log.warning("a caption page fell behind the recent events; disconnected")
                        return
                    lines = [f"data: {data}\n\n" for data in batch] or [": still here\n\n"]
                    if ended:
                        lines.append(f"event: {END}\ndata: {{}}\n\n")
                    self.wfile.write("".join(lines).encode())
                    self.wfile.flush()
                    if ended:
                        return

            def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's name
                log.debug("%s " + format, self.address_string(), *args)

        return Handler
