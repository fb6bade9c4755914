"""A prompt's KV block keys as a real vLLM replica computes its blocks: from that replica's own
tokens. The router has no tokenizer, so it asks the replica's: vLLM's `POST /tokenize` takes a
completion's prompt (`TokenizeCompletionRequest`) or a chat's messages with the fields that
render them (`TokenizeChatRequest`), and answers `{"count", "max_model_len", "tokens"}`.

- `tokenize_request(body, path, model)`: what to ask for a generation request, built from the
  fields vLLM's chat completion renders a prompt with (`ChatCompletionRequest.build_chat_params`:
  its `documents` and `reasoning_effort` go into the template's kwargs, as vLLM puts them there),
  of the base model (an adapter's request asks its base's tokenizer: the replica asked may not
  hold the adapter yet); a completion's token ids need no round trip; a Responses request, or a
  prompt with media parts (vLLM would fetch them to tokenize), is not asked (`UNSUPPORTED`).
- `RemoteKeys`: keys per prompt and adapter in a bounded LRU (keyed by the tokenize request),
  one round trip per prompt at a time (concurrent requests for one prompt share it), prompts
  spread over the model's replicas, each bounded by a short timeout; a failure answers None (the
  request is routed without cache knowledge) and, unless the engine refused the request itself
  (4xx), leaves that replica's tokenizer alone for a few seconds. Every outcome is counted
  (`isle_router_kv_tokenize_requests`).

A vLLM engine never reads a prompt's last token from its cache (it must compute one to sample:
`KVCacheManager.get_computed_blocks` looks up at most `num_tokens - 1`), so the keys kept are the
full blocks before that token: what the engine can hit (`usable_keys`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from kvblocks.keys import block_keys
from router.upstream import Pool, UpstreamError

log = logging.getLogger("isleserve.router")
MAX_LOOKUP_TOKENS = 32_768
"""The prompt tokens the router keys per request (about 2 ms of hashing here): past them, a
replica's share of the prompt is taken as it stands."""
DOWN_S = 5.0
"""How long a replica's tokenizer is left alone after it failed (others of the model are asked)."""
UNSUPPORTED = "unsupported"
CHAT_FIELDS = ("add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template",
               "tools", "media_io_kwargs", "mm_processor_kwargs")
"""A chat request's fields that vLLM's /tokenize renders the same way (`TokenizeChatRequest`)."""
TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal"})


@dataclass(frozen=True, slots=True)
class Keyed:
    """A prompt as its engine will look it up in its prefix cache."""

    prompt_tokens: int
    """Its tokens as the engine counts them (what `vllm:prefix_cache_queries` adds)."""
    keys: Sequence[int]
    """The keys of its full blocks the engine may read from its cache (`usable_keys`)."""


