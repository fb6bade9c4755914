"""The simulated engine: a real OpenAI-compatible server whose timing follows the cost model.
`core` is the pure continuous-batching scheduler (its decode fast-forward planned in
`fastforward`); `server` is the HTTP shell around it. Imports `pools` (cost model, model,
catalog), `pools.wire` and `topology`; never the controller or the router."""
