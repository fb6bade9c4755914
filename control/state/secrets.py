"""The deployment's secrets for its engines, each drawn once and kept in the private state
directory (0600), so a restarted controller gives its engines the same ones, and the same user on
the same machine (a chaos run) can read them; nobody else can:

- `engine_api_key`: what every engine's API wants (vLLM's `--api-key`, `VLLM_API_KEY`; the
  simulated engine reads it the same way): only the router, which the controller gives it, can
  send the engines work, not another local user or a host that reaches an engine's port;
- `engine_admin_token`: what a simulated engine started with its fault-injection routes
  (`engine_admin_routes: true`, tests and chaos runs) wants on them."""

from __future__ import annotations

import contextlib
import secrets

from control.state.files import StateFiles

TOKEN_FILE = "engine_admin_token"
ENGINE_KEY_FILE = "engine_api_key"
"""The key the engines' API wants (vLLM's `--api-key`), drawn and kept the same way: the router
gets it from the controller, and a restarted controller's engines keep it."""


def drawn_secret(files: StateFiles, name: str) -> str:
    """The secret in `files` under `name`, drawn and saved first when there is none (a failed save
    still returns the new one: the engines started now get it, and the next start draws another)."""
    saved = files.read(name)
    if saved:
        return saved.decode().strip()
    token = secrets.token_hex(32)
    with contextlib.suppress(OSError):
        files.replace(name, token.encode())
    return token
