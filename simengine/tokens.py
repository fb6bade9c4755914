"""The simulated model's tokenizer: token ids for what it reads and what it writes, so
`/tokenize`, `/detokenize`, `stop_token_ids` and logprobs agree with the token counts the engine
charges.

- ids 0 .. len(VOCAB)-1: the words the model generates (`wire.text.VOCAB`, in order),
  each with its leading space, one token each;
- `EOS_ID`: end of sequence (`</s>`, a special token: no text); `MEDIA_ID`: one image, audio or
  video placeholder token of a chat prompt;
- `PIECE_BASE` + n: a piece of up to 4 bytes of UTF-8 text, n its bytes big-endian (the last piece
  of a text padded with NULs, which decoding drops). A text reads as its 4-byte pieces, so its
  token count is `count_tokens` (one token per 4 bytes, at least one) exactly; output that is not
  words (JSON, tool calls) is written in such pieces too. Pieces of ASCII text have ids below
  2**31, so they can be sent back as a prompt of token ids.
"""

from __future__ import annotations

from wire.text import BYTES_PER_TOKEN, PIECE_BASE, VOCAB, piece_ids

WORD_IDS = {" " + w: k for k, w in enumerate(VOCAB)}
EOS_ID = len(VOCAB)
MEDIA_ID = EOS_ID + 1
assert PIECE_BASE == EOS_ID + 2
VOCAB_SIZE = PIECE_BASE + 2 ** (8 * BYTES_PER_TOKEN)
EOS_TEXT = "</s>"
MEDIA_TEXT = "<|media|>"


def piece_id(piece: bytes) -> int:
    return PIECE_BASE + int.from_bytes(piece.ljust(BYTES_PER_TOKEN, b"\0"), "big")


def encode(text: str) -> list[int]:
    """A text as the model reads it: its 4-byte pieces (one for an empty text; `wire.text.piece_ids`)."""
    return piece_ids(text)


def pieces(text: str) -> list[tuple[int, str]]:
    """Output text the model writes in pieces (ASCII, as JSON is written): (id, text) each."""
    return [(piece_id(text[k:k + BYTES_PER_TOKEN].encode()), text[k:k + BYTES_PER_TOKEN])
            for k in range(0, len(text), BYTES_PER_TOKEN)]


def _bytes(token_id: int) -> bytes:
    if token_id < EOS_ID:
        return (" " + VOCAB[token_id]).encode()
    if token_id >= PIECE_BASE:
        return (token_id - PIECE_BASE).to_bytes(BYTES_PER_TOKEN, "big").rstrip(b"\0")
    return b""


def out_of_vocab(ids: list[int]) -> list[int]:
    return [t for t in ids if not 0 <= t < VOCAB_SIZE]


def decode(ids: list[int], skip_special_tokens: bool = True) -> str:
    """The text of token ids (special tokens left out, or written as `</s>` / `<|media|>`)."""
    if skip_special_tokens:
        return b"".join(_bytes(t) for t in ids).decode("utf-8", errors="replace")
    return "".join(token_str(t) if t in (EOS_ID, MEDIA_ID) else _bytes(t).decode("utf-8", errors="replace")
                   for t in ids)


def token_str(token_id: int) -> str:
    """One token as the tokenizer names it (vLLM's `convert_ids_to_tokens`)."""
    if token_id == EOS_ID:
        return EOS_TEXT
    if token_id == MEDIA_ID:
        return MEDIA_TEXT
    return _bytes(token_id).decode("utf-8", errors="replace")
