"""Benchmarks replayed through the simulated engine (`simengine.core`, virtual time) and scored
as their authors score them: what `loadtest.fidelity.report` prices calibration points with that no single
step time answers.

- `sharegpt`: DistServe's vLLM-baseline chatbot benchmark (OPT-13B, ShareGPT, one A100-SXM-80GB):
  its 100 requests, Figure 8's arrivals, DistServe's own measured runs
  (physics/data/distserve_opt13b_sharegpt.yaml) and its scoring (TTFT and TPOT SLO attainment);
- `overheads`: the measured engine's fixed costs per step (vLLM 0.1.7 driven through Ray,
  `vllm017_ray`), derived from DistServe's rate-1 measured run alone (`derive_step_overheads`);
- `distserve`: the engine as DistServe ran its vLLM baseline (`distserve_config`), the replay in
  virtual time (`run`, `replay`, `predicted_attainment`) and its alignment with a measured run
  (`alignment`); nothing is tuned to the published curve;
- `closedloop`: a closed-loop benchmark (`closed_loop`: C clients sending I-in / O-out requests
  back to back, the mean ITL a client such as AIPerf reports), for loaded-system decode points, on
  an engine as TensorRT-LLM's defaults set it (`trtllm_config`, `closed_loop_itl_ms`).

"""
