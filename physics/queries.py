"""`python -m pools cost prefill|decode|collective|kv ... --format json`: what the cost model (the
one the planner, the simulated engine and the simulator use) predicts (a gang's `moe`, `pp` and
`a2a`: `physics.gangqueries`), as one JSON object with the inputs echoed and the link it
assumed. Pure: each answer is a function of its inputs. Links are the topology defaults of each
kind (`topology.kinds.DEFAULTS`: bandwidth per GPU and direction, latency, and their sources);
`--gbps` replaces a network link's bandwidth with a NIC rate in Gbit/s. A TP group's link
defaults to NVSwitch (placement keeps TP inside an NVLink island). `--dtype` sets the weights'
bytes and the rate they compute at (`compute`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from physics import catalog, collectives, costmodel, kvtransfer, speculative
from physics.catalog import ModelSpec
from physics.collectives import Hw
from topology import LinkKind, Path
from topology.gpus import gpu_facts
from topology.kinds import DEFAULTS, default_bandwidth_gb_s
from topology.paths import Tier

LINKS: dict[str, LinkKind] = {
    "nvswitch": LinkKind.NVSWITCH, "nvlink": LinkKind.NVLINK, "xgmi": LinkKind.XGMI, "pcie": LinkKind.PIX,
    "sys": LinkKind.SYS, "rdma": LinkKind.RDMA, "tcp": LinkKind.TCP}
"""`--link` names and the link kind each prices (pcie: GPUs under one PCIe switch)."""
NETWORK = frozenset({"rdma", "tcp"})
KV_LINKS: dict[str, Tier] = {"nvlink": "nvlink", "pcie": "pcie", "rdma": "rdma", "tcp": "tcp"}
"""`cost kv --link` names and the tier each path is (nvlink: the NVSwitch default)."""
OPS = ("allreduce", "allgather", "reducescatter", "alltoall")
DTYPES = tuple(catalog.WEIGHT_DTYPES)
KV_DTYPES = tuple(catalog.KV_DTYPES)


def link(name: str, gbps: float | None = None) -> costmodel.LinkCost:
    """The default link of kind `name`; `gbps` (Gbit/s, a NIC's rate) replaces its bandwidth."""
    if name not in LINKS:
        raise ValueError(f"unknown link {name!r} (known: {', '.join(LINKS)})")
    if gbps is not None and gbps <= 0:
        raise ValueError(f"--gbps must be positive, got {gbps}")
    d = DEFAULTS[LINKS[name]]
    return costmodel.LinkCost(bandwidth_gb_s=gbps / 8 if gbps is not None else d.bandwidth_gb_s,
                              latency_us=d.latency_us)


def tp_link_name(link_name: str, gpu: str) -> str:
    """The link a TP group of `gpu` runs over when `link_name` asks for its NVLink (nvswitch, the
    queries' default, or nvlink): a part with no NVLink at all (L40S, A10G, RTX 4090: no lanes, no
    fabric in topology/data/gpus.yaml) talks over PCIe, whatever was asked."""
    if link_name in ("nvswitch", "nvlink"):
        facts = gpu_facts(gpu)
        if not facts.nvlink_lanes and facts.fabric == "none":
            return "pcie"
    return link_name


def tp_link_of(link_name: str, gpu: str, tp: int) -> costmodel.LinkCost:
    """A TP group's link: over nvswitch/nvlink/xgmi the GPU's own fabric (`fabric`: H800's
    NVLink is 8 lanes, not H100's 18); a part without NVLink over PCIe at its generation's x16 rate
    (`tp_link_name`; the GPUs under one switch: a group whose path crosses the CPU is priced from a
    topology by the planner and the simulator, not here); else the kind's default."""
    link_name = tp_link_name(link_name, gpu)
    base = link(link_name)
    kind = LINKS[link_name]
    if kind is LinkKind.PIX:
        rate = default_bandwidth_gb_s(kind, pcie_generation=gpu_facts(gpu).pcie_generation)
        return costmodel.LinkCost(bandwidth_gb_s=rate, latency_us=base.latency_us, hw="pci")
    if not kind.is_gpu_fabric:
        return base
    line, _ = fabric(link_name, gpu, tp)
    return costmodel.LinkCost(bandwidth_gb_s=line, latency_us=base.latency_us, hw="nvlink",
                              switched=kind is LinkKind.NVSWITCH)


def link_view(name: str, cost: costmodel.LinkCost) -> dict[str, Any]:
    return {"name": name, "bandwidth_gb_s": cost.bandwidth_gb_s, "latency_us": cost.latency_us}


def model_spec(name: str, dtype: str | None, kv_dtype: str | None = None) -> ModelSpec:
    """The catalogue model in `dtype`/`kv_dtype` (None: as catalogued)."""
    return catalog.model(name).with_dtypes(dtype, kv_dtype)


def dtype_of(spec: ModelSpec) -> str:
    """The weight format's name (`catalog.WEIGHT_DTYPES`)."""
    return spec.weight_format


def positive(**values: int) -> None:
    for key, value in values.items():
        if value < 1:
            raise ValueError(f"--{key} must be at least 1, got {value}")


def _fits(model: ModelSpec, gpu_name: str, tp: int) -> bool:
    """Weights plus one long request's KV fit `tp` GPUs of this kind (answered, not enforced)."""
    return costmodel.fits(model, catalog.gpu(gpu_name).memory_gb, tp)


def _echo(spec: ModelSpec, gpu: str) -> dict[str, Any]:
    """The formats a query priced, as it echoes them."""
    part = catalog.gpu(gpu)
    return {"dtype": dtype_of(spec), "kv_dtype": "fp8" if spec.kv_bytes == 1 else "bf16",
            "compute": part.rate_used(spec), "fp8_compute": part.rate_used(spec) if dtype_of(spec) == "fp8" else None}


def prefill(model: str, gpu: str, tp: int, tokens: int, context: int = 0, dtype: str | None = None,
            link_name: str = "nvswitch", kv_dtype: str | None = None, sequences: int = 1, *, chunk: int = 0,
            nvls: bool = True) -> dict[str, Any]:
    """A prefill of `tokens` new tokens after `context` cached ones, on TP=`tp`; weights as `dtype`, KV as
    `kv_dtype` (None: as catalogued); `sequences` such prompts in one step, each attending over its own.
    `chunk` > 0: one prompt prefilled `chunk` tokens a step (chunked prefill, an engine's token budget
    per step), each chunk a step of its own over the cache the chunks before it wrote (`chunk_steps`).
    `nvls` False: the TP all-reduces run without NVLink SHARP (`costmodel.LinkCost.nvls`)."""
    positive(tp=tp, tokens=tokens)
    if sequences < 1:
        raise ValueError(f"sequences must be at least 1, got {sequences}")
    if context < 0:
        raise ValueError(f"--context must be 0 or more, got {context}")
    if chunk < 0 or (chunk and sequences > 1):
        raise ValueError(f"--chunk is 0 (one step) or a token budget for one prompt, got {chunk} for {sequences}")
    link_name = tp_link_name(link_name, gpu)
    spec, tp_link = model_spec(model, dtype, kv_dtype), replace(tp_link_of(link_name, gpu, tp), nvls=nvls)
    part = catalog.gpu(gpu)
    steps = chunk_steps(tokens, context, chunk) if chunk else (((tokens, context),) * sequences,)
    ms = sum(costmodel.forward_ms(spec, part, tp, tp_link, step, 0, 0) for step in steps)
    return {"what": "prefill", "model": model, "gpu": gpu, "tp": tp, "tokens": tokens, "context": context,
            "sequences": sequences, "chunk": chunk, "steps": len(steps), "nvls": nvls,
            **_echo(spec, gpu), "link": link_view(link_name, tp_link), "fits": _fits(spec, gpu, tp), "ms": ms}


def chunk_steps(tokens: int, context: int, chunk: int) -> tuple[tuple[tuple[int, int]], ...]:
    """The engine steps of a prompt of `tokens` after `context` cached ones prefilled at most
    `chunk` tokens a step: each step's (new tokens, cached tokens before them). A chunked step reads
    every weight again and pays its launches again; its attention covers the chunks before it."""
    return tuple(((min(chunk, tokens - start), context + start),) for start in range(0, tokens, chunk))


def decode(model: str, gpu: str, tp: int, batch: int, context: int, dtype: str | None = None,
           link_name: str = "nvswitch", *, kv_dtype: str | None = None, draft_tokens: int = 0,
           acceptance_rate: float | None = None, acceptance_length: float | None = None,
           expert_skew: float | None = None) -> dict[str, Any]:
    """One decode step of `batch` sequences with `context` tokens of context each. `ms` is the
    time per output token of a sequence (TPOT): the step, or with speculative decoding
    (`draft_tokens` > 0: MTP or an EAGLE-style head) the draft and verify passes over the tokens a
    step yields, from `acceptance_length` (mean tokens per step) or `acceptance_rate` (per draft).
    `expert_skew`: the MoE routing's Zipf exponent (0 uniform; a small batch of a skewed model
    touches fewer experts)."""
    positive(tp=tp, batch=batch)
    if context < 0:
        raise ValueError(f"--context must be 0 or more, got {context}")
    link_name = tp_link_name(link_name, gpu)
    spec, tp_link = model_spec(model, dtype, kv_dtype), tp_link_of(link_name, gpu, tp)
    if expert_skew is not None:
        if expert_skew < 0:
            raise ValueError(f"--expert-skew must be 0 or more, got {expert_skew}")
        if spec.moe is None:
            raise ValueError(f"--expert-skew: {model} is a dense model")
        spec = replace(spec, moe=replace(spec.moe, routing_skew=expert_skew))
    part = catalog.gpu(gpu)
    out: dict[str, Any] = {"what": "decode", "model": model, "gpu": gpu, "tp": tp, "batch": batch, "context": context,
                           **_echo(spec, gpu), "link": link_view(link_name, tp_link), "fits": _fits(spec, gpu, tp)}
    length = speculative_length(draft_tokens, acceptance_rate, acceptance_length)
    if length is None:
        step = costmodel.decode_step_ms(spec, part, tp, tp_link, batch, batch * context)
        return {**out, "step_ms": step, "speculative": None, "ms": step}
    draft_ms, verify_ms = speculative.decode_ms(spec, part, tp, tp_link, batch, batch * context, draft_tokens)
    step = draft_ms + verify_ms
    return {**out, "step_ms": step, "speculative": {"draft_tokens": draft_tokens, "acceptance_rate": acceptance_rate,
                                                   "acceptance_length": length, "draft_ms": draft_ms,
                                                   "verify_ms": verify_ms},
            "ms": step / length}


def speculative_length(draft_tokens: int, acceptance_rate: float | None,
                       acceptance_length: float | None) -> float | None:
    """Tokens a speculative step yields per sequence (None: no speculation), from the acceptance
    length itself or each draft's acceptance rate; bad combinations are errors."""
    if draft_tokens < 0:
        raise ValueError(f"--draft-tokens must be 0 or more, got {draft_tokens}")
    if draft_tokens == 0:
        if acceptance_rate is not None or acceptance_length is not None:
            raise ValueError("--acceptance-rate/--acceptance-length go with --draft-tokens")
        return None
    if (acceptance_rate is None) == (acceptance_length is None):
        raise ValueError("speculative decoding needs one of --acceptance-rate (per draft token, 0..1) "
                         "or --acceptance-length (tokens per step, 1..draft tokens + 1)")
    if acceptance_rate is not None and not 0 <= acceptance_rate <= 1:
        raise ValueError(f"--acceptance-rate is a probability (0..1), got {acceptance_rate}")
    if acceptance_length is not None and not 1 <= acceptance_length <= draft_tokens + 1:
        raise ValueError(f"--acceptance-length is 1..{draft_tokens + 1} tokens per step, got {acceptance_length}")
    if acceptance_length is not None:
        return acceptance_length
    return speculative.tokens_per_step(float(acceptance_rate or 0.0), draft_tokens)


def loaded_decode(model: str, gpu: str, tp: int, concurrency: int, prompt_tokens: int, output_tokens: int,
                  dtype: str | None = None, link_name: str = "nvswitch", kv_dtype: str | None = None,
                  step_tokens: int = 8192) -> dict[str, Any]:
    """The mean inter-token latency of a closed loop of `concurrency` clients, each sending
    `prompt_tokens`-in / `output_tokens`-out requests back to back, on an engine that mixes prompt
    chunks into decode steps (chunked prefill, `step_tokens` per step). In steady state a step
    decodes every sequence, each at half its output on average (context prompt + output / 2), and
    prefills the prompts of the requests that replace finished ones: concurrency x prompt / output
    tokens per step (those prompts' own context is half their length on average)."""
    positive(tp=tp, concurrency=concurrency, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
              step_tokens=step_tokens)
    link_name = tp_link_name(link_name, gpu)
    spec, tp_link = model_spec(model, dtype, kv_dtype), tp_link_of(link_name, gpu, tp)
    per_step = min(concurrency * prompt_tokens / output_tokens, max(step_tokens - concurrency, 0))
    context = prompt_tokens + output_tokens // 2
    chunks = ((round(per_step), prompt_tokens // 2),) if per_step >= 1 else ()
    ms = costmodel.forward_ms(spec, catalog.gpu(gpu), tp, tp_link, chunks, concurrency, concurrency * context)
    return {"what": "decode", "model": model, "gpu": gpu, "tp": tp, "concurrency": concurrency,
            "prompt_tokens": prompt_tokens, "output_tokens": output_tokens, "batch": concurrency, "context": context,
            "prefill_tokens_per_step": per_step, **_echo(spec, gpu), "link": link_view(link_name, tp_link),
            "fits": _fits(spec, gpu, tp), "ms": ms}


GPUS_PER_NODE = 8
"""A network collective over more GPUs than this spans nodes of this many, one NIC per GPU (HGX)."""


def fabric(link_name: str, gpu: str | None, gpus: int) -> tuple[float, str]:
    """Each GPU's line rate (GB/s per direction) over `--link` inside a node: the GPU's own NVLink
    (its lanes x the generation's rate, topology/data/gpus.yaml) for nvswitch/nvlink, one
    Infinity Fabric link per peer for xgmi (a full mesh: a ring uses one, more GPUs more), or the
    kind's default; and where it came from."""
    default = DEFAULTS[LINKS[link_name]].bandwidth_gb_s
    if gpu is None or link_name not in ("nvswitch", "nvlink", "xgmi"):
        return default, "topology.kinds default"
    facts = gpu_facts(gpu)
    if link_name == "xgmi" or facts.fabric == "xgmi":
        lanes = facts.nvlink_lanes or 1
        return facts.link_gb_s(LinkKind.XGMI) * min(max(gpus - 1, 1), lanes), f"{gpu}: xGMI link per peer"
    if not facts.nvlink_lanes:
        return default, f"{gpu} has no NVLink: topology.kinds default"
    rate = default_bandwidth_gb_s(LinkKind.NVLINK, facts.nvlink_lanes, facts.nvlink_generation)
    return rate, f"{gpu}: {facts.nvlink_lanes} NVLink-{facts.nvlink_generation} lanes"


def collective(op: str, size_bytes: int, gpus: int, link_name: str, gpu: str | None = None,
               gbps: float | None = None, gpus_per_node: int | None = None, nvls: bool = True,
               algorithm: str | None = None) -> dict[str, Any]:
    """One collective of `size_bytes` per GPU (as nccl-tests counts its size) over `gpus` GPUs
    (`physics.collectives`: the algorithm and protocol NCCL would pick). Over rdma/tcp the GPUs sit
    on `gpus_per_node`-GPU nodes (default: 8 when there are more than 8, else one per node), one
    NIC of `--gbps` (default: the kind's) per GPU; inside each node, the GPU's NVLink. `nvls`
    False: as with NCCL_NVLS_ENABLE=0. `algorithm`: as NCCL_ALGO (ring, tree, nvls; None: the
    cheapest)."""
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r} (known: {', '.join(OPS)})")
    positive(bytes=size_bytes, gpus=gpus)
    efa = link_name in collectives.EFA_NETWORKS  # RDMA over AWS EFA, through AWS's NCCL plugin
    link_name = "rdma" if efa else link_name
    if gbps is not None and link_name not in NETWORK:
        raise ValueError(f"--gbps is a network rate: it goes with --link rdma, efa or tcp, not {link_name}")
    if link_name not in LINKS:
        raise ValueError(f"unknown link {link_name!r} (known: {', '.join(LINKS)}, efa)")
    spec = catalog.gpu(gpu) if gpu is not None else None
    if link_name in NETWORK:
        per_node = gpus_per_node or (GPUS_PER_NODE if gpus > GPUS_PER_NODE else 1)
        positive(gpus_per_node=per_node)
        nodes = max(1, -(-gpus // per_node))
        nic = link(link_name, gbps)
        nic = replace(nic, latency_us=collectives.EFA_STEP_LATENCY_US) if efa else nic
        line, source = fabric("nvswitch", gpu, per_node) if spec is not None else (
            DEFAULTS[LinkKind.NVSWITCH].bandwidth_gb_s, "topology.kinds default")
        us = collectives.collective_us(op, size_bytes, gpus, line, "net", nodes=nodes,
                                       node_gb_s=nic.bandwidth_gb_s * min(per_node, gpus),
                                       net_latency_us=nic.latency_us,
                                       library=spec.collectives if spec is not None else "nccl",
                                       algorithm=algorithm, efa=efa)
        view = {**link_view("efa" if efa else link_name, nic), "nodes": nodes, "gpus_per_node": per_node,
                "nic_gb_s": nic.bandwidth_gb_s,
                "intra_node_gb_s": line, "intra_node_source": source}
    else:
        line, source = fabric(link_name, gpu, gpus)
        kind = LINKS[link_name]
        hw: Hw = "nvlink" if kind.is_gpu_fabric else "pci"
        part_nvls = spec.nvls_efficiency if spec is not None else collectives.NVLS_HOPPER
        us = collectives.collective_us(op, size_bytes, gpus, line, hw,
                                       nvls=nvls and kind is LinkKind.NVSWITCH and spec is not None and spec.nvls,
                                       algorithm=algorithm, nvls_efficiency=part_nvls,
                                       library=spec.collectives if spec is not None else "nccl")
        view = {"name": link_name, "bandwidth_gb_s": line, "latency_us": DEFAULTS[kind].latency_us, "source": source}
    return {"what": "collective", "op": op, "bytes": size_bytes, "gpus": gpus, "gpu": gpu, "gbps": gbps,
            "nvls": nvls, "algorithm": algorithm, "link": view, "us": us}


def _kv_paths(link_name: str, gbps: float | None, n: int, carriers: int | None = None
              ) -> tuple[costmodel.LinkCost, list[Path]]:
    """`n` KV paths of kind `link_name` (nvlink: the NVSwitch default) over `carriers` links or
    NICs, rank i on carrier i mod carriers (None: each path its own)."""
    kind = LinkKind.NVSWITCH if link_name == "nvlink" else LINKS[link_name]
    cost = link("nvswitch" if link_name == "nvlink" else link_name, gbps)
    shared = n if carriers is None else max(1, min(carriers, n))
    return cost, [Path(kind=kind, tier=KV_LINKS[link_name], bandwidth_gb_s=cost.bandwidth_gb_s,
                       latency_us=cost.latency_us, via=f"{link_name} link {rank % shared}") for rank in range(n)]


def kv(model: str, tokens: int, link_name: str, gbps: float | None = None, tp: int = 1,
       nics: int | None = None) -> dict[str, Any]:
    """Moving the KV cache of `tokens` tokens of `model` between two replicas: each of `tp` rank
    pairs moves its shard at once over its own link (`kvtransfer.kv_handover_ms`; on a network,
    its own NIC of `--gbps`, or one of `nics` the node's ranks share)."""
    positive(tokens=tokens, tp=tp)
    if nics is not None:
        positive(nics=nics)
    if link_name not in KV_LINKS:
        raise ValueError(f"--link for a KV transfer is nvlink, pcie, rdma or tcp, not {link_name!r}")
    if gbps is not None and link_name not in NETWORK:
        raise ValueError(f"--gbps is a network rate: it goes with --link rdma or tcp, not {link_name}")
    spec = catalog.model(model)
    cost, paths = _kv_paths(link_name, gbps, tp, nics if link_name in NETWORK else None)
    ms = kvtransfer.kv_handover_ms(spec, tokens, paths)
    carriers = len({p.via for p in paths})
    return {"what": "kv", "model": model, "tokens": tokens, "tp": tp, "gbps": gbps, "nics": carriers,
            "kv_bytes": kvtransfer.kv_bytes(spec, tokens), "link": link_view(link_name, cost),
            "achieved_gb_s": kvtransfer.kv_rate_gb_s(paths[0]) * carriers, "setup_ms": kvtransfer.kv_setup_ms(paths[0]),
            "ms": ms}


def kv_payload_gb_s(size_bytes: float, link_name: str, gbps: float | None, rails: int, memory: str = "gpu",
                    requests: float = 1.0, transport: str = "rdma") -> float:
    """The rate (GB/s) at which a payload of `size_bytes` moves between two hosts over `rails`
    links of this kind at once (a transfer engine's own benchmark: one payload, every NIC), from
    and to GPU memory, or (`memory` "dram") host DRAM, whose bandwidth bounds it
    (`kvtransfer.KV_HOST_DRAM_GB_S`). `requests`: the transfer requests the payload is posted as
    (a benchmark's blocks in flight, posted as a batch), spread over the NICs; each costs its NIC
    `kvtransfer.KV_BLOCK_POST_US`, hidden behind the wire while the NIC has bytes to send (many
    requests in flight), the bound when the blocks are small; over `transport` "efa" a request
    costs `kvtransfer.KV_EFA_OP_US` instead (`kvtransfer.kv_request_us`)."""
    if memory not in ("gpu", "dram"):
        raise ValueError(f"memory {memory!r}: gpu or dram")
    _, paths = _kv_paths(link_name, gbps, rails)
    ms_per_byte, setup_ms = kvtransfer.kv_handover_rate(paths)
    if memory == "dram":
        ms_per_byte = max(ms_per_byte, 1e3 / (kvtransfer.KV_HOST_DRAM_GB_S * 1e9))
    per_request_us = kvtransfer.kv_request_us(transport, batched=True)
    posting_ms = requests / max(rails, 1) * per_request_us * 1e-3 if link_name in NETWORK else 0.0
    return size_bytes / ((max(size_bytes * ms_per_byte, posting_ms) + setup_ms) * 1e-3) / 1e9
