"""The deployment's engine admin token: what a simulated engine started with its fault-injection
routes (`engine_admin_routes: true`, tests and chaos runs) wants in `Authorization: Bearer`.
Drawn once and kept in the private state directory (`engine_admin_token`, 0600), so a
restarted controller gives its engines the same one and a chaos run on the same machine, as the
same user, can read it; nobody else can."""

from __future__ import annotations

import contextlib
import secrets

from pools.controller.statefiles import StateFiles

TOKEN_FILE = "engine_admin_token"


def engine_admin_token(files: StateFiles) -> str:
    """The token in `files`, drawn and saved first when there is none (a failed save still returns
    the new token: the engines started now get it, and the next start draws another)."""
    saved = files.read(TOKEN_FILE)
    if saved:
        return saved.decode().strip()
    token = secrets.token_hex(32)
    with contextlib.suppress(OSError):
        files.replace(TOKEN_FILE, token.encode())
    return token
