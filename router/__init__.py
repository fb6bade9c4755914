"""The data plane: the router's asyncio HTTP server (`server`) that authenticates (`auth`, `keys`),
admits by SLO class and fair shares (`admission`, `quota`, `cost`, `fairness`), routes by pure
decisions (`decision`, composed of the filters, scorers and pickers in `plugins`), orchestrates
prefill/decode (`pd`), relays to engines (`relay`, `upstream`, `flight`) and records metrics per
topology tier (`metrics`); its config (`config`), its workers (`workers`, `worker`), the
standalone CLI (`cli`) and its benchmark (`bench`). Imports `pools`, `physics`, `wire` and
`topology`; never the control plane, the engine or `loadtest`."""

import wire  # noqa: F401  (wire decides first whether the request path runs compiled)