def usable_keys(tokens: Sequence[int], prompt_tokens: int, block_size: int, lora: str = "") -> list[int]:
    """The keys of `tokens`' full blocks (at most its first `MAX_LOOKUP_TOKENS`) that lie before the
    prompt's last token: the most an engine's prefix cache can give it (`lora`: the adapter that
    reads them; its name enters the keys, as vLLM's block hashes take the LoRA)."""
    keys = block_keys(tokens[:MAX_LOOKUP_TOKENS], block_size, lora or None)
    return keys[:max(0, (prompt_tokens - 1) // block_size)]


def _text_only(messages: Any) -> bool:
    if not isinstance(messages, list):
        return False
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(not isinstance(p, dict) or p.get("type") not in TEXT_PARTS
                                             for p in content):
            return False
    return True


def _chat_request(body: Mapping[str, Any], model: str) -> dict[str, Any] | str:
    messages = body.get("messages")
    if not _text_only(messages):
        return UNSUPPORTED
    ask: dict[str, Any] = {"model": model, "messages": messages}
    ask.update((k, body[k]) for k in CHAT_FIELDS if body.get(k) is not None)
    kwargs = dict(body.get("chat_template_kwargs") or {})
    if body.get("documents") is not None:
        kwargs["documents"] = body["documents"]
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort != "auto":
            kwargs["reasoning_effort"] = effort
        kwargs.setdefault("enable_thinking", effort != "none")
    if kwargs:
        ask["chat_template_kwargs"] = kwargs
    return ask


def tokenize_request(body: Mapping[str, Any], path: str, model: str) -> dict[str, Any] | list[int] | str:
    """For a generation request to `path`: the /tokenize body that gives its (first) prompt's
    tokens as vLLM will read them, or those tokens when the client sent ids, or `UNSUPPORTED`.
    `model`: the served model whose tokenizer is asked (an adapter's base: a replica may not have
    the adapter loaded yet)."""
    if path == "/v1/chat/completions":
        return _chat_request(body, model)
    if path != "/v1/completions":
        return UNSUPPORTED
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # the first of several prompts: the one the index looks up
    if isinstance(prompt, list):
        ids = [t for t in prompt if isinstance(t, int) and not isinstance(t, bool)]
        return ids if ids and len(ids) == len(prompt) else UNSUPPORTED
    if not isinstance(prompt, str):
        return UNSUPPORTED
    ask: dict[str, Any] = {"model": model, "prompt": prompt}
    if body.get("add_special_tokens") is not None:
        ask["add_special_tokens"] = body["add_special_tokens"]
    return ask


class RemoteKeys:
    """Block keys of prompts as vLLM replicas tokenize them (module docstring)."""

    def __init__(self, pool: Pool, block_size: int, *, timeout_s: float, entries: int,
                 clock: Callable[[], float]) -> None:
        self.pool, self.block_size, self.timeout_s, self.clock = pool, block_size, timeout_s, clock
        self.entries = entries
        self._lru: OrderedDict[bytes, Keyed] = OrderedDict()
        self._pending: dict[bytes, asyncio.Task[Keyed | None]] = {}
        self._down: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        """Outcome -> requests: cached, fetched, shared (waited for another's round trip), refused
        (a 4xx: the request's own fault), failed, unsupported, unreachable (no tokenizer to ask)."""

    def count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1

    def ids(self, ids: Sequence[int], lora: str = "") -> Keyed:
        """A prompt given as token ids: keyed here."""
        return Keyed(len(ids), usable_keys(ids, len(ids), self.block_size, lora))

    def known(self, ask: Mapping[str, Any], lora: str = "") -> tuple[bytes, bytes, Keyed | None]:
        """(the request's bytes, its LRU key, its keys when kept); `lora`: the adapter the keys are
        for (its name enters them)."""
        raw = orjson.dumps(ask)
        key = hashlib.blake2b(raw + b"\0" + lora.encode(), digest_size=16).digest()
        keyed = self._lru.get(key)
        if keyed is not None:
            self._lru.move_to_end(key)
            self.count("cached")
        return raw, key, keyed

    def pick(self, urls: Sequence[str], key: bytes) -> str | None:
        """One of `urls` whose tokenizer has not failed lately: the prompt's LRU `key` spreads the
        prompts over them (each prompt asks one replica)."""
        now = self.clock()
        start = key[0] % len(urls) if urls else 0
        return next((u for u in (*urls[start:], *urls[:start]) if self._down.get(u, 0.0) <= now), None)

    async def fetch(self, url: str, raw: bytes, key: bytes, lora: str = "") -> Keyed | None:
        """The prompt's keys from `url`'s /tokenize (None: failed; counted either way)."""
        task = self._pending.get(key)
        if task is not None:
            self.count("shared")
        else:
            task = self._pending[key] = asyncio.get_running_loop().create_task(self._fetch(url, raw, key, lora))
            task.add_done_callback(lambda _: self._pending.pop(key, None))
        try:
            return await asyncio.shield(task)
        except Exception:  # a bug here must not fail the request: it is routed without the index
            log.exception("keying a prompt from %s/tokenize failed", url)
            self.count("failed")
            return None

    async def _fetch(self, url: str, raw: bytes, key: bytes, lora: str) -> Keyed | None:
        try:
            status, answer = await asyncio.wait_for(self.pool.post_json(url, "/tokenize", raw), self.timeout_s)
            if 400 <= status < 500:  # the engine refuses what the request asks: its generation will say why
                self.count("refused")
                return None
            tokens = answer["tokens"]
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise TypeError("no token ids")
        except (UpstreamError, TimeoutError, KeyError, TypeError) as err:
            log.debug("tokenize at %s failed (%s): routed without the prefix-cache index", url, err)
            self._down[url] = self.clock() + DOWN_S
            self.count("failed")
            return None
        self.count("fetched")
        keyed = Keyed(len(tokens), array("Q", usable_keys(tokens, len(tokens), self.block_size, lora)))
        if self.entries > 0:
            self._lru[key] = keyed
            while len(self._lru) > self.entries:
                self._lru.popitem(last=False)
        return keyed

    async def aclose(self) -> None:
        for task in list(self._pending.values()):
            task.cancel()
        await self.pool.aclose()
