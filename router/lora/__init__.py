"""LoRA adapters on the router: which replica serves an adapter's requests, and loading and
unloading adapters on engines (vLLM's /v1/load_lora_adapter, /v1/unload_lora_adapter).

    config      the router config's `lora:` block (pydantic, extra="forbid")
    placement   the pure decision: affinity, load where there is room, unload the coldest
    manager     the I/O: the engines' load and unload calls, one load per adapter at a time,
                discovery from the engines' /v1/models, the admin routes, metrics
"""
