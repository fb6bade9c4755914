"""Expert load: tokens per logical expert in every MoE layer.

`read_load` reads a file in any of these forms (told apart by content):

- `{"layers": [[tokens per expert], ...]}`: this project's form, and the record the isleserve vLLM
  plugin writes for each load window vLLM's EPLB hands its policy (`ISLE_EXPERT_LOAD_DIR`:
  EPLB's window summed over the EP ranks, logical experts, MoE layers only);
- `{"logical_count": [[...], ...]}` or `[[[...], ...], ...]`: SGLang's expert distribution
  (`/dump_expert_distribution_record` in `stat` mode, saved as JSON, or the form
  `--init-expert-location` takes; the DeepSeek-V3/R1 statistics SGLang published use it): per
  layer (the model's layer index, dense layers all zero) tokens per logical expert, a 3-D array
  summed over its first axis (the recorder's buffer rows). All-zero layers are dropped;
- CSV with the header `layer_id,expert_id,count` (SGLang's recorder before its `.pt` dumps).

SGLang's `.pt` dumps are torch pickles, which this pure package does not read: docs/experts.md
gives the one line that saves one as JSON.

`synthetic` draws a load: each layer's expert popularity is Zipf
with exponent `skew` over a seeded random order of the experts; with `groups` > 1 a token first
picks `groups_per_token` groups in proportion to their popularity (DeepSeek-V3's group-limited
routing: 8 groups, 4 per token), then its experts inside them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from physics import catalog


@dataclass(frozen=True, slots=True)
class ExpertLoad:
    layers: tuple[tuple[float, ...], ...]

    @property
    def experts(self) -> int:
        return len(self.layers[0]) if self.layers else 0

    def shares(self, layer: int) -> list[float]:
        """Each expert's share of the layer's (token, expert) pairs (sums to 1)."""
        row = self.layers[layer]
        total = sum(row)
        return [x / total for x in row] if total > 0 else [1.0 / len(row)] * len(row)


def validate(rows: Sequence[Sequence[float]], experts: int | None = None) -> ExpertLoad:
    if not rows:
        raise ValueError("load: `layers` is empty")
    width = len(rows[0])
    problems = []
    for k, row in enumerate(rows):
        if len(row) != width:
            problems.append(f"layers[{k}] has {len(row)} experts, layers[0] has {width}")
        if any(not isinstance(x, (int, float)) or x < 0 for x in row):
            problems.append(f"layers[{k}]: loads are numbers >= 0")
    if experts is not None and width != experts:
        problems.append(f"{width} experts per layer, the model has {experts}")
    if problems:
        raise ValueError("load: " + "; ".join(problems[:5]))
    return ExpertLoad(layers=tuple(tuple(float(x) for x in row) for row in rows))


FORMS = '{"layers": [[tokens per expert], ...]}, {"logical_count": [[...]]} (SGLang), or CSV layer_id,expert_id,count'


def read_load(path: str, experts: int | None = None) -> ExpertLoad:
    """A load file in any form of the module docstring."""
    if path.endswith(".pt"):
        raise ValueError(f"load file {path}: an SGLang .pt dump; save its logical_count as JSON first "
                         f"(docs/experts.md: one line of Python with torch)")
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ValueError(f"cannot read load file {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"load file {path} is not text: want {FORMS}") from None
    if "EPLB step:" in text and "balancedness=" in text:
        raise ValueError(f"load file {path} is vLLM's EPLB log (log_balancedness): its lines hold per-GPU totals "
                         f"(avg_tokens, max_tokens, balancedness), not tokens per expert; the isleserve vLLM plugin "
                         f"writes vLLM's per-expert load window to ISLE_EXPERT_LOAD_DIR (docs/experts.md)")
    if text.lstrip().lower().startswith("layer_id"):
        return validate(_csv_rows(text, path), experts)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"load file {path} is not JSON ({err.msg} at line {err.lineno}) nor CSV: want {FORMS}") \
            from None
    if isinstance(doc, dict) and isinstance(doc.get("layers"), list):
        return validate(doc["layers"], experts)
    return validate(_nonzero(_counts(doc, path)), experts)


def _counts(doc: object, path: str) -> list[list[float]]:
    """SGLang's logical_count, 2-D or 3-D (summed over its first axis)."""
    table = doc.get("logical_count") if isinstance(doc, dict) else doc
    if hasattr(table, "tolist"):
        table = table.tolist()
    if not isinstance(table, list) or not table or not isinstance(table[0], list):
        raise ValueError(f"load file {path}: want {FORMS}")
    if table[0] and isinstance(table[0][0], list):
        rows = [len(r) for r in table]
        if len(set(rows)) != 1:
            raise ValueError(f"load file {path}: logical_count's rows hold {sorted(set(rows))} layers")
        return [[sum(float(b[k][e]) for b in table) for e in range(len(table[0][k]))] for k in range(rows[0])]
    return [[float(x) for x in row] for row in table]


