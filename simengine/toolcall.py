"""Tools and `tool_choice` on /v1/chat/completions, as vLLM 0.32 checks and serves them.

Checks (`ChatCompletionRequest.check_tool_usage` in vllm/entrypoints/openai/chat_completion/
protocol.py): `tools: []` is refused; tools without `tool_choice` mean "auto"; a `tool_choice`
without tools, an unknown string, or a named function that is not among the tools is refused.
Then the server's tool setup (vllm/renderers/online_renderer.py `render_chat`): without
`--tool-call-parser`, "auto" needs `--enable-auto-tool-choice` and `--tool-call-parser`, and
"required" or a named function need `--tool-call-parser`: 400 with vLLM's messages.
"none" leaves the tools in the prompt and answers in text.

What the simulated model writes (each choice decided from its seed):
- a named function: its arguments, a JSON object for the function's `parameters` (guided
  decoding); the message has that one tool call, finish_reason "stop" (vLLM: named -> "stop");
- "required": `[{"name": ..., "parameters": {...}}]` for one of the tools; finish_reason
  "tool_calls" (vLLM parses the array into tool calls; arguments = the parameters as JSON);
- "auto" with `--enable-auto-tool-choice`: a call, written as Hermes' parser reads it
  (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`), when the last message is not a
  tool's result; after a tool result it answers in text (an agent loop ends). With a parser but
  without auto tool choice, "auto" answers in text, as vLLM does.
Cut short by `max_tokens` (finish "length"): a named call keeps the arguments written so far (vLLM
wraps whatever was written); a "required" or "auto" call does not parse, so there are no
tool_calls ("auto": the text so far is the content).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from typing import Any

from simengine.guided import json_text
from wire.errors import ApiError
from wire.fields import Errors, vllm_error

USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'
_HERMES = re.compile(r"<tool_call>\s*(\{.*\})\s*</tool_call>", re.S)


@dataclass(frozen=True, slots=True)
class ToolSetup:
    """The server's flags: `--tool-call-parser NAME`, `--enable-auto-tool-choice`."""

    parser: str | None = None
    auto: bool = False


def check_tool_usage(body: dict[str, Any]) -> Any:
    """vLLM's `check_tool_usage` (a model validator, before the field types): the effective
    tool_choice ("none" when there are no tools and none was given)."""
    tools = body.get("tools")
    if tools == []:
        raise vllm_error("`tools` must not be an empty array. Either provide at least one tool or omit the field "
                         "entirely.", "tools")
    choice = body.get("tool_choice", "auto" if tools else "none")
    if choice == "none" or choice is None:
        return "none" if choice == "none" or not tools else choice
    if tools is None:
        raise vllm_error("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise vllm_error(f"Invalid value for `tool_choice`: {choice}! Only named tools, \"none\", \"auto\" or "
                         "\"required\" are supported.", "tool_choice")
    if isinstance(choice, dict):
        function = choice.get("function")
        if not isinstance(function, dict):
            raise vllm_error(f"Invalid value for `function`: `{function}` in `tool_choice`! {USAGE}",
                             "tool_choice.function")
        if "name" not in function:
            raise vllm_error(f"Expected field `name` in `function` in `tool_choice`! {USAGE}",
                             "tool_choice.function.name")
        name = function["name"]
        if not isinstance(name, str) or not name:
            raise vllm_error(f"Invalid `name` in `function`: `{name}` in `tool_choice`! {USAGE}",
                             "tool_choice.function.name")
        names = [t.get("function", {}).get("name") for t in tools if isinstance(t, dict)] if isinstance(
            tools, list) else []
        if name not in names:
            raise vllm_error("The tool specified in `tool_choice` does not match any of the specified `tools`",
                             "tool_choice")
        return {"name": name}
    return choice


