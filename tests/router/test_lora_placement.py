"""The pure LoRA decision (`router.lora.placement`), table-driven: affinity, room, the coldest out."""

from __future__ import annotations

import pytest

from router.lora.placement import AdapterBook, base_candidates, place
from router.plugins.model import ReplicaLoad
from tests.router.conftest import cand

pytestmark = pytest.mark.unit


def _book(held: dict[str, dict[str, float]]) -> AdapterBook:
    return AdapterBook(held={r: dict(v) for r, v in held.items()})


CASES = [
    # (holdings, loads (running per replica), max_loras, adapter) -> (kind, replicas, evict)
    ({"a": {"x": 1.0}, "b": {}}, {"a": 5, "b": 0}, 2, "x", ("held", ("a",), None)),  # affinity beats load
    ({"a": {"x": 1.0}, "b": {"x": 2.0}}, {"a": 5, "b": 1}, 2, "x", ("held", ("b", "a"), None)),  # least loaded first
    ({"a": {}, "b": {}}, {"a": 3, "b": 1}, 1, "x", ("load", ("b",), None)),  # least loaded with room
    ({"a": {}, "b": {}}, {"a": 0, "b": 0}, 1, "x", ("load", ("a",), None)),  # ties by id
    ({"a": {"y": 1.0}, "b": {}}, {"a": 0, "b": 4}, 1, "x", ("load", ("b",), None)),  # only b has room
    ({"a": {"y": 5.0}, "b": {"z": 2.0}}, {"a": 0, "b": 9}, 1, "x", ("evict", ("b",), "z")),  # z is the coldest
    ({"a": {"y": 0.0, "w": 7.0}, "b": {"z": 2.0}}, {}, 2, "x", ("load", ("b",), None)),
    ({"a": {"y": 0.0, "w": 7.0}, "b": {"z": 2.0, "v": 3.0}}, {}, 2, "x", ("evict", ("a",), "y")),  # never used
    ({"a": {"y": 4.0}, "b": {"z": 4.0}}, {"a": 2, "b": 1}, 1, "x", ("evict", ("b",), "z")),  # equally cold: less load
]


@pytest.mark.parametrize(("held", "loads", "max_loras", "adapter", "want"), CASES)
def test_place(held: dict[str, dict[str, float]], loads: dict[str, int], max_loras: int, adapter: str,
               want: tuple[str, tuple[str, ...], str | None]) -> None:
    cands = [cand(r, load=ReplicaLoad(running=loads.get(r, 0))) for r in sorted(held)]
    plan = place(adapter, cands, _book(held), max_loras)
    assert (plan.kind, plan.replicas, plan.evict) == want
    assert plan.reason


def test_no_usable_replica_is_a_value() -> None:
    sick = cand("a", healthy=False)
    assert base_candidates([sick, cand("p", role="prefill")], "m", sheddable=False) == []
    assert place("x", [], AdapterBook(), 1).kind == "none"


def test_the_book_learns_what_engines_say() -> None:
    book = _book({"a": {"x": 3.0, "gone": 1.0}})
    book.learn("a", ["x", "new"])
    assert book.on("a") == {"x": 3.0, "new": 0.0}  # new ones are the coldest; the used keep their time
    book.used("a", "new", 9.0)
    book.unloaded("a", "x")
    assert book.holders("new") == ["a"] and book.holders("x") == []
    book.keep(["b"])
    assert book.on("a") == {}
