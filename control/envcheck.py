"""The engine's environment against its plan, right after a start (issue 34): each mismatch
`pools.transportenv` finds is one `transport_env` event and one warning, recorded before the
replica is installed and published to the routers (`control.fleet.Fleet.started`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from control.spec import EngineLaunch
from pools.transportenv import transport_mismatches

log = logging.getLogger("isleserve.controller")


def transport_events(launch: EngineLaunch, envs: Mapping[str, Mapping[str, str]] | None) -> list[dict[str, Any]]:
    """One `transport_env` payload per mismatch, for the replica (each rank of a gang, by its own
    pin); none where its environment was not read."""
    if envs is None:
        return []
    out = []
    for one in launch.ranks or (launch,):
        actual = envs.get(one.replica_id)
        if actual is None:
            continue
        for m in transport_mismatches(one.pin.env, one.pin.rdma, actual):
            out.append({"replica_id": launch.replica_id, **({"rank": one.replica_id} if launch.ranks else {}),
                        "generation": launch.generation, "node": one.node, "gpus": list(one.gpus),
                        "rdma": one.pin.rdma, **m.to_json()})
    for e in out:
        log.warning("replica %s: engine environment %s=%s, the plan wants %s: %s", e["replica_id"], e["variable"],
                    e["actual"], e["planned"], e["why"])
    return out
