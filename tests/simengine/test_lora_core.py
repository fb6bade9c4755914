"""LoRA's pure parts: the adapter's price (`physics.lora`), the registry's rules and the batch
limit (`max_loras`) and step cost in the engine core (`simengine.lora`, `simengine.core`)."""

from __future__ import annotations

import pytest

from kvblocks.events import BlockStored, EventBatch
from physics import catalog
from physics.costmodel import LOCAL
from physics.lora import LoraCost
from simengine.core import EngineConfig, EngineCore
from simengine.lora import Adapters, LoraSpec, parse_module, runtime_updating
from wire.errors import ApiError
from wire.kvevents import decode, encode

pytestmark = pytest.mark.unit
MODEL = "llama-3.1-8b"


def test_runtime_updating_reads_the_variable_as_vllm() -> None:
    assert runtime_updating({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": " True "})
    assert runtime_updating({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    assert not runtime_updating({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "yes"}) and not runtime_updating({})


def test_lora_modules_parse_both_forms() -> None:
    assert parse_module("a=/p/a").path == "/p/a"
    assert parse_module('{"name": "b", "path": "/p/b", "base_model_name": "m"}').base_model_name == "m"
    with pytest.raises(ValueError):
        parse_module("{not json")
    with pytest.raises(ValueError, match="max_cpu_loras"):
        LoraSpec(max_loras=4, max_cpu_loras=2)


def test_registry_keeps_ids_and_refuses_as_vllm() -> None:
    reg = Adapters("m")
    assert reg.register("a", "/a").lora_id == 1 and reg.register("b", "/b").lora_id == 2
    assert reg.register("a", "/a2").lora_id == 1  # reloaded in place: same id
    with pytest.raises(ApiError) as err:
        reg.check_load({"lora_name": "a", "lora_path": "/a"})
    assert err.value.status == 400
    reg.check_load({"lora_name": "a", "lora_path": "/a", "load_inplace": True})


def test_adapter_price_from_the_model_shape() -> None:
    cost = LoraCost(model=catalog.model(MODEL), gpu=catalog.gpu("h100-sxm"), max_lora_rank=16)
    assert 20e6 < cost.adapter_bytes() < 35e6  # rank 16 on q, k, v, o of Llama-3 8B: ~27 MB
    assert 20 < cost.load_ms() < 40 and cost.activate_ms() < 2
    assert cost.step_overhead_ms(0) == 0 and 1.9 < cost.step_overhead_ms(1) < cost.step_overhead_ms(2) < 2.5


def _core(max_loras: int) -> EngineCore:
    return EngineCore(EngineConfig(model=catalog.model(MODEL), gpu=catalog.gpu("h100-sxm"), tp=1, link=LOCAL,
                                   lora=LoraSpec(max_loras=max_loras)))


def test_a_batch_holds_at_most_max_loras_adapters() -> None:
    core = _core(1)
    core.add("r1", 32, 4, lora="a")
    core.add("r2", 32, 4, lora="b")
    core.add("r3", 32, 4)  # the base model: no adapter, always fits
    first = core.step()
    assert first is not None and set(first.admitted) == {"r1", "r3"}  # b waits for a's batch to end
    while core.running:
        core.step()
    later = core.step()
    assert later is not None and later.admitted == ("r2",)
    assert core.lora is not None and core.lora.activations == 2


def test_adapters_cost_step_time() -> None:
    plain, lora = _core(1), _core(1)
    plain.add("r", 64, 2)
    lora.add("r", 64, 2, lora="a")
    a, b = plain.step(), lora.step()
    assert a is not None and b is not None
    extra_ms = (b.duration_s - a.duration_s) * 1000
    cost = lora.lora.cost if lora.lora is not None else None
    assert cost is not None
    assert extra_ms == pytest.approx(cost.load_ms() + cost.activate_ms() + cost.step_overhead_ms(1))
    a, b = plain.step(), lora.step()  # resident now: the kernels only
    assert a is not None and b is not None
    assert (b.duration_s - a.duration_s) * 1000 == pytest.approx(cost.step_overhead_ms(1))


def test_an_adapters_blocks_are_its_own_in_the_prefix_cache() -> None:
    core = EngineCore(EngineConfig(model=catalog.model(MODEL), gpu=catalog.gpu("h100-sxm"), tp=1, link=LOCAL,
                                   prefix_caching=True, lora=LoraSpec(max_loras=2)))
    ids = tuple(range(1, 161))  # ten full blocks of 16

    def run(rid: str, lora: str | None) -> int:
        before = core.prefix_hits
        core.add(rid, len(ids), 1, token_ids=ids, lora=lora)
        while core.seqs:
            core.step()
        return core.prefix_hits - before

    assert run("a1", "sql") == 0
    assert run("b1", None) == 0  # the base model's blocks are not the adapter's
    assert run("c1", "chat") == 0
    assert run("a2", "sql") == 144  # the same adapter: its nine blocks before the last token's
    assert {e.lora_name for e in core.kv_events if isinstance(e, BlockStored)} == {"sql", None, "chat"}


def test_an_adapters_events_carry_its_id_over_the_wire() -> None:
    reg = Adapters("m")
    reg.register("sql", "/p/sql")
    event = reg.with_id(BlockStored((7,), None, tuple(range(16)), 16, "sql"))
    assert isinstance(event, BlockStored) and event.lora_id == 1
    assert reg.with_id(BlockStored((8,), None, tuple(range(16)), 16)) == BlockStored((8,), None, tuple(range(16)), 16)
    assert decode(encode(EventBatch(0.0, (event,)))).events == (event,)  # vLLM's encoding: lora_id and lora_name
