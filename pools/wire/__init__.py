"""The wire that engines and the router both speak: the lean HTTP/1.1 server on asyncio +
httptools (`http`, with `reader`, `responder`, `limits`, `deadline`), the OpenAI API's shared part
(`openai`, `errors`, `prompt`), running a server until a signal (`lifecycle`) and the one HTTP
client of everything off the router's request path (`client`, httpx underneath). Most of it
is the request path, compiled by mypyc (`pools.native`). Imports `pools.engine.text` only;
never the router."""
