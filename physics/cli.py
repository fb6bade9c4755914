"""The `cost` subcommand of `python -m pools` (the answers: `physics.queries`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

_WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "fp4", "nvfp4", "mxfp4", "int4")
"""`--dtype` choices (physics.catalog.WEIGHT_DTYPES; listed here so that the parser loads no data)."""
_DISPATCH_DTYPES = ("bf16", "fp8", "mxfp8", "nvfp4", "mxfp4")
"""`--dispatch-dtype` choices (physics.alltoall.DISPATCH_BYTES; listed here for the same reason)."""


def _word(text: str) -> str:
    """A choice as people write it: any case ("NVLink", "BF16")."""
    return text.strip().lower()


def _name(text: str) -> str:
    """A hyphenated name in any case, with underscores for hyphens ("DeepEP_LL" is deepep-ll)."""
    return _word(text).replace("_", "-")


def _op(text: str) -> str:
    """A collective as NCCL and nccl-tests name it too: "all_reduce", "all-reduce", "AllReduce"."""
    return _word(text).replace("_", "").replace("-", "")


def _weights(text: str) -> str:
    """A weight format in vLLM's and PyTorch's words too (`--dtype float16`, `bfloat16`, `half`)."""
    word = _word(text)
    return {"float16": "fp16", "half": "fp16", "bfloat16": "bf16"}.get(word, word)


def _kv_dtype(text: str) -> str:
    """A KV-cache format in vLLM's words too (`--kv-cache-dtype`): fp8_e4m3 and fp8_e5m2 are FP8;
    auto (the activations' format) and fp16 are priced as BF16 (two bytes)."""
    word = _word(text).replace("-", "_")
    return "fp8" if word.startswith("fp8") else "bf16" if word in ("auto", "fp16", "float16", "bfloat16") else word


def cmd_cost(args: argparse.Namespace) -> int:
    from physics import catalog
    from physics import gangqueries as gangs
    from physics import queries as cost

    # the answer names the catalogue's parts, however the command line wrote them ("H100" is h100-sxm)
    if getattr(args, "gpu", None):
        args.gpu = catalog.gpu_name(args.gpu)
    if getattr(args, "model", None):
        args.model = catalog.model_name(args.model)
    if args.what == "prefill":
        out = cost.prefill(args.model, args.gpu, args.tp, args.tokens, args.context, args.dtype, args.link,
                           kv_dtype=args.kv_dtype)
    elif args.what == "decode":
        out = _decode(cost, args)
    elif args.what == "collective":
        out = cost.collective(args.op, args.bytes, args.gpus, args.link, args.gpu, args.gbps, args.gpus_per_node,
                              nvls=not args.no_nvls, algorithm=args.algorithm)
    elif args.what == "kv":
        out = cost.kv(args.model, args.tokens, args.link, args.gbps, args.tp, args.nics)
    elif args.what == "moe":
        out = gangs.moe(args.model, args.gpu, args.tp, args.dp, args.phase, args.link, tokens=args.tokens or 0,
                       prompts=args.prompts, batch=args.batch or 0, context=args.context, domain_gpus=args.domain_gpus,
                       gbps=args.gbps, imbalance=args.imbalance, overlap=args.overlap, expert_parallel=not args.no_ep,
                       dtype=args.dtype, a2a=args.a2a, sms=args.sms, draft_tokens=args.draft_tokens,
                       acceptance_rate=args.acceptance_rate, acceptance_length=args.acceptance_length,
                       kv_dtype=args.kv_dtype, dispatch_dtype=args.dispatch_dtype)
    else:
        out = gangs.pp(args.model, args.gpu, args.tp, args.pp, args.phase, args.boundary.split(","),
                      tokens=args.tokens or 0, batch=args.batch or 0, context=args.context, gbps=args.gbps,
                      dtype=args.dtype, link_name=args.link, chunk=args.chunk)
    if args.format == "json":
        print(json.dumps(out))
    else:
        value = f"{out['us']:.2f} us" if "us" in out else f"{out['ms']:.3f} ms"
        print(f"{args.what}: {value}  ({', '.join(f'{k}={v}' for k, v in out.items() if k not in ('ms', 'us'))})")
    return 0


def _decode(cost: Any, args: argparse.Namespace) -> dict[str, Any]:
    load = (args.concurrency, args.prompt_tokens, args.output_tokens)
    if any(v is not None for v in load):
        if None in load or args.batch is not None or args.draft_tokens:
            raise SystemExit("cost decode under load: give --concurrency, --prompt-tokens and --output-tokens "
                             "(not --batch, --context or --draft-tokens)")
        result: dict[str, Any] = cost.loaded_decode(args.model, args.gpu, args.tp, args.concurrency,
                                                    args.prompt_tokens, args.output_tokens, args.dtype, args.link,
                                                    kv_dtype=args.kv_dtype)
        return result
    if args.batch is None or args.context is None:
        raise SystemExit("cost decode: give --batch and --context (or --concurrency, --prompt-tokens and "
                         "--output-tokens for the ITL under load)")
    result = cost.decode(args.model, args.gpu, args.tp, args.batch, args.context, args.dtype, args.link,
                         kv_dtype=args.kv_dtype, draft_tokens=args.draft_tokens,
                         acceptance_rate=args.acceptance_rate, acceptance_length=args.acceptance_length,
                         expert_skew=args.expert_skew)
    return result


def add_cost_parsers(sub: Any) -> None:
    """`cost`: one subcommand per kind of answer."""
    p = sub.add_parser("cost", help="what the cost model predicts (prefill, decode, collective, kv, moe, pp)")
    kinds = p.add_subparsers(dest="what", required=True)
    for what in ("prefill", "decode"):
        q = kinds.add_parser(what, help=f"one {what} " + ("of N new tokens after C cached" if what == "prefill"
                                                         else "step of B sequences with C tokens of context each"))
        q.add_argument("--model", required=True)
        q.add_argument("--gpu", required=True)
        q.add_argument("--tp", type=int, required=True)
        if what == "prefill":
            q.add_argument("--tokens", type=int, required=True)
            q.add_argument("--context", type=int, default=0)
        else:
            q.add_argument("--batch", type=int, help="sequences in the step")
            q.add_argument("--context", type=int, help="tokens of context per sequence")
            q.add_argument("--draft-tokens", type=int, default=0,
                           help="speculative decoding (MTP, EAGLE): draft tokens per step")
            q.add_argument("--acceptance-rate", type=float, help="speculative: each draft's chance to be accepted")
            q.add_argument("--acceptance-length", type=float,
                           help="speculative: mean tokens a step yields (instead of --acceptance-rate)")
            q.add_argument("--expert-skew", type=float,
                           help="MoE routing skew (Zipf exponent; 0 uniform): fewer experts read per step")
            q.add_argument("--concurrency", type=int, help="ITL under load: clients of a closed loop")
            q.add_argument("--prompt-tokens", type=int, help="ITL under load: prompt tokens per request")
            q.add_argument("--output-tokens", type=int, help="ITL under load: output tokens per request")
        q.add_argument("--dtype", type=_weights, choices=list(_WEIGHT_DTYPES),
                       help="weight format (default: the model's own): bf16, fp8, fp4/nvfp4, mxfp4, int4")
        q.add_argument("--kv-dtype", type=_kv_dtype, choices=["bf16", "fp8"], help="KV-cache format (default bf16)")
        q.add_argument("--link", default="nvswitch", help="the TP group's link kind (default nvswitch)")
    q = kinds.add_parser("collective", help="one NCCL collective; --bytes per GPU as nccl-tests counts it")
    q.add_argument("--op", required=True, type=_op, choices=["allreduce", "allgather", "reducescatter", "alltoall"])
    q.add_argument("--bytes", type=int, required=True)
    q.add_argument("--gpus", type=int, required=True)
    q.add_argument("--link", required=True, type=_word,
                   choices=["nvswitch", "nvlink", "xgmi", "pcie", "sys", "rdma", "efa", "tcp"],
                   help="efa: rdma over AWS EFA (its step latency)")
    q.add_argument("--gpu")
    q.add_argument("--gbps", type=float, help="per-GPU network rate in Gbit/s (rdma, efa, tcp)")
    q.add_argument("--gpus-per-node", type=int, help="rdma/efa/tcp: GPUs per node (default 8 when more than 8, else 1)")
    q.add_argument("--no-nvls", action="store_true", help="as NCCL_NVLS_ENABLE=0: no NVLink SHARP all-reduce")
    q.add_argument("--algorithm", type=_word, choices=["ring", "tree", "nvls"],
                   help="as NCCL_ALGO: pin the algorithm (default: the cheapest, as NCCL's tuner picks)")
    q = kinds.add_parser("kv", help="moving the KV cache of N tokens between two replicas")
    q.add_argument("--model", required=True)
    q.add_argument("--tokens", type=int, required=True)
    q.add_argument("--link", required=True, type=_word, choices=["nvlink", "pcie", "rdma", "tcp"])
    q.add_argument("--gbps", type=float, help="the NIC rate in Gbit/s (rdma, tcp)")
    q.add_argument("--tp", type=int, default=1, help="rank pairs moving their shards at once, each over its own link")
    q.add_argument("--nics", type=int, help="rdma/tcp: NICs per node the pairs share (default: one per pair)")
    _gang_parsers(kinds)
    for q in (kinds.choices[name] for name in ("prefill", "decode", "collective", "kv", "moe", "pp")):
        q.add_argument("--format", choices=["json", "text"], default="text")
    p.set_defaults(func=cmd_cost)


def _gang_parsers(kinds: Any) -> None:
    q = kinds.add_parser("moe", help="one step of an MoE gang: DP attention ranks + expert parallelism")
    q.add_argument("--model", required=True, help="a catalogue MoE model")
    q.add_argument("--gpu", required=True)
    q.add_argument("--tp", type=int, default=1, help="TP size of each DP rank (default 1)")
    q.add_argument("--dp", type=int, required=True, help="data-parallel ranks (EP size = tp x dp)")
    q.add_argument("--phase", required=True, type=_word, choices=["prefill", "decode"])
    q.add_argument("--tokens", type=int, help="prefill: new prompt tokens per DP rank")
    q.add_argument("--prompts", type=int, default=1, help="prefill: prompts those tokens come from (default 1)")
    q.add_argument("--batch", type=int, help="decode: sequences per DP rank")
    q.add_argument("--context", type=int, default=0, help="cached tokens per sequence")
    q.add_argument("--link", required=True, type=_word, choices=["nvlink", "xgmi", "rdma", "efa", "cross-rail", "tcp"],
                   help="nvlink: one NVLink domain; rdma: rail-aligned NICs; efa: the same over AWS EFA; "
                        "cross-rail: via the spine; tcp")
    q.add_argument("--domain-gpus", type=int, help="GPUs of the gang per NVLink domain across a network (default 8)")
    q.add_argument("--gbps", type=float, help="per-GPU NIC rate in Gbit/s (rdma, efa, cross-rail, tcp)")
    q.add_argument("--imbalance", type=float, help="busiest over mean GPU expert load (default: uniform routing's)")
    q.add_argument("--overlap", action="store_true", help="two-batch overlap: compute hides the all-to-all")
    q.add_argument("--no-ep", action="store_true", help="experts split by TP inside each rank (no all-to-all)")
    q.add_argument("--a2a", type=_name,
                   help="the all-to-all kernel (any case; _ for -): deepep-normal, deepep-ll, pplx, nccl, "
                        "uccl-ep-normal, uccl-ep-ll, hybrid-ep, deepep-v2, mori-ep, mori-ep-ll, pplx-garden, "
                        "trtllm-nvlink-one-sided (default: deepep-normal at prefill, deepep-ll at decode)")
    q.add_argument("--sms", type=int, default=0, help="SMs the all-to-all kernel runs on (default 0: unbounded)")
    q.add_argument("--dispatch-dtype", type=_word, choices=list(_DISPATCH_DTYPES),
                   help="the format the all-to-all sends, scales included (default: DeepEP's, fp8 for "
                        "low-precision weights, bf16 for bf16 ones; DeepEP sends only those two, TensorRT-LLM's "
                        "trtllm-nvlink-one-sided also nvfp4 and mxfp8); the combine is bf16")
    q.add_argument("--dtype", type=_weights, choices=list(_WEIGHT_DTYPES),
                   help="weight format (default: the model's own): bf16, fp8, fp4/nvfp4, mxfp4, int4")
    q.add_argument("--kv-dtype", type=_kv_dtype, choices=["bf16", "fp8"],
                   help="KV-cache format (default bf16; fp8: MLA decode reads half the cache at the FP8 rate)")
    q.add_argument("--draft-tokens", type=int, default=0, help="decode with MTP: draft tokens per step")
    q.add_argument("--acceptance-rate", type=float, help="MTP: each draft's chance to be accepted")
    q.add_argument("--acceptance-length", type=float,
                   help="MTP: mean tokens a step yields (instead of --acceptance-rate)")
    q = kinds.add_parser("pp", help="a prefill or decode cycle over pipeline stages")
    q.add_argument("--model", required=True)
    q.add_argument("--gpu", required=True)
    q.add_argument("--tp", type=int, default=1)
    q.add_argument("--pp", type=int, required=True, help="pipeline stages")
    q.add_argument("--phase", required=True, type=_word, choices=["prefill", "decode"])
    q.add_argument("--tokens", type=int, help="prefill: prompt tokens")
    q.add_argument("--chunk", type=int, default=8192,
                   help="prefill: chunk streamed through the stages (default 8192; 0: the prompt in one pass)")
    q.add_argument("--batch", type=int, help="decode: sequences in flight")
    q.add_argument("--context", type=int, default=0, help="decode: tokens of context per sequence")
    q.add_argument("--boundary", required=True,
                   help="link kind at the stage boundaries: one for all, or a comma list of pp-1 "
                        "(nvswitch, nvlink, xgmi, pcie, sys, rdma, tcp)")
    q.add_argument("--gbps", type=float, help="NIC rate in Gbit/s for rdma/tcp boundaries")
    q.add_argument("--dtype", type=_weights, choices=list(_WEIGHT_DTYPES),
                   help="weight format (default: the model's own)")
    q.add_argument("--link", default="nvswitch", help="each stage's TP group link kind (default nvswitch)")
