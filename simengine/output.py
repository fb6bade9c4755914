"""One sequence's output, token by token, ended as vLLM ends it.

The simulated model writes words (`wire.text.TokenText`: the same seed, the same words),
or, under guided decoding, a fixed text (JSON, a tool call) in 4-byte pieces; then the end-of-
sequence token. A plain answer ends after `ANSWER_TOKENS` words (drawn from the seed): long
enough that a request asking for fewer never sees it; `ignore_eos` goes on to `max_tokens`.

Ending, as vLLM's scheduler (`check_stop`, vllm/v1/core/sched/utils.py) and detokenizer
(`BaseIncrementalDetokenizer.update`, `check_stop_strings`, vllm/v1/engine/detokenizer.py) do:
- EOS (unless `ignore_eos`) or a token of `stop_token_ids`: finish_reason "stop" (stop_reason:
  the token id; None for EOS); the token counts, its text is left out unless
  `include_stop_str_in_output`;
- `max_tokens` tokens: "length";
- a `stop` string in the text (searched where the new token's text can complete one): "stop",
  stop_reason the string; the text ends before it (after it with `include_stop_str_in_output`);
- `min_tokens`: before it, EOS and stop token ids are never sampled (vLLM masks their logits)
  and stop strings are not looked for.
While `stop` strings are set (and not included), a stream holds back the last
`max(len(stop)) - 1` characters until the sequence ends, as vLLM's `stop_buffer_length`.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass

from simengine import tokens
from simengine.protocol import Sampling
from wire.text import VOCAB, TokenText

ANSWER_TOKENS = (256, 1024)
"""The length of a plain answer, before its EOS: uniform in this range, from the seed."""


@dataclass(frozen=True, slots=True)
class Token:
    token_id: int
    piece: str
    """The token's text as the tokenizer names it (logprobs' `token`)."""
    delta: str
    """Text released to the client with this token (may be empty)."""
    start: int
    """Where `delta` starts in the sequence's text."""
    finish: str | None
    stop_reason: str | int | None
    logprob: float
    top: tuple[tuple[str, float], ...]
    """Alternatives, best first, the sampled token first (vLLM's logprobs dict order)."""


def check_stop_strings(text: str, new_chars: int, stop: tuple[str, ...], include: bool) -> tuple[str, int] | None:
    """vLLM's `check_stop_strings`: (the stop string, where to cut the text; -1: nowhere) for the
    stop string that completes earliest in the new text, or None."""
    best, best_index, best_end = None, 0, sys.maxsize
    for s in stop:
        index = text.find(s, max(0, len(text) + 1 - new_chars - len(s)))
        if index != -1 and index + len(s) < best_end:
            best, best_index, best_end = s, index, index + len(s)
    if best is None:
        return None
    if include:
        return best, (-1 if best_end >= len(text) else best_end)
    return best, best_index


class Output:
    """The tokens of one sequence (one choice)."""

    def __init__(self, seed: int, sampling: Sampling, max_tokens: int, raw: str | None = None) -> None:
        self.s, self.max_tokens = sampling, max_tokens
        self.words = TokenText(seed)
        self.pieces = tokens.pieces(raw) if raw is not None else None
        self.answer = random.Random(seed ^ 0x656F73).randint(*ANSWER_TOKENS)
        self._lp = random.Random(seed ^ 0x6C6F67)
        self.token_ids: list[int] = []
        self.text = ""
        self.sent = 0
        self.finish: str | None = None
        self.stop_reason: str | int | None = None
        self.hold = max(map(len, sampling.stop)) - 1 if sampling.stop and not sampling.include_stop_str_in_output \
            else 0
        self._stop_ids = frozenset(sampling.stop_token_ids)

    def _draw(self, k: int) -> tuple[int, str]:
        """The k-th sampled token (0-based) and its text."""
        masked = k < self.s.min_tokens
        if self.pieces is not None:
            if k < len(self.pieces):
                return self.pieces[k]
            return tokens.EOS_ID, ""
        if k >= self.answer and not self.s.ignore_eos and not masked:
            return tokens.EOS_ID, ""
        for _ in range(64):
            word = self.words.next()
            token_id = tokens.WORD_IDS[word]
            if not (masked and token_id in self._stop_ids):
                return token_id, word
        return token_id, word  # every word is a stop token: the mask cannot help

    def _alternatives(self, token_id: int) -> tuple[float, tuple[tuple[str, float], ...]]:
        k = self.s.logprobs
        lp = -round(self._lp.uniform(0.01, 2.5), 4)
        if k is None:
            return lp, ()
        sampled = tokens.token_str(token_id)
        top = [(sampled, lp)]
        for j, word in enumerate(self._lp.sample(VOCAB, min(len(VOCAB), max(k, 1) + 1))):
            if len(top) >= max(k, 1):
                break
            if " " + word != sampled:
                top.append((" " + word, round(lp - 0.5 * (j + 1) - self._lp.random(), 4)))
        return lp, tuple(top)

    def next(self) -> Token:
        """The next token (the engine produced one for this sequence)."""
        k = len(self.token_ids)
        token_id, piece = self._draw(k)
        self.token_ids.append(token_id)
        count = k + 1
        stopped = token_id in self._stop_ids or (
            token_id == tokens.EOS_ID and not self.s.ignore_eos and count > self.s.min_tokens)
        if stopped:
            self.finish, self.stop_reason = "stop", (token_id if token_id != tokens.EOS_ID else None)
            if self.s.include_stop_str_in_output:
                self.text += piece
        else:
            self.text += piece
            if self.s.stop and count > self.s.min_tokens:
                hit = check_stop_strings(self.text, len(piece), self.s.stop, self.s.include_stop_str_in_output)
                if hit is not None:
                    self.finish, self.stop_reason = "stop", hit[0]
                    if hit[1] != -1:
                        self.text = self.text[:hit[1]]
        if self.finish is None and count >= self.max_tokens:
            self.finish = "length"
        start = self.sent
        end = len(self.text) if self.finish else max(self.sent, len(self.text) - self.hold)
        self.sent = end
        logprob, top = self._alternatives(token_id)
        return Token(token_id=token_id, piece=tokens.token_str(token_id), delta=self.text[start:end], start=start,
                     finish=self.finish, stop_reason=self.stop_reason, logprob=logprob, top=top)

