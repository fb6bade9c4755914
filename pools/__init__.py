"""What runs where: pool specs and SLO classes (`model`, `config`), the cost model, sizing,
placement policies (`placement`), the routing table the controller publishes (`routing`), the
simulated engine (`engine`), the HTTP/OpenAI wire both engines and the router speak (`wire`),
vLLM launchers (`vllm`), the Ray controller and replica actors (`controller`), the supervisor
every child process goes through (`supervisor`) and the layer's benchmarks (`bench`). Imports
`topology` only, never `router` or `loadtest`."""

from pools.native import ensure as _ensure_native

_ensure_native()  # before any compiled module of the request path is imported
