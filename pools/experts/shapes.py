"""Named EP gangs `python -m pools experts --shape NAME` prices without a plan: the published
deployments an expert map has to serve (issue 32's shapes). Each is a gang (ranks, NVLink domains,
hosts), its links and GPU, and the phase its steps are priced in.

| name | what | source of the shape |
|---|---|---|
| `nvl72` | EP72 in one GB200 NVL72 rack (one NVLink domain, 18 trays of 4) | NVIDIA GB200 NVL72 data sheet |
| `nvl72x2` | EP144 over two NVL72 racks, 400G NICs between them | two of the above |
| `h800x18-ep144` | EP144 over 18 HGX H800 nodes, 400G InfiniBand: DeepSeek's decode | DeepSeek Open Source Week day 6 |
| `h800x4-ep32` | EP32 over 4 HGX H800 nodes: DeepSeek's prefill | the same |
| `b200x2-ep16` | EP16 over 2 HGX B200 nodes, 400G NICs | an HGX B200 pair |

NVLink per direction: H800 200 GB/s (400 GB/s both ways), B200 and GB200 900 GB/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from physics.alltoall import GangLinks
from pools.experts.metrics import Gang
from pools.experts.objective import Phase, plain_links


@dataclass(frozen=True, slots=True)
class Shape:
    gang: Gang
    links: GangLinks
    gpu: str
    phase: Phase
    what: str


def _shape(domains: int, per_domain: int, hosts_per_domain: int, gpu: str, nvlink_gb_s: float, phase: Phase,
           what: str) -> Shape:
    gang = Gang.uniform(domains, per_domain, hosts_per_domain)
    return Shape(gang, plain_links(gang, "rdma", nvlink_gb_s), gpu, phase, what)


SHAPES: dict[str, Shape] = {
    "nvl72": _shape(1, 72, 18, "gb200", 900.0, "decode", "EP72, one GB200 NVL72 rack"),
    "nvl72x2": _shape(2, 72, 18, "gb200", 900.0, "decode", "EP144, two GB200 NVL72 racks"),
    "h800x18-ep144": _shape(18, 8, 1, "h800-sxm", 200.0, "decode", "EP144, 18 HGX H800 nodes (DeepSeek's decode)"),
    "h800x4-ep32": _shape(4, 8, 1, "h800-sxm", 200.0, "prefill", "EP32, 4 HGX H800 nodes (DeepSeek's prefill)"),
    "b200x2-ep16": _shape(2, 8, 1, "b200", 900.0, "decode", "EP16, 2 HGX B200 nodes"),
}


def shape(name: str) -> Shape:
    found = SHAPES.get(name)
    if found is None:
        raise ValueError(f"unknown shape {name!r} (known: {', '.join(SHAPES)})")
    return found
