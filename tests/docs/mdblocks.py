"""The fenced blocks of README.md and docs/**/*.md, and the commands in their shell blocks.

The convention (docs/README.md says it to writers): a fenced block's info string says what the
docs tests do with it.

    ```sh              every command is run for real from the repository root, with .venv/bin
                       first on PATH, and must exit 0 (each finishes in seconds)
    ```sh parse-only   long-running, or needs a running deployment: the program must exist and
                       the command's arguments must parse with the program's own parser
    ```sh usage        a synopsis: the program and subcommand must exist, and every --flag on
                       the line must be one the subcommand's --help lists
    ```sh local        needs the deployment `make run` starts (configs/local.yaml, port 8000):
                       parsed like parse-only, and run verbatim, one after another, against
                       `isle run configs/local.yaml` by tests/e2e/test_serve_run_local.py
    ```yaml / ```json  must parse (YAML / JSON)
    ```text            anything else (output, layouts); not checked

Any other info string on a shell-looking block (bash, console, shell) fails the tests, so a
command cannot slip past them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_KINDS = frozenset({"sh", "sh parse-only", "sh usage", "sh local"})
OTHER_KINDS = frozenset({"yaml", "json", "text"})
OPERATORS = frozenset({";", "|", "&&", "||", "(", ")", "&"})
REDIRECTS = frozenset({">", ">>", "<"})
_FENCE = re.compile(r"^(\s*)```(.*)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    path: Path
    line: int          # 1-based line of the opening fence
    info: str          # the info string, e.g. "sh parse-only"
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """One logical command line of a shell block (continuation lines joined)."""

    path: Path
    line: int
    kind: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        indent, info = match.group(1), match.group(2).strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        found.append(Block(path=path, line=i + 1, info=info, text="\n".join(body)))
        i = j + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in blocks(path)]


def commands(kind: str) -> list[Command]:
    """Every logical command line of every shell block of this kind, in document order."""
    found: list[Command] = []
    for block in all_blocks():
        if block.info != kind:
            continue
        pending: list[str] = []
        start = 0
        for offset, raw in enumerate(block.text.splitlines(), start=block.line + 1):
            if not pending:
                start = offset
            if raw.rstrip().endswith("\\"):
                pending.append(raw.rstrip()[:-1].strip() + " ")
                continue
            pending.append(raw.strip())
            text = "".join(pending).strip()
            if _open_quote(text):  # a quoted argument goes on over the next line
                pending = [text + "\n"]
                continue
            pending = []
            if text and not text.startswith("#"):
                found.append(Command(path=block.path, line=start, kind=kind, text=text))
    return found


def _open_quote(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return True
    return False


def simple_commands(text: str) -> list[list[str]]:
    """A command line split into its simple commands (at ; | && || and parentheses), comments,
    redirections and leading VAR=value assignments removed."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    result: list[list[str]] = [[]]
    skip_next = False
    for token in lexer:
        if skip_next:
            skip_next = False
        elif token in OPERATORS:
            result.append([])
        elif token in REDIRECTS:
            skip_next = True
        elif result[-1] or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", token):
            result[-1].append(token)
    return [words for words in result if words]
