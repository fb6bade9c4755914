"""What a replica runs: the simulated engine's process or a real vLLM server (one per rank of a gang)."""
