"""The offline simulator: a discrete-event run of a whole deployment on a virtual clock (`cluster`),
with the product's own placement policies, router decisions and engine batching core; its inputs
and outputs (`model`), KV transfers with contention over the topology (`network`), one simulated
replica (`replica`), `python -m loadtest sim` (`cli`) and its speed benchmark (`bench`). Imports
the loadtest core (`model`, `scenario`, `workload`, `summary`, `compare`), `router`, `pools` and
`topology`; never `loadtest.live` or `loadtest.chaos`."""