def read_tools(tools: Any, errors: Errors) -> list[dict[str, Any]]:
    """`tools` as ChatCompletionToolsParam reads them: the functions (name, parameters)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        errors.add("list_type", "body.tools", "Input should be a valid list", tools)
        return []
    out = []
    for k, tool in enumerate(tools):
        where = f"body.tools.{k}"
        if not isinstance(tool, dict):
            errors.add("model_type", where, "Input should be a valid dictionary or instance of "
                       "ChatCompletionToolsParam", tool)
            continue
        if tool.get("type", "function") != "function":
            errors.add("literal_error", f"{where}.type", "Input should be 'function'", tool.get("type"))
        fn = tool.get("function")
        if not isinstance(fn, dict):
            errors.add("missing" if fn is None else "model_type", f"{where}.function",
                       "Field required" if fn is None else "Input should be a valid dictionary", fn)
            continue
        if not isinstance(fn.get("name"), str):
            errors.add("missing" if "name" not in fn else "string_type", f"{where}.function.name",
                       "Field required" if "name" not in fn else "Input should be a valid string", fn.get("name"))
            continue
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            errors.add("dict_type", f"{where}.function.parameters", "Input should be a valid dictionary", params)
            continue
        out.append({"name": fn["name"], "parameters": params})
    return out


def check_setup(choice: Any, setup: ToolSetup) -> None:
    """What the server's flags allow (vLLM's `render_chat`): BadRequestError with its messages."""
    if setup.parser is not None or choice in (None, "none"):
        return
    if choice == "auto":
        if not setup.auto:
            raise ApiError(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to '
                                "be set", "BadRequestError")
        return
    desc = f'function "{choice["name"]}"' if isinstance(choice, dict) else f'"{choice}"'
    raise ApiError(400, f"tool_choice={desc} requires --tool-call-parser to be set", "BadRequestError")


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """One choice's tool call: what the model writes, and where the arguments are in it."""

    mode: str
    """'named', 'required' or 'auto'."""
    name: str
    raw: str
    """The text the model writes."""
    args: tuple[int, int]
    """The arguments' JSON within `raw`."""
    call_id: str


def plan(tools: list[dict[str, Any]], choice: Any, setup: ToolSetup, last_role: str | None,
         seed: int) -> ToolPlan | None:
    """This choice's tool call, or None: it answers in text."""
    if not tools or choice in (None, "none"):
        return None
    if choice == "auto" and (not setup.auto or setup.parser is None or last_role == "tool"):
        return None
    rng = random.Random(seed ^ 0x746F6F6C)
    if isinstance(choice, dict):
        tool = next(t for t in tools if t["name"] == choice["name"])
    else:
        tool = tools[rng.randrange(len(tools))]
    args = json_text(tool["parameters"] or {"type": "object", "properties": {}}, seed)
    name = json.dumps(tool["name"])
    if isinstance(choice, dict):
        mode, head, tail = "named", "", ""
    elif choice == "required":
        mode, head, tail = "required", f'[{{"name": {name}, "parameters": ', "}]"
    else:
        mode, head, tail = "auto", f'<tool_call>\n{{"name": {name}, "arguments": ', "}\n</tool_call>"
    call_id = "chatcmpl-tool-" + hashlib.sha256(f"{seed}:{tool['name']}".encode()).hexdigest()[:32]
    return ToolPlan(mode=mode, name=tool["name"], raw=head + args + tail, args=(len(head), len(head) + len(args)),
                    call_id=call_id)


def _call(p: ToolPlan, name: str, arguments: str) -> dict[str, Any]:
    return {"id": p.call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def parse(p: ToolPlan, text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) from what the model wrote, as vLLM's parsers read it."""
    if p.mode == "named":
        return ("", [_call(p, p.name, text)]) if text.strip() else (None, [])
    try:
        if p.mode == "required":
            calls = json.loads(text)
            return None, [_call(p, str(c["name"]), json.dumps(c.get("parameters"), ensure_ascii=False))
                          for c in calls]
        found = _HERMES.search(text)
        if found:
            call = json.loads(found.group(1))
            return None, [_call(p, str(call["name"]), json.dumps(call["arguments"], ensure_ascii=False))]
    except (ValueError, TypeError, KeyError):
        pass
    return (text if p.mode == "auto" else None), []


def stream_delta(p: ToolPlan, start: int, end: int, named_sent: bool) -> dict[str, Any] | None:
    """The tool-call delta a streamed token carries (chars start..end of the text), or None:
    the part of the text around the arguments streams nothing. The first delta names the call."""
    lo, hi = max(start, p.args[0]), min(end, p.args[1])
    if lo >= hi and named_sent:
        return None
    if lo >= hi and end <= p.args[0]:
        return None
    piece = p.raw[lo:hi] if lo < hi else ""
    if named_sent:
        return {"index": 0, "function": {"arguments": piece}}
    return {"id": p.call_id, "type": "function", "index": 0, "function": {"name": p.name, "arguments": piece}}
