"""Check a command without running it: the program exists and its arguments parse with the
program's own parser (argparse in-process, stopped right after parsing; Ray's click commands
through click's own context), or, for a synopsis, every --flag is one its --help lists."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import io
import itertools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from tests.docs.mdblocks import ROOT

Main = Callable[[Sequence[str]], Any]


class Parsed(Exception):
    """Raised when a program's outermost argparse call returned: its arguments parsed."""


@contextlib.contextmanager
def stop_after_parsing() -> Iterator[None]:
    """argparse's parse_args / parse_known_args raise Parsed once the outermost call returns
    (subparsers call parse_known_args inside it), so a program's main stops before it acts."""
    originals = {name: getattr(argparse.ArgumentParser, name) for name in ("parse_args", "parse_known_args")}
    depth = [0]

    def wrap(name: str) -> Callable[..., Any]:
        def wrapper(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            try:
                result = originals[name](self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                raise Parsed(name)
            return result
        return wrapper

    for name in originals:
        setattr(argparse.ArgumentParser, name, wrap(name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(argparse.ArgumentParser, name, original)


def _module_main(module: str, attr: str = "main") -> Main:
    def call(argv: Sequence[str]) -> Any:
        return getattr(importlib.import_module(module), attr)(list(argv))
    return call


# `python -m X` of ours -> the function its __main__ calls (topology's and router's __main__ run at import)
PYTHON_MODULES: dict[str, Main] = {
    "topology": _module_main("topology.cli"),
    "pools": _module_main("pools.__main__"),
    "router": _module_main("router.cli"),
    "loadtest": _module_main("loadtest.__main__"),
}


def argparse_main(words: Sequence[str]) -> tuple[Main, list[str]] | None:
    """Our own program named by a command's words, and its arguments; None when not ours."""
    program = words[0].removeprefix(".venv/bin/")
    if program == "isle":
        return _module_main("isle"), list(words[1:])
    if program in ("python", "python3") and len(words) >= 3 and words[1] == "-m" and words[2] in PYTHON_MODULES:
        return PYTHON_MODULES[words[2]], list(words[3:])
    return None


def parse(main: Main, argv: Sequence[str]) -> str | None:
    """None when argv parses with main's parser; else what went wrong."""
    err = io.StringIO()
    with stop_after_parsing(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(argv)
        except Parsed:
            return None
        except SystemExit as exit_:
            return f"exit {exit_.code}: {err.getvalue().strip()}"
    return f"returned without parsing its arguments: {err.getvalue().strip()}"


def help_text(main: Main, argv: Sequence[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), contextlib.suppress(SystemExit):
        main([*argv, "--help"])
    return out.getvalue()


def click_parse(words: Sequence[str]) -> str | None:
    """Ray's `ray` and `serve` commands (click): the group and subcommand parse these words."""
    import click

    program = words[0].removeprefix(".venv/bin/")
    if program == "serve":
        from ray.serve.scripts import cli
    else:
        from ray.scripts.scripts import cli
    if len(words) < 2:
        return f"{program}: no subcommand"
    parent = click.Context(cli, info_name=program)
    command = cli.get_command(parent, words[1])
    if command is None:
        return f"{program}: no command {words[1]!r}"
    try:
        command.make_context(words[1], list(words[2:]), parent=parent)
    except click.exceptions.ClickException as error:
        return f"{program}: {error.format_message()}"
    return None


def make_targets() -> set[str]:
    targets: set[str] = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z][\w -]*):(?!=)", line)
        if match:
            targets.update(match.group(1).split())
    return targets


def check_curl(words: Sequence[str]) -> str | None:
    if shutil.which("curl") is None:
        return None  # the program is the system's; nothing of ours to check without it
    urls = [w for w in words if w.startswith("http")]
    if not urls or any(urlsplit(u).hostname not in ("127.0.0.1", "localhost") for u in urls):
        return f"curl must name a loopback URL: {urls}"
    for flag, value in itertools.pairwise(words):
        if flag in ("-d", "--data"):
            try:
                json.loads(value)
            except ValueError as error:
                return f"body is not JSON: {error}"
    return None


def check_pip(words: Sequence[str]) -> str | None:
    """`pip install NAME...`: only packages the project itself declares (pyproject.toml)."""
    if words[1:2] != ["install"]:
        return f"pip {' '.join(words[1:2])}: only `pip install` of the project's own dependencies"
    declared = (ROOT / "pyproject.toml").read_text()
    names = [w for w in words[2:] if not w.startswith("-")]
    unknown = [n for n in names if f'"{n}' not in declared]
    return f"pip install of packages pyproject.toml does not declare: {unknown}" if unknown or not names else None


def check_python_code(code: str) -> str | None:
    try:
        tree = compile(code, "<doc>", "exec", flags=0x400, dont_inherit=True)  # PyCF_ONLY_AST
    except SyntaxError as error:
        return f"python -c does not compile: {error}"
    import ast

    assert isinstance(tree, ast.Module)
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        for name in names:
            if importlib.util.find_spec(name.split(".")[0]) is None:
                return f"python -c imports {name}, which is not installed"
    return None


def missing_repo_paths(words: Sequence[str]) -> list[str]:
    """Arguments naming a file of the repository (configs/..., tests/...) that is not there."""
    return [w for w in words if re.fullmatch(r"(configs|tests|docs)/[\w./-]+", w.split("::")[0])
            and not (ROOT / w.split("::")[0]).exists()]


VLLM = ".venv-vllm/bin/vllm"


@functools.cache
def _vllm_help(sub: tuple[str, ...]) -> str:
    done = subprocess.run([str(ROOT / VLLM), *sub, "--help=all"], capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return done.stdout if done.returncode == 0 else ""


def check_vllm(words: Sequence[str]) -> str | None:
    """vLLM's own command from .venv-vllm (`make vllm-env`): where that environment exists, the
    subcommand exists and every --flag is one its --help lists (the vLLM tier runs it for real)."""
    if not (ROOT / VLLM).exists():
        return None
    sub = tuple(subcommand_words(words[1:]))
    text = _vllm_help(sub)
    if not text:
        return f"`vllm {' '.join(sub)} --help` failed"
    unknown = [w.split("=")[0] for w in words if w.startswith("--") and w.split("=")[0] not in text]
    return f"flags not in `vllm {' '.join(sub)} --help`: {unknown}" if unknown else None


def check_parse_only(words: Sequence[str]) -> str | None:
    """None when this simple command's program exists, the repository files it names are there,
    and its arguments parse."""
    missing = missing_repo_paths(words)
    if missing:
        return f"no such files in the repository: {missing}"
    program = words[0].removeprefix(".venv/bin/")
    ours = argparse_main(words)
    if ours is not None:
        return parse(*ours)
    if program in ("serve", "ray"):
        return click_parse(words)
    if program == "make":
        missing = [t for t in words[1:] if not t.startswith("-") and t not in make_targets()]
        return f"no make target {missing}" if missing else None
    if program == "curl":
        return check_curl(words)
    if program == VLLM:
        return check_vllm(words)
    if program in ("python", "python3") and len(words) >= 3 and words[1] == "-c":
        return check_python_code(words[2])
    if program in ("python", "python3") and words[1:3] == ["-m", "pytest"]:
        paths = [w for w in words[3:] if not w.startswith("-")]
        missing = [p for p in paths if not (ROOT / p.split("::")[0]).exists()]
        return f"no such test paths {missing}" if missing else None
    if program == "pip":
        return check_pip(words)
    if program == "bash":
        return None if (ROOT / words[1]).is_file() else f"no script {words[1]}"
    if program in ("export", "umask", "echo", "cd", "kill"):
        return None
    return f"no parse check for program {program!r}: add one to tests/docs/cliparse.py"


def subcommand_words(args: Sequence[str]) -> list[str]:
    """The leading subcommand words of a synopsis (lowercase words; stops at a flag, a
    placeholder, a path or an alternative)."""
    words: list[str] = []
    for arg in args:
        if not re.fullmatch(r"[a-z][a-z0-9-]*", arg):
            break
        words.append(arg)
    return words


def check_usage(words: Sequence[str], line: str) -> str | None:
    """A synopsis line: its program and subcommand exist and every --flag on it is in --help."""
    ours = argparse_main(words)
    if ours is None:
        return f"no usage check for {words[0]!r}: synopses are for our own commands"
    main, args = ours
    sub = subcommand_words(args)
    text = help_text(main, sub)
    if "usage:" not in text:
        return f"{' '.join(sub)} --help printed no usage"
    listed = set(re.findall(r"--[a-z][a-z0-9-]*", text))
    missing = sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line)) - listed - {"--help"})
    return f"flags not in `{' '.join([words[0], *sub])} --help`: {missing}" if missing else None
