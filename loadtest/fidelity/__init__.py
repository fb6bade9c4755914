"""The cost model held against published measurements: each point with its source (`report`,
`python -m pools fidelity`) and published benchmarks replayed through the simulated engine
(`replay`)."""
