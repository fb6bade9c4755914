"""The product driven live on loopback: `run` (`python -m loadtest run`, a workload against a
router, summarised as `vllm bench serve` does), `compare` (each placement policy deployed for
real), `timings` (what a live run measured next to what the simulator predicts), `deploy` (the
product brought up on local Ray and taken down whatever happens), `raynode` (one more Ray node
on this machine) and `client` (the driver's streaming HTTP client). Imports the loadtest core
(model, workload, summary) and every layer below; nothing under loadtest imports it but chaos,
compare and calibrate."""
