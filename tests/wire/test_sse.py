"""wire.sse: complete `data:` payloads out of bytes cut anywhere, LF or CRLF, multi-line
data, comments and other fields skipped, [DONE] noticed."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wire.sse import DONE, SseSplitter

pytestmark = pytest.mark.unit

STREAM = (b': keep-alive comment\n'
          b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n'
          b'event: message\nid: 7\nretry: 100\ndata: {"a":\ndata:1}\n\n'
          b'data:no-space\n\n'
          b'data\n\n'
          b'id: 8\n\n'
          b'database: not data\n\n'
          b'data: [DONE]\n\n')
PAYLOADS = [b'{"choices":[{"delta":{"content":"Hi"}}]}', b'{"a":\n1}', b"no-space", b"", DONE]


def _split(pieces: list[bytes]) -> tuple[list[bytes], SseSplitter]:
    splitter, out = SseSplitter(), []
    for piece in pieces:
        out.extend(splitter.feed(piece))
    return out, splitter


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
def test_a_stream_cut_at_every_byte_offset_gives_the_same_payloads(newline: bytes) -> None:
    wire = STREAM.replace(b"\n", newline)
    for cut in range(len(wire) + 1):
        out, splitter = _split([wire[:cut], wire[cut:]])
        assert out == PAYLOADS, cut
        assert splitter.done
    assert _split([wire[i:i + 1] for i in range(len(wire))])[0] == PAYLOADS


def test_an_event_is_complete_only_at_its_blank_line() -> None:
    splitter = SseSplitter()
    assert splitter.feed(b"data: one\ndata: two\n") == []
    assert splitter.feed(b"\r\n") == [b"one\ntwo"]
    assert not splitter.done and splitter.feed(b"data: [DONE]") == [] and not splitter.done
    assert splitter.feed(b"\n\n") == [DONE] and splitter.done


def test_only_one_space_after_the_colon_is_dropped() -> None:
    assert _split([b"data:  two spaces \n\n"])[0] == [b" two spaces "]


def test_an_event_past_the_limit_is_refused() -> None:
    splitter = SseSplitter(max_event_bytes=64)
    splitter.feed(b"data: " + b"x" * 40 + b"\n")
    with pytest.raises(ValueError, match="longer than 64 bytes"):
        splitter.feed(b"data: " + b"y" * 40)


@settings(max_examples=80, deadline=None)
@given(events=st.lists(st.lists(st.binary(max_size=12).filter(lambda b: b"\n" not in b and b"\r" not in b),
                                min_size=1, max_size=3), max_size=8),
       crlf=st.booleans(), cuts=st.lists(st.integers(0, 400), max_size=10))
def test_any_events_cut_anywhere_come_back_whole(events: list[list[bytes]], crlf: bool, cuts: list[int]) -> None:
    nl = b"\r\n" if crlf else b"\n"
    wire = b"".join(b"".join(b"data: " + line + nl for line in lines) + nl for lines in events)
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    out, _ = _split([wire[a:b] for a, b in itertools.pairwise(points)])
    assert out == [b"\n".join(lines) for lines in events]
