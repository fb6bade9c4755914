"""The entry point vLLM calls in each of its processes (`register`), before any model or EPLB
state exists. vLLM may call it more than once per process: it acts once."""

from __future__ import annotations

import os

from pools.experts.engine import ENV, spec_from_env
from vllmplugin.log import logger

_registered: list[str] = []


def register() -> None:
    """Install the topology policy (and domain-local replica choice) when the launcher set
    `ISLE_EXPERT_SPEC`; a spec that does not parse stops vLLM with the reason."""
    if _registered:
        return
    spec = spec_from_env(os.environ)
    if spec is None:
        _registered.append("none")
        logger.debug("no %s, vLLM's own EPLB policy stays", ENV)
        return
    from vllm.distributed.eplb import policy as policies

    from vllmplugin.locality import install
    from vllmplugin.policy import TopologyEplbPolicy

    TopologyEplbPolicy.spec = spec
    policies.EPLB_POLICIES["default"] = TopologyEplbPolicy
    if spec.locality:
        install(spec)
    _registered.append("topology")
    domains = list(dict.fromkeys(spec.domains))
    logger.info("EPLB policy 'default' is isleserve's topology policy: %d EP ranks over "
                "%d NVLink domains %s, model %s, gpu %s, %s, domain-local replica choice %s", spec.ranks,
                len(domains), domains, spec.model, spec.gpu, spec.phase, "on" if spec.locality else "off")
