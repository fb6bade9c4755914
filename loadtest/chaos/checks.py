"""What each fault must show, read off the classified requests and the fault's own record (pure),
and the run's verdict: one named check per behaviour the chaos run exists to prove.

    replica_crash   the requests it had not started streaming went elsewhere: no 5xx before the
                    first token; a stream it had started ends with an OpenAI error event
    link_degrade    interactive p99 TTFT back within its target once the replica is drained
    node_loss       its replicas re-placed; the router's table never offers it again once it
                    marked it gone; no token from it after it died
    overload        429 + Retry-After to sheddable classes first; interactive attainment holds
    kv_*            the pair flagged and avoided, interactive TTFT p99 back (`loadtest.chaos.kvreport`)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from loadtest.chaos.driver import ChaosRecord
from loadtest.chaos.kvreport import KV_KINDS, kv_checks
from loadtest.chaos.report import COMPLETED, ERRORED, Verdict, window
from pools.model import SLOClass

INTERACTIVE = "interactive"
HOLDS = 0.9
"""Interactive SLO attainment that counts as holding (under a 3x burst, for instance)."""
MEMORY_SLACK_MB = 64.0
"""Router RSS after the load may exceed its early peak by this much and still count as bounded."""


def _between(pairs: Sequence[tuple[ChaosRecord, Verdict]], start_s: float, end_s: float
             ) -> list[tuple[ChaosRecord, Verdict]]:
    return [(r, v) for r, v in pairs if start_s <= r.sent_s < end_s]


def crash_details(pairs: Sequence[tuple[ChaosRecord, Verdict]], fault: Mapping[str, Any], window_s: float
                  ) -> dict[str, Any]:
    """Requests around the crash: which ended in errors, and whether any failed before its first token."""
    at = float(fault["at_s"])
    end = float(fault.get("recovered_s") or at) + window_s
    near = _between(pairs, at - 120.0, end)  # sent before the crash too: they were in flight
    victim = fault.get("replica", "")
    stream_errors = [(r, v) for r, v in near if v.bucket == ERRORED and v.cause.startswith("stream")
                     and r.replica == victim]
    early = [(r, v) for r, v in near if v.bucket == ERRORED and v.cause.startswith("http 5") and v.tokens == 0
             and r.end_s is not None and r.end_s >= at]
    return {"stream_errors": len(stream_errors),
            "stream_errors_without_tokens": sum(1 for _, v in stream_errors if v.tokens == 0),
            "failed_before_first_token": len(early),
            "served_by_others_while_down": sum(1 for r, v in _between(pairs, at, float(fault.get("recovered_s")
                                                                                         or at))
                                               if v.bucket == COMPLETED and r.replica != victim)}


def node_loss_details(pairs: Sequence[tuple[ChaosRecord, Verdict]], fault: Mapping[str, Any],
                      table_changes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Whether the router's table offered the lost node after marking it, whether any token came
    from it after it died (before that replica's replacement served: a replica keeps its id when
    it moves, so each victim is judged up to its own replacement), and what the replacements
    served."""
    victims, node = set(fault.get("replicas", [])), fault.get("node")
    at, detected = float(fault["at_s"]), fault.get("detected_s")
    fallback = fault.get("controller_replaced_s") or fault.get("recovered_s")
    own = fault.get("replaced_s_by_replica") or {}
    replaced_at = {v: own.get(v, fallback) for v in victims}
    offered = [c["at_s"] for c in table_changes if detected is not None and c["at_s"] >= detected
               and any(r["node"] == node and r["healthy"] and not r["draining"] for r in c["replicas"].values())]

    def first_at(r: ChaosRecord) -> float | None:
        return None if r.first_token_s is None else r.sent_s + r.first_token_s

    from_dead = [r for r, _ in pairs if r.replica in victims and (t := first_at(r)) is not None
                 and at + 1.0 <= t and ((done := replaced_at[r.replica]) is None or t < done)]
    by_replacement = [r for r, v in pairs if r.replica in victims and (done := replaced_at[r.replica]) is not None
                      and v.bucket == COMPLETED and (t := first_at(r)) is not None and t >= done]
    return {"table_offers_lost_node_after_detection": len(offered), "first_tokens_from_lost_node_after_kill":
            len(from_dead), "served_by_replacements": len(by_replacement)}


def overload_details(pairs: Sequence[tuple[ChaosRecord, Verdict]], fault: Mapping[str, Any],
                     classes: Mapping[str, SLOClass], time_scale: float) -> dict[str, Any]:
    at, end = float(fault["at_s"]), float(fault.get("recovered_s") or fault["at_s"])
    burst = _between(pairs, at, end)
    return {"sent_by_class": dict(sorted(Counter(r.slo_class for r, _ in burst).items())),
            "shed_by_class": dict(sorted(Counter(r.slo_class for r, _ in burst if r.status == 429).items())),
            "slo_attainment": {name: window(pairs, at, end, name, classes, time_scale)["slo_attainment"]
                               for name in sorted(classes)}}


def checks(report: Mapping[str, Any], classes: Mapping[str, SLOClass]) -> dict[str, bool]:
    """Each behaviour as one boolean (all true: the run passed)."""
    out = {"lost_is_zero": report["lost"] == 0, "hung_is_zero": report["hung"] == 0,
           "duplicated_tokens_is_zero": report["duplicated_tokens"] == 0,
           "every_request_completed_or_errored_cleanly": report["completed"] + report["errored"] == report["sent"]}
    target = classes[INTERACTIVE].ttft_ms if INTERACTIVE in classes else None
    for f in report["faults"]:
        kind, ok = f["kind"], f.get("recovered_s") is not None and not f.get("error")
        if kind == "replica_crash":
            d = f["details"]
            ok = ok and d["failed_before_first_token"] == 0 and d["stream_errors_without_tokens"] == 0
            out["crash_unstarted_requests_retried_elsewhere"] = ok
        elif kind == "link_degrade":
            after = f["interactive"].get("after", {})
            p99 = after.get("ttft_p99_ms")
            out["link_degrade_interactive_ttft_recovers_after_drain"] = bool(
                ok and p99 is not None and target is not None and p99 <= target)
        elif kind == "node_loss":
            d = f["details"]
            out["node_loss_replicas_replaced_and_not_routed_there"] = bool(
                ok and d["table_offers_lost_node_after_detection"] == 0 and not f.get("lost_node_in_table_after")
                and d["first_tokens_from_lost_node_after_kill"] == 0)
        elif kind == "overload":
            shed, d = report["shedding"], f["details"]
            sheddable = set(shed["sheddable_classes"])
            first = [x["slo_class"] for x in shed["first"]]
            attainment = d["slo_attainment"].get(INTERACTIVE)
            out["overload_sheds_sheddable_first_with_retry_after"] = bool(
                first and first[0] in sheddable and shed["without_retry_after"] == 0
                and not d["shed_by_class"].get(INTERACTIVE))
            out["overload_interactive_attainment_holds"] = bool(ok and attainment is not None and attainment >= HOLDS)
        elif kind in KV_KINDS:
            out.update(kv_checks(f))
    mem = report["router_memory"]
    out["router_memory_bounded"] = bool(mem.get("samples") and mem["after_load_mb"] <= mem["early_max_mb"] * 1.5
                                        + MEMORY_SLACK_MB)
    return out
