"""`load_workload(spec)`: the requests of a load test, from a trace or a generator, scaled, cut
and labelled. The live driver, the simulator and the comparisons all start here.

A spec is a string or a mapping (a scenario's `workload:` key):

    azure-conv | azure-code | mooncake-conversation | mooncake-synthetic | sharegpt-example
        the samples shipped in loadtest/data (see its README: sources, licences); the full
        traces are read only when given by path
    PATH.csv | PATH.jsonl | PATH.json
        an Azure LLM trace, a Mooncake trace, a ShareGPT-style file (`format:` names it otherwise)
    synthetic:ARRIVAL,rate=R,prompt=LEN,output=LEN[,cv=C][,requests=N][,seed=S][,duration_s=D]
        ARRIVAL: poisson, gamma or constant; LEN: N, uniform:LOW:HIGH, lognormal:MEAN:MEDIAN[:MAX]

    {trace: NAME|PATH} or {path: PATH} or {synthetic: {arrival, rate, cv, prompt, output, requests}}
    or {sessions: {rate, turns, system, systems, message, output, think_s, agentic, ...}} (multi-turn
    chats or tool loops sharing system prompts and growing histories: `workloads.sessions`),
    plus any of: format, rate (req/s for traces without timestamps; default 1), time_scale,
    rate_scale, duration_s, max_requests, class_mix ({interactive: 0.2, standard: 0.6, batch: 0.2}),
    lora ({adapters: 8 or [names], skew: 1.0, base_share: 0}: requests name LoRA adapters, Zipf
    over them: `workloads.lora`), seed (default 0)

Order: read or generate, compress time (`time_scale`), scale the rate (`rate_scale`: k times the
requests over the same span; see `workloads.transforms`), keep arrivals before `duration_s` and
the first `max_requests`, assign classes, number by arrival. A synthetic workload is generated at
rate x rate_scale x time_scale with `requests` x rate_scale requests (the same thing in
distribution, without copies).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from loadtest.model import TraceRequest
from loadtest.workloads import WorkloadError, synthetic, traces, transforms
from loadtest.workloads import lora as lora_mix
from loadtest.workloads import sessions as multiturn
from topology.configfile import format_validation

DATA_DIR = Path(__file__).resolve().parent / "data"
NAMED: dict[str, tuple[str, str]] = {
    "azure-conv": ("azure_llm_2023_conv.sample.csv", "azure"),
    "azure-code": ("azure_llm_2023_code.sample.csv", "azure"),
    "mooncake-conversation": ("mooncake_conversation_trace.sample.jsonl", "mooncake"),
    "mooncake-synthetic": ("mooncake_synthetic_trace.sample.jsonl", "mooncake"),
    "sharegpt-example": ("sharegpt_example.json", "sharegpt"),
}
"""Named workloads: the samples shipped in loadtest/data and their formats."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SyntheticConfig(_Strict):
    arrival: Literal["poisson", "gamma", "constant"] = "poisson"
    rate: float = Field(gt=0, description="mean arrival rate, requests per second")
    cv: float | None = Field(default=None, gt=0, description="gamma: coefficient of variation of the gaps")
    burstiness: float | None = Field(default=None, gt=0, description="gamma: vllm bench's shape (cv = 1/sqrt(B))")
    prompt: int | str | dict[str, Any] = Field(default=512, description="prompt length distribution")
    output: int | str | dict[str, Any] = Field(default=128, description="output length distribution")
    requests: int | None = Field(default=None, ge=1, description="how many (else bounded by duration_s)")

    @model_validator(mode="after")
    def _one_shape(self) -> SyntheticConfig:
        if self.cv is not None and self.burstiness is not None:
            raise ValueError(f"give cv ({self.cv:g}) or burstiness ({self.burstiness:g}), not both")
        if self.arrival != "gamma" and (self.cv is not None or self.burstiness is not None):
            raise ValueError(f"cv and burstiness shape gamma arrivals, not {self.arrival}")
        return self

    def spec(self, rate_factor: float, count_factor: float) -> synthetic.SyntheticSpec:
        cv = self.cv if self.cv is not None else (self.burstiness ** -0.5 if self.burstiness is not None else 1.0)
        requests = None if self.requests is None else max(1, round(self.requests * count_factor))
        return synthetic.SyntheticSpec(
            rate_rps=self.rate * rate_factor, arrival=self.arrival, cv=cv, requests=requests,
            prompt=synthetic.length_dist(self.prompt, "synthetic.prompt"),
            output=synthetic.length_dist(self.output, "synthetic.output"))


