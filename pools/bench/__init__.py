"""`python -m pools bench [placement|engine]`: the pools layer's benchmarks. `placement` plans
and re-plans a 1,024-node cluster and prints wall times; `engine` runs the simulated engine on
the wall clock (TP, PD, 200 streams) and prints its CPU per token. Imports `pools` (engine,
placement) and `topology`."""
