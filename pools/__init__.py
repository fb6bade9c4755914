"""What runs where, decided purely: pool and replica specs, SLO classes, placements and plans
(`model`), the routing table the controller publishes (`routing`), POOLS.yaml (`config`,
`vllmconfig`, `ports`), placement policies with re-plans and rollouts (`placement`), a placed
gang's links (`ganglinks`), expert placement (`experts`, `expertmap`), pool sizing (`sizing`),
the autoscaling policy with its typed load report (`autoscale`), pinning and Ray node labels
(`pinning`, `nodelabels`), and the `plan`/`size`/`experts` commands (`cli`). Imports `physics`
and `topology`; no I/O module (no Ray, sockets, threads, processes or event loops)."""
