"""Domain-local replica lists in the tensors vLLM's MoE router reads (`vllmplugin.locality.localise`,
the same shapes and types as vLLM's `compute_logical_maps`). vLLM itself is not needed here: the
vLLM tier drives the real thing (tests/vllm/test_vllm_eplb_plugin.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pools.experts.engine import ExpertSpec  # noqa: E402
from vllmplugin.locality import localise  # noqa: E402

pytestmark = pytest.mark.unit

SPEC = ExpertSpec(domains=("d0", "d0", "d1", "d1"), hosts=("h0", "h0", "h1", "h1"))


def test_each_rank_picks_among_its_own_domains_copies() -> None:
    phys2log = torch.tensor([[0, 1, 2, 0, 3, 1, 2, 3], [3, 3, 0, 1, 2, 2, 0, 1]])
    logical, count = localise(SPEC, 0, phys2log, 4, torch.int64)
    assert logical.shape == (2, 4, 2) and count.dtype == torch.int64
    assert count.tolist() == [[2, 1, 1, 2], [1, 1, 2, 2]]
    assert logical[0].tolist() == [[0, 3], [1, -1], [2, -1], [4, 7]]  # expert 3 has no copy in d0: both
    assert logical[1].tolist() == [[2, -1], [3, -1], [4, 5], [0, 1]]
    one, n = localise(SPEC, 2, phys2log[0], 4, torch.int64)  # one layer, as vLLM's async path commits
    assert one.tolist() == [[0, 3], [5, -1], [6, -1], [4, 7]] and n.tolist() == [2, 1, 1, 2]
