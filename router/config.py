"""Router configuration (pydantic, `extra="forbid"`, every problem reported at once).

API keys are stored salted (`key_hmac_sha256`: `SALT:HMAC-SHA256(SALT, key)`, from `python -m
router hash-key`), read from an environment variable (`key_env`) or a file (`key_file`), or, as
before, as unsalted SHA-256 hashes (`key_sha256`); a key is never logged, and in memory only its
seal is kept (`router.keys`). Each key names a tenant and the SLO
classes it is entitled to (`"*"`: all). Admin keys open the admin routes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pools.config import SLOClassConfig
from pools.model import DEFAULT_SLO_CLASSES, SLOClass
from router.fairness import FairConfig
from router.keys import Stored, sha256_hex
from router.lora.config import LoraConfig
from router.plugins.kvpath import KvPathRules
from router.plugins.profile import DEFAULT_FILTERS, Profile
from router.plugins.spec import PluginSpec
from router.quota import Quota
from topology.configfile import load_yaml_file, validate_mapping
from wire.limits import (
    CLIENT_SHARE,
    CLIENT_WRITE_TIMEOUT_S,
    FD_RESERVE,
    HEAD_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MAX_BUFFERED_BYTES,
    MAX_CONNECTIONS,
    STALLED_HEAD_S,
    WRITE_BUFFER_BYTES,
    ServerLimits,
    client_share,
)

DEV_KEY, DEV_ADMIN_KEY = "isle-dev-key", "isle-dev-admin"


def sha256(text: str) -> str:
    return sha256_hex(text)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KeyConfig(_Strict):
    tenant: str = Field(min_length=1)
    key_hmac_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{32,128}:[0-9a-f]{64}$",
                                        description="SALT:HMAC-SHA256(SALT, key) in hex (`python -m router hash-key`)")
    key_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$",
                                   description="the key's unsalted SHA-256 (precomputable: prefer key_hmac_sha256)")
    key_env: str | None = None
    key_file: str | None = None
    slo_classes: list[str] = Field(default_factory=lambda: ["*"], description="entitled classes; * = all")
    max_concurrency: int | None = Field(default=None, ge=1, description="the tenant's requests in flight (None: "
                                        "fair.key_max_concurrency); past it 429")
    tokens_per_s: float | None = Field(default=None, gt=0, description="the tenant's token rate (None: "
                                       "fair.key_rate); past it 429 + Retry-After")
    burst_tokens: float | None = Field(default=None, gt=0, description="the tenant's token bucket (None: 10 s of "
                                       "tokens_per_s)")

    @model_validator(mode="after")
    def _one_source(self) -> KeyConfig:
        if sum(x is not None for x in (self.key_hmac_sha256, self.key_sha256, self.key_env, self.key_file)) != 1:
            raise ValueError("give exactly one of key_hmac_sha256, key_sha256, key_env, key_file")
        return self

    def stored(self) -> Stored:
        """The key as `router.keys` takes it (a key read from the environment or a file is hashed
        here and not kept)."""
        if self.key_hmac_sha256 is not None:
            salt, digest = self.key_hmac_sha256.split(":")
            return Stored(digest, bytes.fromhex(salt))
        if self.key_sha256 is not None:
            return Stored(self.key_sha256)
        if self.key_env is not None:
            value = os.environ.get(self.key_env)
            if not value:
                raise ValueError(f"tenant {self.tenant}: environment variable {self.key_env} is not set")
            return Stored(sha256(value.strip()))
        try:
            return Stored(sha256(Path(str(self.key_file)).read_text().strip()))
        except OSError as err:
            raise ValueError(f"tenant {self.tenant}: cannot read key file {self.key_file}: {err.strerror}") from None


class ReplicaConfig(_Strict):
    replica_id: str
    url: str = Field(pattern=r"^http://(127\.\d+\.\d+\.\d+|localhost|\[::1\]):\d+$",
                     description="loopback engine URL without /v1")
    model: str
    pool: str = "default"
    role: Literal["prefill", "decode", "mixed"] = "mixed"
    node: str = ""
    gpus: list[int] = Field(default_factory=list)
    island: str = Field(default="", description="the NVLink island of its GPUs (a Prometheus target label)")
    tier: str = "local"
    tp: int = 1
    gpu_model: str | None = None
    catalog_model: str | None = None
    expert_parallel: int = Field(default=1, ge=1, description="ranks the model's experts are split over when "
                                 "this replica is a rank of an expert-parallel gang (1: not)")
    slo_classes: list[str] = Field(default_factory=list, description="the classes its pool is declared for; "
                                   "empty: every class")
    max_num_seqs: int | None = Field(default=None, ge=1, description="the engine's max_num_seqs (None: "
                                     "fair.replica_max_num_seqs)")
    kv_events_replay: str = Field(default="", pattern=r"^(tcp://(127\.\d+\.\d+\.\d+|localhost):\d+)?$",
                                  description="the engine's KV-event replay endpoint (vLLM's replay_endpoint); it "
                                  "publishes to `kv_events.endpoint` with its replica_id as topic. Empty: none")
    engine: Literal["sim", "vllm"] = Field(default="sim", description="what serves it: the simulated engine (the "
                                           "router keys its prompts' KV blocks itself) or a real vLLM server (keyed "
                                           "from its tokenizer: POST /tokenize, `kv_events.tokenize_*`)")


class KvEventsConfig(_Strict):
    endpoint: str = Field(pattern=r"^tcp://(127\.\d+\.\d+\.\d+|localhost):\d+$",
                          description="where the router binds its subscriber; each engine's --kv-events-config "
                          "`endpoint` names it (vLLM's publisher connects to it). IPv4 loopback only: vLLM binds "
                          "an endpoint with `::` instead of connecting, and every engine on another host would "
                          "connect to its own loopback")
    block_size: int = Field(default=16, ge=1, description="the engines' KV block size (vLLM's --block-size)")
    tokenize_timeout_s: float = Field(default=0.5, gt=0, description="the longest a request waits for a vLLM "
                                      "replica's /tokenize to key its prompt (past it: routed without the index)")
    tokenize_cache: int = Field(default=4096, ge=0, description="prompts whose vLLM block keys the router keeps "
                                "(least recently used out first; 0: none kept)")


class ProfileConfig(_Strict):
    """A routing profile by plugin names (docs/router.md: Routing); every plugin and parameter is checked
    at load. A plugin with parameters is `{name, weight, parameters}` (llm-d's form)."""

    filters: list[str | PluginSpec] = Field(
        default_factory=lambda: list[str | PluginSpec](DEFAULT_FILTERS),
        description="filter names, or {name, parameters}")
    scorers: dict[str, float | PluginSpec] = Field(
        default_factory=lambda: dict[str, float | PluginSpec]({"queue-depth-scorer": 1.0, "kv-usage-scorer": 1.0}),
        description="{name: weight}, {name: {weight, parameters}} or a list [{name, weight, parameters}]")
    picker: str | PluginSpec = Field(default="max-score-picker", description="a picker name, or {name, parameters}")

    @field_validator("scorers", mode="before")
    @classmethod
    def _scorer_forms(cls, raw: object) -> object:
        """The list form and `{name: {weight, parameters}}` as `{name: {name, weight, parameters}}`."""
        if isinstance(raw, list):
            names = [e.get("name") if isinstance(e, dict) else None for e in raw]
            if None in names:
                raise ValueError("each scorer of the list form is a mapping with a name")
            twice = sorted({str(n) for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"scorers listed twice: {twice}")
            return {str(n): e for n, e in zip(names, raw, strict=True)}
        if isinstance(raw, dict):
            out: dict[object, object] = {}
            for name, value in raw.items():
                if isinstance(value, dict) and value.get("name", name) != name:
                    raise ValueError(f"scorer {name!r} names another plugin ({value['name']!r})")
                out[name] = {**value, "name": name} if isinstance(value, dict) else value
            return out
        return raw

    @model_validator(mode="after")
    def _plugins(self) -> ProfileConfig:
        self.to_profile(where="")
        return self

    def to_profile(self, where: str = "profile") -> Profile:
        """The routing profile this config names (ValueError naming each bad plugin's path)."""
        return Profile(filters=self.filters, scorers=self.scorers, picker=self.picker, where=where)


class KvPathConfig(_Strict):
    """Each PD pair's KV transfers measured against its path (router.plugins.kvpath)."""

    slow_fraction: float = Field(default=0.5, gt=0, le=1, description="below this fraction of the path's "
                                 "expected bandwidth a pair is not as planned (slow, or wrong_path on a slower kind's "
                                 "signature)")
    signature_tolerance: float = Field(default=2.0, gt=1, description="within this factor of a slower link kind's "
                                       "bandwidth the pair is wrong_path (e.g. TCP speed on an NVLink pair)")
    window_s: float = Field(default=10.0, ge=0, description="a verdict changes once the measurements held it this "
                            "long (failing: at once)")
    noise_ms: float = Field(default=5.0, ge=0, description="a handover within this much of its expected transfer "
                            "is as planned")
    penalty: float = Field(default=4.0, ge=1, description="a wrong_path/failing pair's predicted KV transfer is "
                           "multiplied by this")
    avoid_after_s: float = Field(default=20.0, ge=0, description="wrong_path/failing this long: the pair is avoided")
    cooldown_s: float = Field(default=30.0, gt=0, description="an avoided pair is re-checked after this long (one "
                              "request probes it)")
    max_pairs: int = Field(default=64, ge=1, le=4096, description="pairs followed and labelled in metrics")

    def rules(self) -> KvPathRules:
        return KvPathRules(slow_fraction=self.slow_fraction, signature_tolerance=self.signature_tolerance,
                           window_s=self.window_s, noise_ms=self.noise_ms, penalty=self.penalty,
                           avoid_after_s=self.avoid_after_s, cooldown_s=self.cooldown_s)


class PDConfig(_Strict):
    enabled: bool = True
    min_prompt_tokens: int = Field(default=256, ge=0, description="shorter prompts go to one mixed replica")
    kv_path: KvPathConfig = Field(default_factory=KvPathConfig, description="measure each pair's KV transfers "
                                  "and avoid pairs whose data takes the wrong road")


class UpstreamConfig(_Strict):
    connect_timeout_s: float = Field(default=2.0, gt=0)
    first_byte_timeout_s: float = Field(
        default=60.0, gt=0, description="streams: from the request to its first token (the engine's queue included)")
    request_timeout_s: float = Field(default=600.0, gt=0, description="non-stream requests: until the response")
    idle_timeout_s: float = Field(default=60.0, gt=0, description="longest gap between chunks")
    retries: int = Field(default=2, ge=0, description="other replicas tried before the first byte")
    breaker_failures: int = Field(default=3, ge=1)
    breaker_open_s: float = Field(default=5.0, gt=0)
    table_wait_s: float = Field(
        default=5.0, ge=0, description="a request no replica in the router's view can take now (its PD pair "
        "refused it before the first byte, every replica it was sent to refused the connection, or none is usable) "
        "waits this long for the controller's next routing "
        "table and is routed again on it: the one a scale-in, restart or move published, which the router follows "
        "every second; 503 or the upstream's error after it. Only under a controller (a static table never "
        "changes); 0: answer at once")
    key_env: str | None = Field(default=None, description="the environment variable holding the key the engines "
                                "want (vLLM's --api-key), sent with every request to them; under `isle run` and "
                                "`serve deploy` the controller's own key is used whatever this says")

    def engine_key(self) -> str:
        """The engines' key ("": none); ValueError when `key_env` names a variable that is not set."""
        if self.key_env is None:
            return ""
        value = os.environ.get(self.key_env, "").strip()
        if not value:
            raise ValueError(f"upstream.key_env: environment variable {self.key_env} is not set")
        return value


class RouterConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    require_keys: bool = True
    """Production configs refuse to start without keys; local configs may hold the dev keys."""
    keys: list[KeyConfig] = Field(default_factory=list)
    admin_keys: list[KeyConfig] = Field(default_factory=list)
    slo_classes: list[SLOClassConfig] = Field(default_factory=list)
    default_slo_class: str | None = None
    profiles: dict[str, ProfileConfig] = Field(default_factory=dict)
    default_profile: ProfileConfig = ProfileConfig()
    pd: PDConfig = PDConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    replicas: list[ReplicaConfig] = Field(default_factory=list)
    kv_events: KvEventsConfig | None = Field(default=None, description="index the engines' prefix caches from "
                                             "their KV events (the kv-cache-scorer reads it); one router worker")
    lora: LoraConfig | None = Field(default=None, description="LoRA adapters routed like models: to a replica "
                                    "that holds the adapter, else loaded where there is room (docs/router.md)")
    topology: str | None = Field(default=None, description="topology source for tiers and PD paths")
    scrape_interval_s: float = Field(default=1.0, gt=0)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0, description="larger request bodies get 413")
    read_timeout_s: float = Field(default=30.0, gt=0, description="a request's head and body must arrive within it "
                                  "(else 408)")
    head_timeout_s: float = Field(default=HEAD_TIMEOUT_S, gt=0, description="a request's head (request line and "
                                  "headers) must arrive within it of its first byte (else 408); at the connection "
                                  f"cap with none idle, a head still incomplete after {STALLED_HEAD_S:g} s is closed "
                                  "to make room")
    max_tokens_limit: int = Field(default=32768, gt=0)
    max_connections: int = Field(default=0, ge=0, description="open client connections per router process; past it "
                                 "503 + Retry-After. 0: half the open-file limit (raised to its hard limit at start) "
                                 f"less {FD_RESERVE}, at most {MAX_CONNECTIONS}")
    max_buffered_bytes: int = Field(default=MAX_BUFFERED_BYTES, gt=0, description="request bytes held in memory "
                                    "across a router process's connections; past it 503 + Retry-After")
    max_client_connections: int = Field(default=0, ge=0, description="open connections one client address (an "
                                        "IPv4 address, an IPv6 /64) may hold per router process; past it 503. 0: "
                                        f"1/{CLIENT_SHARE} of max_connections; max_connections or more: no cap of its "
                                        "own (behind a proxy that is every client's address)")
    max_client_buffered_bytes: int = Field(default=0, ge=0, description="request bytes one client address may "
                                           "have buffered per router process; past it 503. 0: "
                                           f"1/{CLIENT_SHARE} of max_buffered_bytes, at least 2 x max_body_bytes")
    client_idle_timeout_s: float = Field(default=IDLE_TIMEOUT_S, gt=0, description="a keep-alive client connection "
                                         "with no request under way is closed after this long (and the longest idle "
                                         "one is closed first when the connection cap is reached)")
    client_write_timeout_s: float = Field(default=CLIENT_WRITE_TIMEOUT_S, gt=0, description="a client that reads "
                                          "nothing of its response for this long is disconnected, its engine request "
                                          "aborted (outcome client_timeout)")
    client_buffer_bytes: int = Field(default=WRITE_BUFFER_BYTES, ge=1024, description="response bytes queued for "
                                     "one slow client before the router stops reading its engine")
    metrics_auth: Literal["open", "admin"] = Field(default="open", description="`admin`: /metrics needs the admin "
                                                   "key (Prometheus: `authorization: {type: Bearer, "
                                                   "credentials_file: ...}`)")
    tokenize_auth: Literal["vllm", "key"] = Field(
        default="vllm", description="`/tokenize` and `/detokenize`: `vllm` answers them without a key, as vLLM "
                                    "does (its --api-key guards only paths under /v1, /v2, /inference); `key`: "
                                    "they need a user key like /v1")
    tokenize_open_bytes_per_s: float = Field(
        default=1_000_000, ge=0, description="with `tokenize_auth: vllm`, the request bytes per second that "
        "/tokenize and /detokenize take from callers without a valid key, all together (a burst of 4 s of it "
        "at once; beyond, a request waits up to 10 s, then 429 with Retry-After): without it a keyless client "
        "can keep the engines tokenizing; 0: no bound. Callers with a key are not counted")
    fair: FairConfig = Field(default_factory=FairConfig, description="fair shares under abuse: the per-request "
                             "cost bound, each class's share of a replica's sequence slots, key and class quotas")
    workers: int = Field(default=1, ge=1, le=64, description="processes serving the port (SO_REUSEPORT); a class's "
                         "max_concurrency is divided between them; /metrics shows one view across them")
    seed: int = 0

    @model_validator(mode="after")
    def _consistent(self) -> RouterConfig:
        if self.require_keys and (not self.keys or not self.admin_keys):
            raise ValueError("require_keys is set: give `keys` and `admin_keys` (production configs must have keys)")
        names = {c.name for c in self.classes().values()}
        for k in self.keys:
            unknown = sorted(set(k.slo_classes) - names - {"*"})
            if unknown:
                raise ValueError(f"tenant {k.tenant}: unknown SLO classes {unknown}")
        unknown = sorted(set(self.profiles) - names)
        if unknown:
            raise ValueError(f"profiles for unknown SLO classes {unknown}")
        if self.default_slo_class is not None and self.default_slo_class not in names:
            raise ValueError(f"default_slo_class {self.default_slo_class!r} is not a class")
        problems = self.fair.problems(self.classes())
        problems += [f"replica {r.replica_id}: unknown SLO classes {sorted(set(r.slo_classes) - names)}"
                     for r in self.replicas if set(r.slo_classes) - names]
        if self.kv_events is not None and self.workers > 1:
            problems.append(f"kv_events: one router worker binds the subscriber (workers is {self.workers})")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def quotas(self) -> tuple[dict[str, Quota], Quota]:
        """Each tenant's quota (its first key entry's), and the one for tenants without keys."""
        out: dict[str, Quota] = {}
        for k in self.keys:
            out.setdefault(k.tenant, self.fair.key_quota(k.max_concurrency, k.tokens_per_s, k.burst_tokens))
        return out, self.fair.key_quota()

    def limits(self) -> ServerLimits:
        """The front door's caps for one router process."""
        connections, buffered = client_share(self.max_connections, self.max_buffered_bytes, self.max_body_bytes)
        return ServerLimits(max_connections=self.max_connections, max_buffered_bytes=self.max_buffered_bytes,
                            max_client_connections=self.max_client_connections or connections,
                            max_client_buffered_bytes=self.max_client_buffered_bytes or buffered,
                            client_write_timeout_s=self.client_write_timeout_s,
                            idle_timeout_s=self.client_idle_timeout_s, head_timeout_s=self.head_timeout_s,
                            write_buffer_bytes=self.client_buffer_bytes)

    def classes(self) -> dict[str, SLOClass]:
        chosen = [c.to_slo() for c in self.slo_classes] or list(DEFAULT_SLO_CLASSES)
        return {c.name: c for c in chosen}

    def profile(self, slo_class: str) -> ProfileConfig:
        return self.profiles.get(slo_class, self.default_profile)


def load_router_config(path: str) -> RouterConfig:
    return parse_router_config(load_yaml_file(path, "router config"), path)


def parse_router_config(raw: object, where: str = "router config") -> RouterConfig:
    return validate_mapping(RouterConfig, raw, "router config", "a router config is a mapping", where)
