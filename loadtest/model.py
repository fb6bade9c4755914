"""The load tester's vocabulary, shared by workloads, the live driver, the offline simulator and
the reports: a request to send (`TraceRequest`) and what happened to it (`RequestResult`)."""

from __future__ import annotations

from dataclasses import dataclass

OK = "ok"
"""The outcome of a request that completed; anything else names why it did not (`shed`,
`error:<cause>`, `timeout`, `lost`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceRequest:
    index: int
    arrival_s: float
    """Seconds from the start of the run."""
    prompt_tokens: int
    output_tokens: int
    slo_class: str = "standard"
    prefix_blocks: tuple[int, ...] = ()
    """Hashes of the prompt's leading blocks (Mooncake's hash_ids): equal leading ids mean a
    shared, cacheable prefix. Empty when the trace does not say."""
    block_tokens: int = 512
    model: str = ""
    """The model it names (a LoRA adapter: `workloads.lora`); empty: the run's model."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestResult:
    index: int
    slo_class: str
    sent_s: float
    """When it was sent, seconds from the start of the run."""
    outcome: str
    prompt_tokens: int
    output_tokens: int
    """Tokens actually generated (streamed chunks or usage)."""
    ttft_s: float | None = None
    tpot_s: float | None = None
    """Mean time per output token after the first: (e2e - ttft) / (output_tokens - 1)."""
    itls_s: tuple[float, ...] = ()
    e2e_s: float | None = None
    tier: str = ""
    replica: str = ""
    prefill_replica: str = ""
    status: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == OK