class SessionsConfig(_Strict):
    """Multi-turn sessions (`loadtest.workloads.sessions`): chats, or with `agentic` tool loops."""

    rate: float = Field(gt=0, description="sessions started per second")
    turns: int | str | dict[str, Any] = Field(default="uniform:2:8", description="turns per session")
    system: int | str | dict[str, Any] = Field(default=2048, description="a system prompt's tokens")
    systems: int = Field(default=4, ge=1, description="distinct system prompts (Zipf over them)")
    system_skew: float = Field(default=1.0, ge=0, description="the Zipf exponent over system prompts")
    message: int | str | dict[str, Any] | None = Field(
        default=None, description="tokens a turn adds (default lognormal:300:200; agentic: a tool result, "
        "lognormal:800:500)")
    output: int | str | dict[str, Any] | None = Field(
        default=None, description="tokens a turn asks for (default lognormal:200:150; agentic: lognormal:120:80)")
    think_s: float | None = Field(default=None, ge=0, description="mean gap after a reply (default 5; agentic 0.5)")
    reply_tok_s: float = Field(default=50.0, gt=0, description="a reply's pace, for when the next turn comes")
    agentic: bool = False
    block_tokens: int = Field(default=64, ge=1, description="the granularity sharing is declared in")
    sessions: int | None = Field(default=None, ge=1, description="how many (else bounded by duration_s)")

    def spec(self, rate_factor: float) -> multiturn.SessionsSpec:
        agent = self.agentic
        return multiturn.SessionsSpec(
            rate=self.rate * rate_factor, turns=synthetic.length_dist(self.turns, "sessions.turns"),
            system=synthetic.length_dist(self.system, "sessions.system"),
            message=synthetic.length_dist(self.message or ("lognormal:800:500" if agent else "lognormal:300:200"),
                                          "sessions.message"),
            output=synthetic.length_dist(self.output or ("lognormal:120:80" if agent else "lognormal:200:150"),
                                         "sessions.output"),
            systems=self.systems, system_skew=self.system_skew,
            think_s=self.think_s if self.think_s is not None else (0.5 if agent else 5.0),
            reply_tok_s=self.reply_tok_s, agentic=agent, block_tokens=self.block_tokens, sessions=self.sessions)


class LoraMixConfig(_Strict):
    """Requests name LoRA adapters, Zipf over them (`loadtest.workloads.lora`)."""

    adapters: int | list[str] = Field(description="adapter names, or how many (lora-0, lora-1, ...)")
    skew: float = Field(default=1.0, ge=0, description="the Zipf exponent over the adapters (0: uniform)")
    base_share: float = Field(default=0.0, ge=0, lt=1, description="the share of requests left on the base model")

    def mix(self) -> lora_mix.AdapterMix:
        names = lora_mix.adapter_names(self.adapters) if isinstance(self.adapters, int) else tuple(self.adapters)
        return lora_mix.AdapterMix(adapters=names, skew=self.skew, base_share=self.base_share)


