"""The checks tests/gpu/run.sh runs on a GPU machine (see there). Prints one summary line last."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60, check=True).stdout


def compare_discovery(out: Path, findings: dict[str, Any]) -> str:
    from topology import Topology, read_source
    from topology.readers.nvml import discover
    from topology.serialize import to_dict

    capture = out / "nvidia-smi-topo.txt"
    capture.write_text(_smi("topo", "-m"))
    smi = read_source(str(capture)).nodes[0]
    t0 = time.monotonic()
    nvml = discover(sample_s=2.0)
    findings["nvml_discover_s"] = round(time.monotonic() - t0, 2)
    (out / "nvml.json").write_text(json.dumps(to_dict(Topology(nodes=(nvml,))), indent=1))
    diffs = []
    if len(smi.gpus) != len(nvml.gpus):
        diffs.append(f"GPU count: nvidia-smi {len(smi.gpus)}, NVML {len(nvml.gpus)}")
    for g in nvml.gpus:
        if g.index < len(smi.gpus) and smi.gpu(g.index).numa_node not in (None, g.numa_node):
            diffs.append(f"GPU{g.index} NUMA: nvidia-smi {smi.gpu(g.index).numa_node}, NVML {g.numa_node}")
    for a in range(len(nvml.gpus)):
        for b in range(a + 1, len(nvml.gpus)):
            ls, ln = smi.link(a, b), nvml.link(a, b)
            seen = [(k.kind.name, k.lanes) if k is not None else None for k in (ls, ln)]
            if seen[0] != seen[1]:
                diffs.append(f"GPU{a}-GPU{b}: nvidia-smi {seen[0]}, NVML {seen[1]}")
    findings.update(gpus=len(nvml.gpus), models=sorted({g.model or "?" for g in nvml.gpus}),
                    nics_smi=len(smi.nics), nics_nvml=len(nvml.nics), discovery_differences=diffs)
    unhealthy = [f"GPU{k.a}-GPU{k.b}" for k in nvml.links if not k.health.healthy]
    findings["unhealthy_links"] = unhealthy
    findings["unhealthy_gpus"] = [g.index for g in nvml.gpus if not g.healthy]
    return (f"nvml-vs-smi {'OK' if not diffs else 'DIFFERS'} ({len(nvml.gpus)} GPU, {len(diffs)} differences); "
            f"health {'OK' if not unhealthy and not findings['unhealthy_gpus'] else 'DEGRADED'} "
            f"({len(nvml.links)} links, counters sampled 2 s)")


def copies(findings: dict[str, Any]) -> str:
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return "copies skipped (no torch)"
    if not torch.cuda.is_available():
        return "copies skipped (torch sees no GPU)"
    n = 1 << 30
    host = torch.empty(n, dtype=torch.uint8).pin_memory()
    dev = torch.empty(n, dtype=torch.uint8, device="cuda:0")

    def rate(fn: Any) -> float:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        return 5 * n / (time.perf_counter() - t0) / 1e9

    h2d = rate(lambda: dev.copy_(host, non_blocking=True))
    d2h = rate(lambda: host.copy_(dev, non_blocking=True))
    findings.update(h2d_gb_s=round(h2d, 1), d2h_gb_s=round(d2h, 1))
    text = f"h2d {h2d:.0f} GB/s, d2h {d2h:.0f} GB/s"
    count = torch.cuda.device_count()
    if count < 2:
        return text + "; peer copies skipped (1 GPU)"
    peers = {}
    for b in range(1, count):
        other = torch.empty(n, dtype=torch.uint8, device=f"cuda:{b}")
        peers[f"0-{b}"] = round(rate(lambda other=other: other.copy_(dev, non_blocking=True)), 1)
    findings["peer_gb_s"] = peers
    return text + f"; peer copies {peers}"


def bench(out: Path, findings: dict[str, Any]) -> str:
    """`python -m topology bench nvml` as an operator runs it before going live."""
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        return "topology bench skipped (no torch)"
    run = subprocess.run([sys.executable, "-m", "topology", "bench", "nvml", "--out", str(out / "bench.json"),
                          "--format", "json", "--timeout", "240"], capture_output=True, text=True, timeout=300,
                         check=False)
    if run.returncode != 0:
        findings["bench_error"] = run.stderr[-2000:]
        return f"topology bench FAILED (exit {run.returncode})"
    findings["bench"] = json.loads(run.stdout) if run.stdout.strip().startswith("{") else run.stdout[-2000:]
    return "topology bench OK (record in bench.json)"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    findings: dict[str, Any] = {"python": sys.version.split()[0]}
    parts, failed = [], False
    try:
        findings["driver"] = _smi("--query-gpu=name,driver_version", "--format=csv,noheader").strip().splitlines()
        parts.append(compare_discovery(out, findings))
        failed = bool(findings["discovery_differences"])
    except Exception as err:  # report, do not hide: the summary line says what broke
        parts.append(f"discovery FAILED ({type(err).__name__}: {err})")
        failed = True
    try:
        parts.append(copies(findings))
    except Exception as err:
        parts.append(f"copies FAILED ({type(err).__name__}: {err})")
        failed = True
    parts.append(bench(out, findings))
    failed = failed or "FAILED" in parts[-1]
    try:
        import vllm  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
        parts.append("vllm present but the replica check is not built yet: skipped")
    except ImportError:
        parts.append("vllm replica skipped (vLLM not installed)")
    if shutil.which("nvidia-smi") is None:
        parts.append("no nvidia-smi")
    (out / "gpu-check.json").write_text(json.dumps(findings, indent=1))
    print(json.dumps(findings))
    print(("GPU CHECK FAILED: " if failed else "GPU CHECK OK: ") + "; ".join(parts))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
