"""The data plane: the router's asyncio HTTP server (`server`) that authenticates (`auth`), admits
by SLO class (`admission`), routes by pure decisions (`decision`, composed of the filters,
scorers and pickers in `plugins`), orchestrates prefill/decode (`pd`), relays to engines
(`relay`, `upstream`, `flight`) and records metrics per topology tier (`metrics`); its config
(`config`, `appconfig`), the Ray Serve application (`serve`), the standalone CLI and worker
processes, and its benchmark (`bench`). Imports `pools` and `topology`, never `loadtest`."""

import pools  # noqa: F401  (pools decides first whether the request path runs compiled)