class WorkloadConfig(_Strict):
    trace: str | None = Field(default=None, description="a named sample or a trace file")
    path: str | None = Field(default=None, description="a trace file (relative to the scenario file)")
    synthetic: SyntheticConfig | None = None
    sessions: SessionsConfig | None = None
    format: Literal["azure", "mooncake", "sharegpt"] | None = Field(default=None, description="else sniffed")
    rate: float | None = Field(default=None, gt=0, description="req/s for a trace without timestamps")
    time_scale: float = Field(default=1.0, gt=0, description="the same requests in 1/k of the time")
    rate_scale: float = Field(default=1.0, gt=0, description="k times the arrival rate over the same span")
    rate_steps: list[tuple[float, float]] | None = Field(
        default=None, description="a load step: [[start_s, factor], ...] of the (scaled) rate from each start on")
    duration_s: float | None = Field(default=None, gt=0, description="keep arrivals before this")
    max_requests: int | None = Field(default=None, ge=1, description="keep the first N")
    class_mix: dict[str, float] | None = Field(default=None, description="SLO class -> weight")
    lora: LoraMixConfig | None = Field(default=None, description="requests name LoRA adapters, Zipf over them")
    seed: int = 0

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadConfig:
        given = [k for k in ("trace", "path", "synthetic", "sessions") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of trace, path, synthetic or sessions "
                             f"(got {', '.join(given) or 'none'})")
        if self.class_mix is not None and (not self.class_mix or any(w < 0 for w in self.class_mix.values())
                                           or sum(self.class_mix.values()) <= 0):
            raise ValueError(f"class_mix {self.class_mix} needs weights >= 0 with a positive sum")
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    name: str
    source: str
    """The file read, or `synthetic`."""
    config: WorkloadConfig = field(compare=False)
    requests: tuple[TraceRequest, ...]

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[TraceRequest]:
        return iter(self.requests)

    @property
    def span_s(self) -> float:
        return self.requests[-1].arrival_s if self.requests else 0.0

    def record(self) -> dict[str, Any]:
        """What a result file keeps to say which load it was."""
        n, span = len(self.requests), self.span_s
        classes: dict[str, int] = {}
        for r in self.requests:
            classes[r.slo_class] = classes.get(r.slo_class, 0) + 1
        return {"name": self.name, "source": self.source, "requests": n, "span_s": round(span, 3),
                "rate_rps": round((n - 1) / span, 4) if span > 0 else None,
                "prompt_tokens_mean": round(statistics.fmean(r.prompt_tokens for r in self.requests), 1) if n else 0,
                "output_tokens_mean": round(statistics.fmean(r.output_tokens for r in self.requests), 1) if n else 0,
                "classes": dict(sorted(classes.items())), "config": self.config.model_dump(exclude_none=True)}

    def describe(self) -> str:
        r = self.record()
        rate = f"{r['rate_rps']:.2f} req/s" if r["rate_rps"] is not None else "all at once"
        return (f"{self.name}: {r['requests']} requests over {r['span_s']:.1f} s ({rate}), prompt mean "
                f"{r['prompt_tokens_mean']:.0f} tokens, output mean {r['output_tokens_mean']:.0f} tokens")


TOP_KEYS = ("seed", "duration_s", "max_requests", "rate_scale", "time_scale")
SYNTHETIC_KEYS = ("rate", "cv", "burstiness", "prompt", "output", "requests")
ALIASES = {"duration": "duration_s", "n": "requests"}


def parse_synthetic(text: str) -> dict[str, Any]:
    """`synthetic:gamma,rate=5,cv=2,prompt=lognormal:1000:800,output=128,requests=100,seed=3`."""
    body = text.partition(":")[2]
    params: dict[str, Any] = {}
    top: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in body.split(","))):
        key, eq, value = item.partition("=")
        key = ALIASES.get(key.strip(), key.strip())
        if not eq and key in synthetic.ARRIVALS:
            params["arrival"] = key
        elif eq and key in SYNTHETIC_KEYS:
            params[key] = value.strip()
        elif eq and key in TOP_KEYS:
            top[key] = value.strip()
        else:
            raise WorkloadError(f"workload spec {text!r}: {item!r} is not ARRIVAL ({', '.join(synthetic.ARRIVALS)}) "
                                f"or KEY=VALUE with KEY in {', '.join(SYNTHETIC_KEYS + TOP_KEYS)}")
    return {"synthetic": params, **top}


