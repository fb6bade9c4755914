"""Server-sent events read from bytes as they arrive: the one SSE splitter of every client here
(the load-test drivers, the engine bench). The router's relay counts tokens on the hot path its
own way (router.flight); engines write SSE (simengine.responses, wire.openai).

As the WHATWG event-stream rules say, for what OpenAI-style streams use: lines end with LF or
CRLF (a lone CR is not a line end here: no engine sends one, and telling it from the first half
of a CRLF split across two reads would hold every event back a read); `data:` lines of one event
are joined with LF, one space after the colon is dropped; a blank line ends the event; comments
(`:` lines) and the other fields (`event:`, `id:`, `retry:`) are skipped; an event without data
is not one. `data: [DONE]` (OpenAI's end of stream) is a payload like any other, and sets `done`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import orjson

DONE = b"[DONE]"
MAX_EVENT_BYTES = 8 << 20
"""An unfinished line or event past this many bytes is not an SSE stream we follow."""


class SseSplitter:
    """Feed it a stream's bytes in pieces of any size; get each event's data payload once the
    event is complete."""

    __slots__ = ("_data", "_pending", "_size", "done", "max_event_bytes")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._pending = b""  # the unfinished line
        self._data: list[bytes] = []  # the data lines of the unfinished event
        self._size = 0
        self.done = False
        """`data: [DONE]` was seen."""
        self.max_event_bytes = max_event_bytes

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads of the events `data` completes, in order (ValueError: an event too big)."""
        buf = self._pending + data if self._pending else data
        out: list[bytes] = []
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            line = buf[start:end - 1] if end > start and buf[end - 1] == 13 else buf[start:end]
            start = end + 1
            if not line:
                if self._data:
                    payload = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
                    self._data, self._size = [], 0
                    self.done = self.done or payload == DONE
                    out.append(payload)
            elif line.startswith(b"data"):
                self._line(line)
        self._pending = buf[start:]
        if len(self._pending) + self._size > self.max_event_bytes:
            raise ValueError(f"an SSE event longer than {self.max_event_bytes} bytes")
        return out

    def _line(self, line: bytes) -> None:
        if len(line) == 4:  # `data` alone: an empty data line
            value = b""
        elif line[4] == 58:  # `data:`
            value = line[6:] if len(line) > 5 and line[5] == 32 else line[5:]
        else:  # `database: ...` is another field
            return
        self._data.append(value)
        self._size += len(value) + 1


class JsonEvent(NamedTuple):
    """One event of an OpenAI-style stream: `[DONE]`, a JSON object, or a payload that is not one."""

    done: bool = False
    event: dict[str, Any] | None = None
    """The event's JSON object (None for [DONE], an unparseable payload, or JSON that is no object)."""
    bad: bytes = b""
    """The payload that does not parse as JSON (b"": it parsed)."""


def json_events(splitter: SseSplitter, data: bytes) -> Iterator[JsonEvent]:
    """The events `data` completes, parsed."""
    for payload in splitter.feed(data):
        if payload == DONE:
            yield JsonEvent(done=True)
            continue
        try:
            parsed = orjson.loads(payload)
        except orjson.JSONDecodeError:
            yield JsonEvent(bad=payload)
            continue
        yield JsonEvent(event=parsed if isinstance(parsed, dict) else None)


def output_text(event: dict[str, Any]) -> str | None:
    """The text a chat (`choices[0].delta.content`) or completions (`choices[0].text`) chunk
    carries, if any."""
    choices = event.get("choices")
    if not choices or not isinstance(choices[0], dict):
        return None
    delta = choices[0].get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choices[0].get("text")
    return text if isinstance(text, str) else None
