"""The simulated vLLM engine: a real OpenAI-compatible server whose timing follows the cost model.
`core` is the pure continuous-batching scheduler (its decode fast-forward planned in
`fastforward`); `server` is the HTTP shell around it, speaking vLLM 0.32's protocol (`protocol`,
`responses`, `toolcall`, `guided`, `tokenize`, `metrics`) and its disaggregated prefill/decode
(`pd`, `claim`). Imports `pools`, `physics`, `wire` and `topology`; never the router or the
control plane (they start it as a process: `python -m simengine`)."""

import wire  # noqa: F401  (wire decides first whether the engine runs compiled)
