"""The words of a topology drawing: NIC names and GPU lists compacted, captions of islands and of
a placement plan's replicas (the plan is the JSON `python -m pools plan` writes), notes wrapped."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from topology.model import Island, Node


def plan_groups(placement: Mapping[str, Any]) -> dict[str, list[int]]:
    """A placement's GPUs per node: its group, a gang's members (one box per node), or a group
    a baseline spread over nodes (`extra_nodes`)."""
    out: dict[str, list[int]] = {}
    members = placement.get("members") or [{"node": placement.get("node"), "gpus": placement.get("gpus", [])}]
    for m in members:
        out.setdefault(str(m.get("node")), []).extend(int(g) for g in m.get("gpus", []))
    for node, gpus in (placement.get("extra_nodes") or {}).items():
        if not placement.get("members"):
            out.setdefault(str(node), []).extend(int(g) for g in gpus)
    return out


def plan_label(placement: Mapping[str, Any]) -> str:
    label = str(placement.get("replica_id", ""))
    experts = placement.get("experts")
    if placement.get("members"):
        label += f" ({len(placement['members'])} ranks{'' if placement.get('in_domain') else ', spans domains'})"
    if experts:
        label += (f"; experts {experts.get('policy')}: balance {float(experts.get('balancedness', 0)):.2f}, "
                  f"{float(experts.get('cross_domain_share', 0)):.0%} cross")
    return label


def domain_share(placement: Mapping[str, Any], node: str) -> float | None:
    """The expert-load share of the domain a gang's node belongs to (`<node>/islandN`)."""
    loads = (placement.get("experts") or {}).get("domain_load") or {}
    mine = [float(x) for d, x in loads.items() if str(d).startswith(f"{node}/")]
    return mine[0] if len(mine) == 1 else None


def compact_names(names: Sequence[str]) -> str:
    """'mlx5_eth0', ..., 'mlx5_eth4' -> 'mlx5_eth0-4' (an en dash); other lists one name a line (at most 3)."""
    parts = [re.fullmatch(r"(.*?)(\d+)", n) for n in names]
    if len(names) > 2 and all(parts):
        prefixes = {p.group(1) for p in parts if p}
        nums = sorted(int(p.group(2)) for p in parts if p)
        if len(prefixes) == 1 and nums == list(range(nums[0], nums[0] + len(nums))):
            return f"{prefixes.pop()}{nums[0]}–{nums[-1]}"
    if len(names) > 3:
        return f"{names[0]}\n… ({len(names) - 2} more)\n{names[-1]}"
    return "\n".join(names)


def gpu_ranges(gpus: Sequence[int]) -> str:
    out: list[str] = []
    for g in sorted(gpus):
        if out and out[-1].split("–")[-1] == str(g - 1):
            out[-1] = f"{out[-1].split('–')[0]}–{g}"
        else:
            out.append(str(g))
    return "GPU" + ",".join(out)


def island_captions(node: Node, isl: Sequence[Island]) -> list[tuple[str, str]]:
    out = []
    for i in isl:
        if node.name not in i.nodes or len(i.gpus) < 2 or i.kind is None:
            continue
        if len(i.nodes) > 1:
            tag = f"one NVL domain: {len(i.gpus)} GPUs on {len(i.nodes)} nodes"
        elif not i.fully_connected:
            tag = "not a full mesh"
        else:
            continue
        out.append((i.id, f"{i.kind.label} island, {tag}"))
    return out


def wrap(text: str, width_chars: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width_chars:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return [*lines, line] if line else lines


def plan_captions(node: Node, plan: Mapping[str, Any] | None, named: set[str]) -> list[tuple[str, str]]:
    """('role:<role>', words) for each placement with GPUs on this node; the full label on the
    first node a placement is drawn on, its name on the others."""
    out = []
    for placement in (plan or {}).get("placements", []):
        gpus = plan_groups(placement).get(node.name)
        if not gpus:
            continue
        name = str(placement.get("replica_id", ""))
        text = f"{plan_label(placement) if name not in named else name} · {gpu_ranges(gpus)}"
        named.add(name)
        share = domain_share(placement, node.name)
        if share is not None:
            text += f"; {share:.0%} of its expert load in this node's domain"
        out.append((f"role:{placement.get('role')}", text))
    return out
