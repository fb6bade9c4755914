"""The controller's logic with real engine processes and no Ray: plan, start, table, restart."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from pools.controller.controller import ControllerCore, ControllerSpec
from pools.controller.replica import ReplicaProcess
from pools.model import PoolSpec
from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def test_deploy_publish_and_restart_a_dead_engine(tmp_path: Path) -> None:
    spec = ControllerSpec(topology_source=str(ROOT / "configs/clusters/local-sim.yaml"), engine="sim",
                          policy="island-aligned", time_scale=0.05, state_dir=str(tmp_path),
                          pools=(PoolSpec(name="mixed", role="mixed", tp=2, replicas=2, model="llama-3.1-8b"),))
    core = ControllerCore(spec, ReplicaProcess)
    try:
        table = core.deploy()
        assert table.version == 1 and {r.replica_id for r in table.replicas} == {"mixed-0", "mixed-1"}
        for r in table.replicas:
            assert r.gpu_model == "h100-sxm" and r.tier == "nvlink" and len(r.gpus) == 2
            assert urllib.request.urlopen(f"{r.url}/health", timeout=5).status == 200
        victim = core.replicas["mixed-0"]
        assert isinstance(victim, ReplicaProcess) and victim.proc is not None
        victim.proc.kill()
        victim.proc.wait(5)
        table = core.check()
        assert table.version == 2 and victim.restarts == 1
        url = next(r.url for r in table.replicas if r.replica_id == "mixed-0")
        assert urllib.request.urlopen(f"{url}/health", timeout=5).status == 200
        events = [json.loads(line)["kind"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert events[:2] == ["topology", "plan"] and "restart" in events
    finally:
        procs = [r.proc for r in core.replicas.values() if isinstance(r, ReplicaProcess)]
        core.shutdown()
    assert all(p is not None and p.poll() is not None for p in procs)  # every engine stopped


def test_vllm_engine_is_refused_clearly() -> None:
    spec = ControllerSpec(topology_source="nvml", engine="vllm", policy="island-aligned", pools=())
    with pytest.raises(ValueError, match="vLLM replicas come with the vLLM launcher"):
        ControllerCore(spec, ReplicaProcess)
