"""The Ray control plane: a detached controller (`controller`, with its public `apply`) that turns
a plan into running replicas (`fleet`, `starts`, `launch`), keeps its state on disk (`state`),
benchmarks links (`benches`, `benching`), follows the router's load (`autoscaling`) and
publishes the routing table (`table`); replica actors (`actors`) that run an engine process
(`replicas`: the simulated engine or vLLM). Imports `pools`, `physics`, `wire` and `topology`;
never the router or the engine's code."""
