"""Readers for real request traces. Each returns requests in file order with arrival offsets in
seconds from the earliest row; `transforms.finalize` sorts and numbers them.

- Azure LLM inference trace 2023 (CSV `TIMESTAMP,ContextTokens,GeneratedTokens`; timestamps
  `YYYY-MM-DD HH:MM:SS.fffffff`, wall clock without a zone).
- Mooncake FAST'25 traces (JSON lines `timestamp` in ms, `input_length`, `output_length`,
  `hash_ids`: prefix blocks of 512 tokens; equal leading ids are a shareable prefix).
- ShareGPT-style JSON (a list of `{"conversations": [{"from": "human"|"gpt", "value": ...}]}`):
  one request per conversation, its first human turn followed by a gpt turn (as `vllm bench
  serve` takes it); token counts are estimated from the text with `wire.text.count_tokens`
  (4 bytes a token). It has no timestamps: `lengths_sharegpt` gives lengths only.

Malformed input raises `WorkloadError` naming the file and line (the conversation for ShareGPT).
"""

from __future__ import annotations

import csv
import datetime as dt
import itertools
import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from loadtest.model import TraceRequest
from loadtest.workloads import WorkloadError
from wire.text import count_tokens

MOONCAKE_BLOCK_TOKENS = 512
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
FORMATS = ("azure", "mooncake", "sharegpt")


def _lines(path: Path) -> Iterator[str]:
    try:
        with path.open(encoding="utf-8", newline="") as f:
            yield from f
    except OSError as err:
        raise WorkloadError(f"cannot read the trace: {err.strerror}", str(path)) from None
    except UnicodeDecodeError:
        raise WorkloadError("not a UTF-8 text file", str(path)) from None


def _count(value: Any, name: str, source: str, line: int) -> int:
    if isinstance(value, str):
        value = value.strip()
        if not value.lstrip("-").isdigit():
            raise WorkloadError(f"{name} is {value!r}, not a whole number", source, line)
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(f"{name} is {value!r}, not a whole number", source, line)
    if value < 1:
        raise WorkloadError(f"{name} is {value}, must be at least 1", source, line)
    return value


def _azure_seconds(text: str, days: dict[str, int], source: str, line: int) -> tuple[int, float]:
    """(day ordinal, seconds into the day) of `YYYY-MM-DD HH:MM:SS[.fraction]` (any number of
    fraction digits); kept apart so offsets keep sub-microsecond precision."""
    date, _, clock = text.strip().partition(" ")
    try:
        day = days.get(date)
        if day is None:
            day = days[date] = dt.date.fromisoformat(date).toordinal()
        hours, minutes, seconds = clock.split(":")
        value = int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    except ValueError:
        raise WorkloadError(f"TIMESTAMP {text!r} is not YYYY-MM-DD HH:MM:SS.fffffff", source, line) from None
    return day, value


