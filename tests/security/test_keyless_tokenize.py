"""Callers without a key on the router's open token routes (`/tokenize`, `/detokenize`, open as
on vLLM): a flood of large keyless prompts gets only `tokenize_open_bytes_per_s` of the engines'
work (it waits, then is refused with 429), while keyed callers' token requests and the
interactive class are served as before."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from router.config import sha256
from tests.support.clients import openai_client
from tests.support.engines import running_engine, running_router

pytestmark = [pytest.mark.integration, pytest.mark.slow]
KEY = "sk-isle-test-keyless-4b1d8e2f"
RATE = 200_000.0  # bytes/s for every keyless caller together
BODY = {"model": "llama-3.1-8b", "prompt": "word " * 12_000}  # 60 KB


def test_keyless_token_requests_get_their_budget_and_no_more(tmp_path: Path) -> None:
    with running_engine("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--time-scale", "0.05") as engine:
        config = {"port": 0, "require_keys": True, "keys": [{"tenant": "u", "key_sha256": sha256(KEY)}],
                  "admin_keys": [{"tenant": "a", "key_sha256": sha256(KEY + "-admin")}],
                  "tokenize_open_bytes_per_s": RATE,
                  "replicas": [{"replica_id": "m1", "url": engine.base, "model": "llama-3.1-8b", "role": "mixed"}]}
        with running_router(config, tmp_path) as (_, url):
            base = url.removesuffix("/v1")
            stop, answered, codes = threading.Event(), [0], dict[int, int]()
            started = time.monotonic()

            def flood() -> None:
                with httpx.Client(timeout=30) as h:
                    while not stop.is_set():
                        r = h.post(f"{base}/tokenize", json=BODY)
                        codes[r.status_code] = codes.get(r.status_code, 0) + 1
                        if r.status_code == 200:
                            answered[0] += 1

            threads = [threading.Thread(target=flood) for _ in range(6)]
            for t in threads:
                t.start()
            try:
                with httpx.Client(timeout=30) as h:  # a caller with a key is not counted
                    keyed = [h.post(f"{base}/tokenize", json=BODY, headers={"authorization": f"Bearer {KEY}"})
                             for _ in range(5)]
                c = openai_client(url, KEY, timeout=30)
                chat = c.chat.completions.create(model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4, extra_headers={"x-slo-class": "interactive"})
                time.sleep(3)
            finally:
                stop.set()
                for t in threads:
                    t.join(40)
            elapsed = time.monotonic() - started
    assert all(r.status_code == 200 and r.json()["count"] > 0 for r in keyed)
    assert chat.usage is not None and chat.usage.completion_tokens == 4
    body_bytes = len(httpx.Request("POST", "http://x", json=BODY).content)
    # the bucket: 4 s of the rate at once, then the rate (requests in flight when it stopped included)
    assert answered[0] * body_bytes <= RATE * (elapsed + 4.0) + 6 * body_bytes, (answered[0], elapsed, codes)
    assert set(codes) <= {200, 429}
