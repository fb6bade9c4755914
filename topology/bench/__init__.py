"""Tiered communication benchmarks: what to measure on a node (`plan`), the measurements with
the topology's fingerprint and their use (`record`: into the cost model's links, against a
baseline), and the torch.distributed run (`run`, `worker`; torch imported lazily). Imports
`topology` only."""
