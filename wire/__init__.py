"""How processes talk and are kept, for the router, the engines and the controller alike: the lean
HTTP/1.1 server on asyncio + httptools (`http`, with `reader`, `responder`, `limits`,
`deadline`), the one HTTP client off the router's request path (`client`), server-sent events
(`sse`), Prometheus text (`promtext`), the OpenAI API's shared part as vLLM speaks it (`openai`,
`errors`, `prompt`, `fields`, `text`, and the pydantic models of `protocol`), running a server
until a signal (`lifecycle`), and supervised child processes (`supervisor`, `processes`).
The bottom layer beside `topology`: imports nothing of ours. The request path here is compiled
by mypyc (`native`: decided once per process, here, before any compiled module loads)."""

from wire.native import ensure as _ensure_native

_ensure_native()  # before any compiled module of the request path is imported