def parse_azure(lines: Iterable[str], source: str) -> list[TraceRequest]:
    rows = csv.reader(lines)
    header = next(rows, None)
    if header is None:
        raise WorkloadError("empty file: expected the header " + ",".join(AZURE_COLUMNS), source, 1)
    names = [h.strip().lstrip("\ufeff") for h in header]
    missing = [c for c in AZURE_COLUMNS if c not in names]
    if missing:
        raise WorkloadError(f"header {','.join(names)!r} lacks {', '.join(missing)} (an Azure LLM trace has "
                            + ",".join(AZURE_COLUMNS) + ")", source, 1)
    at, ctx, gen = (names.index(c) for c in AZURE_COLUMNS)
    days: dict[str, int] = {}
    stamps: list[tuple[tuple[int, float], int, int]] = []
    for number, row in enumerate(rows, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(names):
            raise WorkloadError(f"{len(row)} fields, the header has {len(names)}", source, number)
        stamps.append((_azure_seconds(row[at], days, source, number),
                       _count(row[ctx], "ContextTokens", source, number),
                       _count(row[gen], "GeneratedTokens", source, number)))
    if not stamps:
        raise WorkloadError("no requests after the header", source)
    first_day, first_s = min(s for s, _, _ in stamps)
    return [TraceRequest(index=i, arrival_s=(day - first_day) * 86400 + (s - first_s), prompt_tokens=p,
                         output_tokens=o) for i, ((day, s), p, o) in enumerate(stamps)]


def _mooncake_row(text: str, source: str, line: int) -> tuple[float, int, int, tuple[int, ...]]:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        raise WorkloadError(f"not JSON ({err.msg} at column {err.colno})", source, line) from None
    if not isinstance(row, dict):
        raise WorkloadError("a line must be a JSON object", source, line)
    missing = [k for k in ("timestamp", "input_length", "output_length") if k not in row]
    if missing:
        raise WorkloadError(f"missing {', '.join(missing)}", source, line)
    stamp = row["timestamp"]
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not 0 <= stamp < math.inf:
        raise WorkloadError(f"timestamp is {stamp!r}, not milliseconds >= 0", source, line)
    ids = row.get("hash_ids", [])
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise WorkloadError("hash_ids must be a list of integers", source, line)
    return (float(stamp), _count(row["input_length"], "input_length", source, line),
            _count(row["output_length"], "output_length", source, line), tuple(ids))


def parse_mooncake(lines: Iterable[str], source: str) -> list[TraceRequest]:
    rows = [_mooncake_row(text, source, number) for number, text in enumerate(lines, start=1) if text.strip()]
    if not rows:
        raise WorkloadError("no requests (an empty JSON-lines file)", source)
    first_ms = min(r[0] for r in rows)
    return [TraceRequest(index=i, arrival_s=(ms - first_ms) / 1000.0, prompt_tokens=p, output_tokens=o,
                         prefix_blocks=ids, block_tokens=MOONCAKE_BLOCK_TOKENS)
            for i, (ms, p, o, ids) in enumerate(rows)]


def _turn(turn: Any, source: str, where: str) -> tuple[str, str]:
    if not isinstance(turn, dict):
        raise WorkloadError(f"{where} is not an object", source)
    speaker = turn.get("from", turn.get("role"))
    value = turn.get("value", turn.get("content"))
    if not isinstance(speaker, str) or not isinstance(value, str):
        raise WorkloadError(f"{where} needs string 'from' and 'value'", source)
    return {"user": "human", "assistant": "gpt", "chatgpt": "gpt"}.get(speaker, speaker), value


def parse_sharegpt(text: str, source: str) -> list[tuple[int, int]]:
    """(prompt_tokens, output_tokens) of each conversation that has a human turn answered by gpt."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise WorkloadError(f"not JSON ({err.msg}, column {err.colno})", source, err.lineno) from None
    if not isinstance(data, list):
        raise WorkloadError('a ShareGPT file is a JSON list of {"conversations": [...]}', source)
    pairs = []
    for k, item in enumerate(data):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise WorkloadError(f'conversation [{k}] has no "conversations" list', source)
        parsed = [_turn(t, source, f"conversation [{k}] turn [{j}]") for j, t in enumerate(turns)]
        for (who, asked), (answerer, answer) in itertools.pairwise(parsed):
            if who == "human" and answerer == "gpt":
                pairs.append((count_tokens(asked), count_tokens(answer)))
                break
    if not pairs:
        raise WorkloadError("no conversation has a human turn followed by a gpt turn", source)
    return pairs


def read_azure(path: Path) -> list[TraceRequest]:
    return parse_azure(_lines(path), str(path))


def read_mooncake(path: Path) -> list[TraceRequest]:
    return parse_mooncake(_lines(path), str(path))


def lengths_sharegpt(path: Path) -> list[tuple[int, int]]:
    return parse_sharegpt("".join(_lines(path)), str(path))


def sniff(path: Path) -> str:
    """The trace format of a file: by its extension, else by its first bytes."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "azure"
    if suffix == ".jsonl":
        return "mooncake"
    if suffix == ".json":
        return "sharegpt"
    try:
        with path.open("rb") as f:
            head = f.read(256).lstrip()
    except OSError as err:
        raise WorkloadError(f"cannot read the trace: {err.strerror}", str(path)) from None
    if head.startswith(b"["):
        return "sharegpt"
    if head.startswith(b"{"):
        return "mooncake"
    if head.upper().startswith(b"TIMESTAMP"):
        return "azure"
    raise WorkloadError("unknown trace format: name it with format: azure, mooncake or sharegpt", str(path))
