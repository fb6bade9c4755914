"""The readers on generated input: any text, damaged real captures (../shared/data/topo) and
prefixes of every format either read or raise one ParseError of one line, never another
exception."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import captures, no_captures_reason
from topology.errors import ParseError
from topology.readers import read_text

pytestmark = pytest.mark.unit

SEEDS = [c.read_text() for c in captures()][:6]


def _reads_or_parse_error(text: str) -> None:
    try:
        read_text(text)
    except ParseError as err:
        assert "\n" not in str(err)


@settings(max_examples=300)
@given(st.text())
def test_reader_never_raises_anything_but_parse_error(text: str) -> None:
    _reads_or_parse_error(text)


@pytest.mark.skipif(not SEEDS, reason=no_captures_reason("*.txt"))
@settings(max_examples=300)
@given(st.sampled_from(SEEDS or [""]), st.data())
def test_damaged_real_captures_never_crash(seed: str, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(seed)))
    end = data.draw(st.integers(start, min(len(seed), start + 40)))
    insert = data.draw(st.text(alphabet="GPUNVX0123456789 \t\nSYSPIXBHODE-:,", max_size=20))
    _reads_or_parse_error(seed[:start] + insert + seed[end:])


@settings(max_examples=200)
@given(st.sampled_from(["<system>", "<system><cpu numaid='x'>", "{", "nodes:", "GPU0 GPU1\n"]),
       st.text(max_size=200))
def test_prefixes_of_every_format_never_crash(prefix: str, tail: str) -> None:
    _reads_or_parse_error(prefix + tail)
