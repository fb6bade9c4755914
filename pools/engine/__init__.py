"""The simulated engine: a real OpenAI-compatible server whose timing follows the cost model.
`core` is the pure continuous-batching scheduler; `server` is the HTTP shell around it."""
