"""KV cache blocks as prefix caches see them (pure: no I/O).

    keys     a prompt's full blocks as chained keys (each block's key covers every token before
             it, the adapter too), `block_keys`
    events   what an engine says of its cache, in vLLM's KV-event vocabulary: `BlockStored`,
             `BlockRemoved`, `AllBlocksCleared`, in an `EventBatch`
    index    which replica holds which blocks, kept from those events (`BlockIndex`): the
             leading blocks of a prompt each replica holds

The simulated engine keeps its prefix cache in these keys and publishes these events; the
router indexes them (vLLM's own events carry its block hashes and each block's tokens, and the
index keys them again with `block_keys`, so any hash vLLM is configured with maps onto one key).
The wire format and transport are `wire.kvevents`.
"""
