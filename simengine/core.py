"""The simulated engine's continuous-batching core: pure, over virtual time, no sockets, no sleeps.

Each `step()` schedules one engine iteration the way vLLM does and returns how long it took
(from `physics.costmodel`) and which requests produced a token:

1. running requests first, in priority order (lower value first, then arrival): one decode
   token each, or their next prefill chunk; a request needing a new KV block when none is free
   preempts the least important running request (its blocks are freed and it recomputes later);
2. then waiting requests in priority order, while the step's token budget
   (`max_num_batched_tokens`), the sequence limit and free KV blocks allow; long prompts are
   prefilled in chunks (chunked prefill);
3. a request's first token comes out of the step that finishes its prefill.

With `chunked_prefill=False` it schedules as vLLM v0 without chunked prefill did (v0.1.7,
vllm/core/scheduler.py `_schedule`): a step that admits new prompts runs only them, each whole,
first come first served while the token budget, the sequence limit and the KV cache (less a 1 %
watermark) allow; running requests decode only in steps that admit nobody, so every new prompt
stalls the decodes for the length of its prefill.

The KV cache holds `kv_capacity_tokens` (from GPU memory, model size and TP) in blocks of
`block_size` tokens. A request whose prompt was prefilled remotely (PD disaggregation) becomes
ready only after its KV transfer time and skips prefill. A prefill-only request can keep its
blocks after finishing (`hold_kv`) until the decode side releases them.

With `prefix_caching` the blocks live in a prefix cache (`kvblocks.cache`, vLLM's v1 manager's
rules): a request given its prompt's token ids starts with the leading blocks already cached
(their tokens are not prefilled again; vLLM recomputes at least the prompt's last token), each
prefilled chunk's full blocks join the cache, and blocks are taken from the empty ones first,
then from the least recently freed cached ones. The cache's events (`kv_events`, vLLM's KV-event
vocabulary) and its query and hit counts (`prefix_queries`, `prefix_hits`, in tokens) are for the
server to publish.

The offline simulator fast-forwards stretches of identical decode steps (`decode_plan`,
`apply_decode`, `decode_run`; planned in `simengine.fastforward`), each exactly a `step()`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvblocks.cache import PrefixCache
from kvblocks.events import Event
from physics import costmodel
from physics import gang as gangcost
from physics.catalog import GpuSpec, ModelSpec
from physics.costmodel import Efficiency, LinkCost
from physics.gang import GangCost
from physics.lora import LoraCost
from simengine import fastforward
from simengine.fastforward import DecodeRun
from simengine.lora import LoraSlots, LoraSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    model: ModelSpec
    gpu: GpuSpec
    tp: int
    link: LinkCost
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    block_size: int = 16
    kv_capacity_tokens: int | None = None
    """None: from the cost model (vLLM's gpu_memory_utilization=0.9 semantics)."""
    efficiency: Efficiency = costmodel.DEFAULT
    chunked_prefill: bool = True
    """False: vLLM v0's prefill-first steps (whole prompts, no decodes alongside; module docstring)."""
    gang: GangCost | None = None
    """This engine is one data-parallel rank (or the pipeline) of a gang: steps cost as the gang's
    (`physics.gang`: MoE all-to-all over its links, pipeline stages)."""
    prefix_caching: bool = False
    """Blocks in a prefix cache (module docstring); off: every prompt is prefilled in full."""
    lora: LoraSpec | None = None
    """`--enable-lora`: requests may name an adapter (`Seq.lora`); at most `max_loras` distinct ones
    in a batch, their loads, activations and kernels priced (`simengine.lora.LoraSlots`)."""

    def capacity(self) -> int:
        if self.kv_capacity_tokens is not None:
            return self.kv_capacity_tokens
        gang = self.gang
        if gang is None:
            return costmodel.kv_capacity_tokens(self.model, self.gpu, self.tp)
        ep = self.tp * gang.dp if gang.expert_parallel else 1
        return costmodel.kv_capacity_tokens(self.model, self.gpu, self.tp, pp=gang.pp, ep=ep)


@dataclass(slots=True, eq=False)  # identity: the scheduler tests membership a lot
class Seq:
    rid: str
    prompt_tokens: int
    max_tokens: int
    priority: int
    arrival_s: float
    ready_s: float
    order: int
    remote_prefill: bool = False
    hold_kv: bool = False
    token_ids: tuple[int, ...] = ()
    """The prompt's token ids (the prefix cache's keys; empty: nothing to share)."""
    lora: str | None = None
    in_cache: bool = False
    """Started in the prefix cache (its hit applied)."""
    computed: int = 0
    """Tokens whose KV is in the cache (prompt, then prompt + outputs)."""
    output: int = 0
    blocks: int = 0
    preemptions: int = 0
    first_token_s: float | None = None
    done: bool = False

    def key(self) -> tuple[int, float, int]:
        return (self.priority, self.arrival_s, self.order)

    def need(self) -> int:
        """Tokens to compute before the next token can be sampled: the prompt (plus tokens
        generated before a preemption, recomputed), or the one token sampled last."""
        return self.prompt_tokens + self.output - self.computed

    def decoding(self) -> bool:
        return self.need() <= 1 and (self.output >= 1 or self.remote_prefill)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    start_s: float
    duration_s: float
    tokens: tuple[str, ...]
    """Requests that produced one token at the end of this step."""
    finished: tuple[str, ...]
    preempted: tuple[str, ...]
    prefill_tokens: int
    decode_seqs: int
    admitted: tuple[str, ...] = ()
    """Requests scheduled this step from the waiting queue (first time, or after a preemption)."""


@dataclass(slots=True)
class _Plan:
    chunks: dict[str, int] = field(default_factory=dict)
    decodes: dict[str, int] = field(default_factory=dict)
    """rid -> tokens computed this step (1, or 0 right after a remote prefill)."""
    decode_context: int = 0
    preempted: list[str] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    loras: set[str] = field(default_factory=set)
    """The adapters of the step's sequences."""


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.now = 0.0
        self.total_blocks = max(1, config.capacity() // config.block_size)
        self.free_blocks = self.total_blocks
        self.slowdown = 1.0
        self.link = config.link
        self.seqs: dict[str, Seq] = {}
        self.waiting: list[Seq] = []
        self.running: list[Seq] = []
        self.held: dict[str, Seq] = {}
        self._order = 0
        self.cache = PrefixCache(self.total_blocks, config.block_size) if config.prefix_caching else None
        self.kv_events: list[Event] = []
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.lora = LoraSlots(config.lora, LoraCost(model=config.model, gpu=config.gpu, tp=config.tp,
                                                    max_lora_rank=config.lora.max_lora_rank)) \
            if config.lora is not None else None

    # requests
    def add(self, rid: str, prompt_tokens: int, max_tokens: int, priority: int = 0, ready_after_s: float = 0.0,
            remote_prefill: bool = False, hold_kv: bool = False, token_ids: tuple[int, ...] = (),
            lora: str | None = None) -> None:
        if rid in self.seqs or rid in self.held:
            raise ValueError(f"request {rid} already exists")
        if not self.config.chunked_prefill and prompt_tokens > self.config.max_num_batched_tokens:
            raise ValueError(f"prompt {prompt_tokens} tokens exceeds max_num_batched_tokens "
                             f"{self.config.max_num_batched_tokens}, which a non-chunked engine cannot prefill")
        need = self._blocks_for(prompt_tokens + max_tokens)
        if need > self.total_blocks:
            raise ValueError(f"prompt {prompt_tokens} + max_tokens {max_tokens} tokens exceed the KV cache "
                             f"({self.total_blocks * self.config.block_size} tokens)")
        self._order += 1
        seq = Seq(rid=rid, prompt_tokens=max(1, prompt_tokens), max_tokens=max_tokens, priority=priority,
                  arrival_s=self.now, ready_s=self.now + ready_after_s, order=self._order,
                  remote_prefill=remote_prefill, hold_kv=hold_kv, token_ids=token_ids, lora=lora)
        if remote_prefill:
            seq.computed = seq.prompt_tokens  # the KV arrives; no prefill compute here
        self.seqs[rid] = seq
        self.waiting.append(seq)

    def abort(self, rid: str) -> None:
        seq = self.seqs.pop(rid, None) or self.held.pop(rid, None)
        if seq is None:
            return
        self._free(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)

    def stop(self, rid: str) -> None:
        """It ended before max_tokens (EOS, a stop string or token): finish it as if it reached them."""
        seq = self.seqs.get(rid)
        if seq is not None and seq in self.running:
            self._finish(seq)

    def release(self, rid: str) -> bool:
        """The decode side took the KV of a held prefill: free it. False when not held."""
        seq = self.held.pop(rid, None)
        if seq is None:
            return False
        self._free(seq)
        return True

    # state
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def next_ready_s(self) -> float | None:
        """When something can run next (now, a later KV arrival, or never)."""
        if self.running:
            return self.now
        return min((s.ready_s for s in self.waiting), default=None)

    def advance_to(self, t: float) -> None:
        """Idle time passes (the engine had nothing to run until `t`)."""
        self.now = max(self.now, t)

    # scheduling
    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.config.block_size)

    def _free(self, seq: Seq) -> None:
        """`seq`'s blocks go back (with a prefix cache: its cached ones stay cached, evictable)."""
        if self.cache is not None:
            self.cache.finish(seq.rid)
            seq.in_cache = False
            self.free_blocks = self.cache.free
        else:
            self.free_blocks += seq.blocks
        seq.blocks = 0

    def adopt(self, token_ids: tuple[int, ...], lora: str | None = None) -> None:
        """A prompt's leading blocks read from a peer's cache by a KV connector join this prefix
        cache (`kvblocks.cache.PrefixCache.adopt`); nothing without one."""
        if self.cache is not None:
            self.kv_events += self.cache.adopt(token_ids, lora)
            self.free_blocks = self.cache.free

    def _start(self, seq: Seq) -> None:
        """With a prefix cache: `seq` holds its prompt's cached leading blocks and skips their
        prefill (all but the prompt's last token: vLLM samples from it). Undone by `_unstart`
        when it is not admitted after all."""
        if self.cache is None or seq.in_cache:
            return
        bs = self.config.block_size
        hit = self.cache.start(seq.rid, seq.token_ids, seq.lora, limit=(seq.prompt_tokens - 1) // bs)
        seq.in_cache = True
        if not seq.remote_prefill:
            seq.computed = max(seq.computed, hit * bs)
        seq.blocks = self.cache.held(seq.rid)
        self.free_blocks = self.cache.free

    def _unstart(self, seq: Seq) -> None:
        """A waiting request that did not fit gives back the cached blocks it pinned (as vLLM takes
        a hit's blocks only with the allocation that admits it)."""
        if self.cache is not None and seq.in_cache:
            self._free(seq)
            if not seq.remote_prefill:
                seq.computed = 0

    def _admitted(self, seq: Seq) -> None:
        """Count its prefix-cache query and hit once, at its first admission (as vLLM counts)."""
        if self.cache is not None and not seq.remote_prefill and seq.preemptions == 0:
            self.prefix_queries += seq.prompt_tokens
            self.prefix_hits += seq.computed

    def _grow(self, seq: Seq, tokens: int) -> bool:
        if self.cache is not None:
            self._start(seq)
            ok, events = self.cache.grow(seq.rid, tokens)
            self.kv_events += events
            seq.blocks = self.cache.held(seq.rid)
            self.free_blocks = self.cache.free
            return ok
        need = self._blocks_for(tokens) - seq.blocks
        if need <= 0:
            return True
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        seq.blocks += need
        return True

    def _preempt(self, seq: Seq, plan: _Plan) -> None:
        self.running.remove(seq)
        self._free(seq)
        seq.computed = 0
        seq.remote_prefill = False  # recompute locally
        seq.preemptions += 1
        self.waiting.append(seq)
        plan.preempted.append(seq.rid)
        plan.chunks.pop(seq.rid, None)
        plan.decodes.pop(seq.rid, None)

    def _take(self, seq: Seq, plan: _Plan, budget: int) -> int:
        """Put `seq` into this step; returns the tokens it uses (0: none fit)."""
        if seq.lora:
            plan.loras.add(seq.lora)
        if seq.decoding():
            plan.decodes[seq.rid] = seq.need()
            plan.decode_context += seq.computed
            return 1
        tokens = min(seq.need(), budget)
        if tokens > 0:
            plan.chunks[seq.rid] = tokens
        return tokens

    def _schedule_running(self, plan: _Plan, budget: int) -> int:
        for seq in sorted(self.running, key=Seq.key):
            if seq not in self.running:
                continue  # preempted while making room for a more important request
            tokens = 1 if seq.decoding() else min(seq.need(), budget)
            if tokens <= 0:
                continue
            while not self._grow(seq, seq.computed + max(tokens, 1)):
                victims = [s for s in self.running if s is not seq and s.key() > seq.key()]
                victim = max(victims, key=Seq.key) if victims else None
                if victim is None:
                    self._preempt(seq, plan)
                    break
                self._preempt(victim, plan)
            if seq not in self.running:
                continue
            budget -= self._take(seq, plan, budget)
        return budget

    def _admit_waiting(self, plan: _Plan, budget: int) -> None:
        for seq in sorted(self.waiting, key=Seq.key):
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            if seq.ready_s > self.now or (not self.config.chunked_prefill and not seq.decoding()):
                continue  # not chunked: prompts are admitted only by `_admit_prompts`
            if self.lora is not None and not self.lora.fits(plan.loras, seq.lora):
                continue  # its adapter would exceed max_loras in this batch: skipped, as vLLM does
            self._start(seq)
            tokens = 1 if seq.decoding() else min(seq.need(), budget)
            if not self._grow(seq, seq.computed + max(tokens, 1)):
                self._unstart(seq)
                break  # no room: wait for running requests to finish
            self._admitted(seq)
            self.waiting.remove(seq)
            self.running.append(seq)
            plan.admitted.append(seq.rid)
            budget -= self._take(seq, plan, budget)

    def _admit_prompts(self, plan: _Plan) -> None:
        """vLLM v0 without chunked prefill: whole prompts, first come first served, stopping at
        the first that does not fit the token budget, the sequence limit or the free KV blocks
        less the block manager's watermark (1 % of them; vllm/core/block_manager.py can_allocate)."""
        budget = self.config.max_num_batched_tokens
        watermark = int(0.01 * self.total_blocks) if self.running else 0  # idle: nothing to wait for
        for seq in sorted(self.waiting, key=Seq.key):
            if seq.ready_s > self.now or seq.decoding():
                continue  # a remote prefill's KV joins the decodes instead
            if self.lora is not None and not self.lora.fits(plan.loras, seq.lora):
                continue
            self._start(seq)
            tokens = seq.need()  # a recompute after preemption may exceed the budget: it then runs alone
            if (tokens > budget and plan.chunks) or len(self.running) >= self.config.max_num_seqs \
                    or self.free_blocks - (self._blocks_for(seq.computed + tokens) - seq.blocks) < watermark \
                    or not self._grow(seq, seq.computed + tokens):
                self._unstart(seq)
                break
            self._admitted(seq)
            self.waiting.remove(seq)
            self.running.append(seq)
            plan.admitted.append(seq.rid)
            plan.chunks[seq.rid] = tokens
            if seq.lora:
                plan.loras.add(seq.lora)
            budget -= tokens

    def _duration_s(self, plan: _Plan) -> float:
        """One forward over every sequence in the step (`costmodel.forward_ms`): each prefill
        chunk attends over its own earlier tokens, decodes read their contexts."""
        cfg, seqs = self.config, self.seqs
        chunks = [(n, seqs[rid].computed) for rid, n in plan.chunks.items()]
        if cfg.gang is not None:
            ms = gangcost.gang_forward_ms(cfg.model, cfg.gpu, cfg.tp, self.link, cfg.gang, chunks,
                                          len(plan.decodes), plan.decode_context, cfg.efficiency)
        else:
            ms = costmodel.forward_ms(cfg.model, cfg.gpu, cfg.tp, self.link, chunks, len(plan.decodes),
                                      plan.decode_context, cfg.efficiency)
        if self.lora is not None and plan.loras:
            ms += self.lora.step_ms(sorted(plan.loras))
        return ms * self.slowdown / 1000.0

    def step(self) -> StepResult | None:
        """One iteration at `self.now`; None when nothing is runnable now."""
        plan = _Plan()
        if not self.config.chunked_prefill:
            self._admit_prompts(plan)  # vLLM v0: a step with new prompts runs only them
        if not plan.chunks:
            budget = self._schedule_running(plan, self.config.max_num_batched_tokens)
            if not plan.preempted:  # as vLLM: a step that had to preempt admits nobody new
                self._admit_waiting(plan, budget)
        if not plan.chunks and not plan.decodes:
            return None
        start, duration = self.now, self._duration_s(plan)
        self.now += duration
        tokens, finished = [], []
        for rid, n in plan.chunks.items():
            seq = self.seqs[rid]
            seq.computed += n
            if self.cache is not None:
                self.kv_events += self.cache.computed(rid, seq.computed)
            if seq.need() <= 0:
                tokens.append(rid)
        for rid, n in plan.decodes.items():
            self.seqs[rid].computed += n
            tokens.append(rid)
        for rid in tokens:
            seq = self.seqs[rid]
            seq.output += 1
            if seq.first_token_s is None:
                seq.first_token_s = self.now
            if seq.output >= seq.max_tokens:
                finished.append(rid)
                self._finish(seq)
        return StepResult(start_s=start, duration_s=duration, tokens=tuple(tokens), finished=tuple(finished),
                          preempted=tuple(plan.preempted), prefill_tokens=sum(plan.chunks.values()),
                          decode_seqs=len(plan.decodes), admitted=tuple(plan.admitted))

    def _finish(self, seq: Seq) -> None:
        seq.done = True
        self.running.remove(seq)
        del self.seqs[seq.rid]
        if seq.hold_kv:
            self.held[seq.rid] = seq
        else:
            self._free(seq)

    # fast-forward (the offline simulator): many identical decode steps at once (`simengine.fastforward`)
    def decode_plan(self, until_s: float, max_steps: int = 1 << 30) -> DecodeRun | None:
        """The back-to-back pure-decode steps that can run now while nothing could change the batch,
        up to the one in progress at `until_s` (`fastforward.decode_plan`). Changes nothing:
        `apply_decode` commits a prefix of it. None with adapters in the batch (their steps are priced
        one at a time)."""
        if self.lora is not None and any(s.lora for s in self.running):
            return None
        return fastforward.decode_plan(self, until_s, max_steps)

    def apply_decode(self, run: DecodeRun, steps: int) -> None:
        """Commit the first `steps` steps of a plan made at the current state."""
        if run.start_s != self.now or not 0 < steps <= len(run.ends_s):
            raise ValueError("a decode plan applies once, from the state it was made in")
        for seq in self.running:
            self._grow(seq, seq.computed + steps)
            seq.computed += steps
            seq.output += steps
        self.now = run.ends_s[steps - 1]

    def decode_run(self, until_s: float, max_steps: int = 1 << 30) -> DecodeRun | None:
        """`decode_plan` and commit all of it."""
        run = self.decode_plan(until_s, max_steps)
        if run is not None:
            self.apply_decode(run, len(run.ends_s))
        return run