def spec_mapping(spec: str | Mapping[str, Any]) -> dict[str, Any]:
    """A spec as the mapping a scenario would give."""
    if isinstance(spec, Mapping):
        return dict(spec)
    text = spec.strip()
    if text == "synthetic" or text.startswith("synthetic:"):
        return parse_synthetic(text)
    if not text:
        raise WorkloadError("workload spec is empty: give a named trace (" + ", ".join(NAMED) + "), a path or "
                            "synthetic:...")
    return {"trace": text} if text in NAMED else {"path": text}


def parse_config(spec: str | Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> WorkloadConfig:
    raw = {**spec_mapping(spec), **{k: v for k, v in (overrides or {}).items() if v is not None}}
    try:
        return WorkloadConfig.model_validate(raw)
    except ValidationError as err:
        raise WorkloadError(f"workload spec: {format_validation(err)}") from None


def _trace_file(config: WorkloadConfig, base_dir: Path | None) -> tuple[Path, str]:
    name = config.trace or config.path or ""
    if config.trace in NAMED:
        filename, fmt = NAMED[config.trace]
        return DATA_DIR / filename, config.format or fmt
    path = Path(name).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        raise WorkloadError(f"no trace file {str(path)!r} (named workloads: {', '.join(NAMED)}; "
                            "synthetic: synthetic:poisson,rate=R,...)")
    return path, config.format or traces.sniff(path)


def _read(config: WorkloadConfig, path: Path, fmt: str) -> list[TraceRequest]:
    if fmt == "sharegpt":
        lengths = traces.lengths_sharegpt(path)
        spec = synthetic.SyntheticSpec(rate_rps=config.rate or 1.0, prompt=synthetic.fixed(1),
                                       output=synthetic.fixed(1), requests=len(lengths))
        at = [r.arrival_s for r in synthetic.generate(spec, config.seed)]
        return [TraceRequest(index=i, arrival_s=t, prompt_tokens=p, output_tokens=o)
                for i, (t, (p, o)) in enumerate(zip(at, lengths, strict=True))]
    if config.rate is not None:
        raise WorkloadError(f"workload spec: rate: a {fmt} trace has its own timestamps; scale it with "
                            "rate_scale or time_scale")
    return traces.read_azure(path) if fmt == "azure" else traces.read_mooncake(path)


def load_workload(spec: str | Mapping[str, Any], overrides: Mapping[str, Any] | None = None,
                  base_dir: Path | None = None) -> Workload:
    """The workload a spec names. `overrides` (keys of a mapping spec; None values ignored) win
    over the spec: the live driver's --duration, --max-requests, --rate-scale, --seed. Relative
    trace paths are read from `base_dir` when given (a scenario file's folder)."""
    config = parse_config(spec, overrides)
    if config.synthetic is not None:
        scale = config.rate_scale * config.time_scale
        requests = synthetic.generate(config.synthetic.spec(scale, config.rate_scale), config.seed,
                                      config.max_requests, config.duration_s)
        source, name = "synthetic", spec if isinstance(spec, str) else "synthetic"
    elif config.sessions is not None:
        generated = multiturn.generate(config.sessions.spec(1.0), config.seed, None,
                                      config.duration_s * config.time_scale if config.duration_s else None)
        requests = transforms.scale_rate(transforms.compress_time(generated, config.time_scale), config.rate_scale)
        source, name = "sessions", "agentic" if config.sessions.agentic else "sessions"
    else:
        path, fmt = _trace_file(config, base_dir)
        requests = transforms.scale_rate(transforms.compress_time(_read(config, path, fmt), config.time_scale),
                                         config.rate_scale)
        source, name = str(path), config.trace or config.path or str(path)
    if config.rate_steps:
        requests = transforms.step_rate(requests, config.rate_steps, config.seed)
    requests = transforms.truncate(requests, config.duration_s, config.max_requests)
    if config.class_mix is not None:
        requests = transforms.assign_classes(requests, config.class_mix, config.seed)
    if config.lora is not None:
        requests = lora_mix.assign_adapters(requests, config.lora.mix(), config.seed)
    return Workload(name=name, source=source, config=config, requests=transforms.finalize(requests))
