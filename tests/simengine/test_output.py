"""The simulated model's output, pure: how a sequence ends (vLLM's check_stop and detokenizer),
what guided decoding writes (valid for its schema), and the tokenizer's ids and counts."""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simengine import guided, tokens
from simengine.output import Output, check_stop_strings
from simengine.protocol import Sampling
from wire.text import VOCAB, TokenText, count_tokens

pytestmark = pytest.mark.unit


def run(out: Output) -> list[str]:
    got = []
    while out.finish is None:
        got.append(out.next().delta)
    return got


@pytest.mark.parametrize(("text", "new", "stop", "include", "want"), [
    ("a b stop c", 2, ("stop",), False, None),  # the new chars " c" cannot complete "stop"
    ("a b stop", 4, ("stop",), False, ("stop", 4)),  # cut before it
    ("a b stop", 4, ("stop",), True, ("stop", -1)),  # kept, nothing after it
    ("a bx yz", 3, ("x y", "yz"), False, ("x y", 3)),  # the one that completes first
    ("a b sto", 3, ("stop",), False, None),
])
def test_check_stop_strings_as_vllm(text: str, new: int, stop: tuple[str, ...], include: bool,
                                    want: tuple[str, int] | None) -> None:
    """v1/engine/detokenizer.py check_stop_strings: searched only where the new text can complete
    a stop string; the earliest completion wins; (string, cut) or None."""
    assert check_stop_strings(text, new, stop, include) == want


def test_words_are_the_seeded_words_until_max_tokens() -> None:
    out = Output(7, Sampling(), 20)
    text = TokenText(7)
    assert run(out) == [text.next() for _ in range(20)] and out.finish == "length"
    assert out.token_ids == [tokens.WORD_IDS[" " + w] for w in out.text.split()]


def test_eos_ends_an_answer_unless_ignore_eos_and_never_before_min_tokens() -> None:
    """check_stop: EOS is "stop" and counts as a token (no text); ignore_eos goes on to max_tokens;
    min_tokens masks EOS until then (MinTokensLogitsProcessor)."""
    out = Output(3, Sampling(), 5000)
    run(out)
    assert out.finish == "stop" and out.stop_reason is None and out.token_ids[-1] == tokens.EOS_ID
    assert out.answer + 1 == len(out.token_ids) and len(out.text.split()) == out.answer
    longer = Output(3, Sampling(ignore_eos=True), out.answer + 10)
    run(longer)
    assert longer.finish == "length" and tokens.EOS_ID not in longer.token_ids
    held = Output(3, Sampling(min_tokens=out.answer + 5), 5000)
    run(held)
    assert held.finish == "stop" and len(held.token_ids) == out.answer + 6


def test_stop_token_ids_and_min_tokens() -> None:
    text = TokenText(5)
    seq = [text.next() for _ in range(50)]
    target = tokens.WORD_IDS[seq[3]]
    out = Output(5, Sampling(stop_token_ids=(target,)), 50)
    run(out)
    first = seq.index(seq[3])
    assert out.finish == "stop" and out.stop_reason == target and out.text == "".join(seq[:first])
    kept = Output(5, Sampling(stop_token_ids=(target,), include_stop_str_in_output=True), 50)
    run(kept)
    assert kept.text == "".join(seq[:first + 1])
    masked = Output(5, Sampling(stop_token_ids=(target,), min_tokens=first + 1), 50)
    run(masked)
    assert target not in masked.token_ids[:first + 1]


def test_a_stream_holds_back_what_could_start_a_stop_string() -> None:
    """stop_buffer_length = max(len(stop)) - 1 characters held until the sequence ends."""
    out = Output(9, Sampling(stop=("zzzzzz",)), 12)
    deltas = run(out)
    words = TokenText(9)
    written = ""
    for k in range(len(deltas) - 1):
        written += words.next()
        assert len("".join(deltas[:k + 1])) == max(0, len(written) - 5)
    assert "".join(deltas) == out.text and out.finish == "length"


SCHEMAS: Any = st.recursive(
    st.sampled_from([{"type": "string"}, {"type": "integer", "minimum": -5, "maximum": 5}, {"type": "number"},
                     {"type": "boolean"}, {"type": "null"}, {"enum": ["a", 1, None]}, {"const": "c"},
                     {"type": "string", "minLength": 3, "maxLength": 8}]),
    lambda inner: st.one_of(
        st.builds(lambda items, lo: {"type": "array", "items": items, "minItems": lo, "maxItems": lo + 2},
                  inner, st.integers(0, 2)),
        st.builds(lambda props, req: {"type": "object", "properties": props,
                                      "required": [k for k in props if req], "additionalProperties": False},
                  st.dictionaries(st.sampled_from(VOCAB[:20]), inner, max_size=4), st.booleans()),
        st.builds(lambda a, b: {"anyOf": [a, b]}, inner, inner)),
    max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(schema=SCHEMAS, seed=st.integers(0, 2**32))
def test_guided_json_satisfies_its_schema(schema: dict[str, Any], seed: int) -> None:
    text = guided.json_text(schema, seed)
    jsonschema.validate(json.loads(text), schema)
    assert text.isascii() and guided.json_text(schema, seed) == text  # the same seed, the same JSON


def test_refs_and_json_object() -> None:
    schema = {"$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
              "type": "array", "items": {"$ref": "#/$defs/p"}, "minItems": 2}
    jsonschema.validate(json.loads(guided.json_text(schema, 1)), schema)
    assert isinstance(json.loads(guided.json_text(None, 1)), dict)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=64))
def test_the_tokenizer_counts_as_the_engine_charges_and_round_trips(text: str) -> None:
    ids = tokens.encode(text)
    assert len(ids) == count_tokens(text) and all(0 <= t < tokens.VOCAB_SIZE for t in ids)
    if "\0" not in text:
        assert tokens.decode(ids) == text
    if text.isascii():
        assert all(t < 2**31 for t in ids)  # sendable back as a prompt of token ids


def test_word_ids_are_vocab_indexes() -> None:
    assert tokens.decode([VOCAB.index("island"), tokens.EOS_ID]) == " island"
    assert tokens.token_str(tokens.EOS_ID) == "</s>" and tokens.out_of_vocab([-1, 0, tokens.VOCAB_SIZE]) == [
        -1, tokens.VOCAB_SIZE]