def _nonzero(rows: list[list[float]]) -> list[list[float]]:
    kept = [r for r in rows if any(r)]
    if not kept:
        raise ValueError("load: every layer is all zero (no MoE layer recorded a token)")
    return kept


def _csv_rows(text: str, path: str) -> list[list[float]]:
    table: dict[int, dict[int, float]] = {}
    for n, line in enumerate(text.splitlines()[1:], start=2):
        if not line.strip():
            continue
        parts = line.split(",")
        try:
            layer, expert, count = int(parts[0]), int(parts[1]), float(parts[2])
        except (ValueError, IndexError):
            raise ValueError(f"load file {path}: line {n} is not layer_id,expert_id,count") from None
        if layer < 0 or expert < 0:
            raise ValueError(f"load file {path}: line {n}: negative layer or expert id")
        table.setdefault(layer, {})
        table[layer][expert] = table[layer].get(expert, 0.0) + count
    width = 1 + max((e for row in table.values() for e in row), default=-1)
    return _nonzero([[table[k].get(e, 0.0) for e in range(width)] for k in sorted(table)])


def synthetic(experts: int, layers: int, *, skew: float, seed: int = 0, tokens: int = 65536, topk: int = 8,
              groups: int = 1, groups_per_token: int = 1) -> ExpertLoad:
    """Expected (token, expert) pairs per expert for `tokens` tokens choosing `topk` experts each
    (module docstring). Deterministic for a seed."""
    if experts < 1 or layers < 1 or topk < 1 or topk > experts:
        raise ValueError(f"synthetic load: need 1 <= topk ({topk}) <= experts ({experts}) and layers >= 1")
    if groups < 1 or experts % groups or not 1 <= groups_per_token <= groups:
        raise ValueError(f"synthetic load: {experts} experts in {groups} groups, {groups_per_token} per token")
    rng = random.Random(seed)
    rows = []
    for _ in range(layers):
        order = list(range(experts))
        rng.shuffle(order)
        weight = [0.0] * experts
        for rank, e in enumerate(order):
            weight[e] = 1.0 / (rank + 1) ** skew
        if groups > 1:
            size = experts // groups
            group_w = [sum(weight[g * size:(g + 1) * size]) for g in range(groups)]
            total = sum(group_w)
            # a group is chosen with probability ~ its share, at most once: scale into [0, 1]
            picked = [min(1.0, groups_per_token * w / total) for w in group_w]
            weight = [weight[e] * picked[e // size] / group_w[e // size] * size for e in range(experts)]
        share = _capped(weight, 1.0 / topk)
        rows.append(tuple(tokens * topk * x for x in share))
    return ExpertLoad(layers=tuple(rows))


def _capped(weight: Sequence[float], cap: float) -> list[float]:
    """Shares proportional to `weight`, none above `cap` (a token picks an expert at most once,
    so one expert holds at most 1/topk of the pairs): water-filling."""
    fixed: dict[int, float] = {}
    while True:
        free = [i for i in range(len(weight)) if i not in fixed]
        room = 1.0 - sum(fixed.values())
        total = sum(weight[i] for i in free)
        over = [i for i in free if total > 0 and weight[i] / total * room > cap]
        if not over:
            out = [fixed.get(i, 0.0) for i in range(len(weight))]
            for i in free:
                out[i] = weight[i] / total * room if total > 0 else 0.0
            return out
        for i in over:
            fixed[i] = cap


SYNTHETIC_LAYERS = 4
"""Layers a `zipf:` load draws (each its own seeded order of the experts)."""


def load_of(spec: str, model_name: str) -> ExpertLoad:
    """A load file, or `zipf:SKEW[:SEED]`: a synthetic one for the model (its experts, experts per
    token and expert groups)."""
    model = catalog.model(model_name)
    if model.moe is None:
        raise ValueError(f"{model_name} is a dense model: no experts to place")
    if not spec.startswith("zipf:"):
        return read_load(spec, model.moe.routed_experts)
    parts = spec.split(":")[1:]
    try:
        skew = float(parts[0])
        seed = int(parts[1]) if len(parts) > 1 else 0
    except (ValueError, IndexError):
        raise ValueError(f"--load {spec!r}: a file, or zipf:SKEW[:SEED] (e.g. zipf:1.3:7)") from None
    if skew < 0 or len(parts) > 2:
        raise ValueError(f"--load {spec!r}: zipf:SKEW[:SEED] with SKEW >= 0")
    moe = model.moe
    return synthetic(moe.routed_experts, SYNTHETIC_LAYERS, skew=skew, seed=seed, topk=moe.experts_per_token,
                     groups=moe.groups, groups_per_token=moe.groups_per_token)
