"""The isleserve plugin that vLLM loads in every one of its processes (entry point `isleserve` in
the `vllm.general_plugins` group; `make vllm-env` and `isle vllm-plugin` install it into a vLLM
environment). With `ISLE_EXPERT_SPEC` set by the launcher (`pools.experts.engine.ExpertSpec`):

- `policy`: vLLM's EPLB policy `default` becomes isleserve's topology policy, which computes the
  physical-to-logical map from the gang's real NVLink domains (not vLLM's host count), with the
  predicted MoE step as objective and vLLM's own map as the rival it returns when that is at
  least as fast; each load window it is handed is written to `ISLE_EXPERT_LOAD_DIR`;
- `locality`: each rank's replica lists keep to its own domain (vLLM's MoE router then picks a
  copy of an expert inside the token's domain when there is one).

Without the variable the plugin changes nothing. Imported only inside vLLM's environment (torch
and vllm); the decisions are `pools.experts.engine`'s, pure.
"""
