"""The router config's `fair` section (issue 28, fair shares under abuse): the per-request cost
bound (`router.cost`), each class's share of a replica's sequence slots (`router.plugins.filters
.has_headroom`), and the default per-key and per-class quotas (`router.quota`; a key entry may
set its own)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from pools.model import SLOClass
from router.cost import CostLimits
from router.quota import Quota

FULL_SHARE, SHEDDABLE_SHARE = 1.0, 0.5
"""Default shares of a replica's sequence slots: a sheddable class (batch) may fill half, every
other class all of them. A non-sheddable class is not refused for slots by default: it queues
in the engine behind higher priorities as before, and the autoscaler sees that queue; give it a
share (`seq_share: {standard: 0.75}`) to keep slots from it too."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RateConfig(_Strict):
    tokens_per_s: float | None = Field(default=None, gt=0, description="tokens (prompt + max_tokens per sequence) "
                                       "admitted per second; None: no rate limit")
    burst_tokens: float | None = Field(default=None, gt=0, description="bucket size; None: 10 s of the rate")


class FairConfig(_Strict):
    max_sequences: int = Field(default=64, ge=1, description="sequences per request (n x prompts); past it 400")
    max_request_tokens: int = Field(default=1_048_576, ge=1, description="n x prompts x (prompt + max_tokens) per "
                                    "request; past it 400")
    max_logprob_entries: int = Field(default=262_144, ge=1, description="logprob entries a request may return "
                                     "(sequences x max_tokens x (1 + top logprobs), plus prompt logprobs); past it 400")
    max_response_bytes: int = Field(default=32 * 1024 * 1024, ge=1024, description="a request's estimated "
                                    "response size; past it 400")
    default_max_tokens: int | None = Field(default=None, ge=1, description="max_tokens sent to the engine when a "
                                           "request gives none (chat; completions with null). None: "
                                           "max_tokens_limit; at most the engines' max_model_len, which the "
                                           "router reads from their /v1/models")
    seq_share: dict[str, float] = Field(default_factory=dict, description="class -> part of a replica's "
                                        "max_num_seqs it may fill, in (0, 1]. Unnamed classes: sheddable ones 0.5, "
                                        "others 1.0")
    replica_max_num_seqs: int = Field(default=256, ge=1, description="an engine's max_num_seqs where a replica "
                                      "entry does not give it (vLLM's default)")
    key_max_concurrency: int | None = Field(default=512, ge=1, description="requests in flight per tenant, unless its "
                                            "key entry says; past it 429")
    key_rate: RateConfig = Field(default_factory=RateConfig, description="token rate per tenant, unless its key "
                                 "entry says; past it 429 + Retry-After")
    class_rates: dict[str, RateConfig] = Field(default_factory=dict, description="class -> token rate shared by all "
                                               "its requests; past it 429 + Retry-After")

    def cost_limits(self, max_tokens_limit: int) -> CostLimits:
        return CostLimits(max_sequences=self.max_sequences, max_request_tokens=self.max_request_tokens,
                          max_logprob_entries=self.max_logprob_entries, max_response_bytes=self.max_response_bytes,
                          default_max_tokens=min(self.default_max_tokens or max_tokens_limit, max_tokens_limit))

    def shares(self, classes: Mapping[str, SLOClass]) -> dict[str, float]:
        """Each class's share of a replica's sequence slots (configured, else by sheddability;
        the highest class (lowest priority value) always may fill them all)."""
        top = min((c.priority for c in classes.values()), default=0)
        return {name: self.seq_share.get(name, SHEDDABLE_SHARE if c.sheddable and c.priority != top else FULL_SHARE)
                for name, c in classes.items()}

    def key_quota(self, max_concurrency: int | None = None, tokens_per_s: float | None = None,
                  burst_tokens: float | None = None) -> Quota:
        """A tenant's quota: its key entry's values, the defaults above where it gives none."""
        if tokens_per_s is None:
            tokens_per_s, burst_tokens = self.key_rate.tokens_per_s, self.key_rate.burst_tokens
        return Quota(max_concurrency=max_concurrency or self.key_max_concurrency, tokens_per_s=tokens_per_s,
                     burst_tokens=burst_tokens)

    def class_quotas(self) -> dict[str, Quota]:
        return {name: Quota(tokens_per_s=r.tokens_per_s, burst_tokens=r.burst_tokens)
                for name, r in self.class_rates.items()}

    def problems(self, classes: Mapping[str, SLOClass]) -> list[str]:
        out = [f"fair.seq_share.{name}: {v} is not in (0, 1]" for name, v in self.seq_share.items()
               if not 0 < v <= 1]
        unknown = sorted((set(self.seq_share) | set(self.class_rates)) - set(classes))
        if unknown:
            out.append(f"fair: unknown SLO classes {unknown}")
        return out
