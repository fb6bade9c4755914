"""The docs' commands that are not run here parse, and their synopses name real flags.

`sh parse-only` and `sh local` blocks (tests/docs/mdblocks.py gives the convention): each simple command's
program exists and its arguments parse with the program's own parser (tests/docs/cliparse.py).
What runs each of them for real is named in REAL_RUNS, by test file; a parse-only command whose
program and subcommand are not there fails, so every one has a test that runs it.
`sh usage` blocks: every --flag of a synopsis is one its subcommand's --help lists.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.docs.cliparse import argparse_main, check_parse_only, check_usage, missing_repo_paths, subcommand_words
from tests.docs.mdblocks import OTHER_KINDS, ROOT, SHELL_KINDS, Command, all_blocks, commands, simple_commands

pytestmark = pytest.mark.unit

# program + subcommand of a parse-only command -> the test (a path under tests/) that runs it for
# real, and how
REAL_RUNS: dict[str, str] = {
    "make run": "e2e/test_serve_run_local.py",           # `isle run configs/local.yaml`, what `make run` runs
    "make test": "house/test_import_graph.py",           # CI runs `make test` itself (.ci/run); one of its checks
    "make test-vllm": "vllm/test_vllm_router.py",        # the vLLM tier `make test-vllm` runs
    "make vllm-env": "vllm/test_vllm_router.py",         # its environment, built by tests/vllm/setup.sh
    "isle run": "e2e/test_serve_run_local.py",           # starts `isle run`, probes every listener, stops it
    "isle status": "isleserve/test_status_cli.py",       # `isle status` against a router's admin API
    "curl": "e2e/test_serve_run_local.py",               # a chat completion against the running product
    "python -c": "e2e/test_serve_run_local.py",          # the openai client against the running product
    "serve deploy": "e2e/test_serve_deploy.py",          # `serve deploy` on `ray start --head` with a token
    "serve status": "e2e/test_serve_deploy.py",
    "serve shutdown": "e2e/test_serve_deploy.py",
    "ray start": "e2e/test_serve_deploy.py",
    "ray get-auth-token": "e2e/test_serve_deploy.py",
    "export": "e2e/test_serve_deploy.py",
    "umask": "e2e/test_serve_deploy.py",
    "python -m router": "router/test_router.py",         # the router served from its config on loopback
    "python -m router bench": "router/test_bench_parts.py",  # the bench's parts on loopback (not the full run)
    "python -m pools sim-engine": "simengine/test_generation.py",  # the engine process answers as vLLM does
    "python -m pools mark-link": "control/test_controller_cluster.py",  # the command on a fake Ray cluster
    "python -m pools replace": "control/test_controller_cluster.py",  # the command on the same cluster
    "python -m pools stop-controller": "e2e/test_serve_deploy.py",
    "python -m pools bench": "pools/test_cli.py",        # the placement bench on 2 racks; `bench engine`: none
    "python -m pools node-labels": "pools/test_node_labels.py",
    "python -m loadtest run": "loadtest/test_live.py",   # the live driver against the real router
    "python -m loadtest chaos": "e2e/test_chaos.py",     # the half-length timeline (--scale 0.5)
    "python -m loadtest compare": "e2e/test_compare_live.py",  # live mode; sim mode in loadtest/test_sim.py
    "python -m loadtest calibrate": "loadtest/test_calibrate.py",
    "python -m loadtest bench": "loadtest/test_sim.py",
    "python -m loadtest size": "loadtest/test_sim.py",
    "python -m pytest": "security/test_http_fuzz.py",    # the adversarial suite docs/security.md names
    ".venv-vllm/bin/vllm bench": "vllm/test_vllm_bench.py",  # vllm bench serve through the router (vLLM tier)
    "bash": "vllm/test_vllm_router.py",                  # tests/gpu/*.sh run on a GPU machine; tests/vllm/setup.sh
}


def _key(words: list[str]) -> str:
    """`program subcommand` of a command, as REAL_RUNS names them."""
    program = words[0].removeprefix(".venv/bin/")
    if program in ("python", "python3") and words[1:2] == ["-c"]:
        return "python -c"
    if program in ("python", "python3") and words[1:2] == ["-m"]:
        sub = subcommand_words(words[3:])[:1]
        full = " ".join(["python -m", words[2], *sub])
        return full if full in REAL_RUNS else f"python -m {words[2]}"
    sub = subcommand_words(words[1:])[:1]
    full = " ".join([program, *sub])
    return full if full in REAL_RUNS else program


def _test_file_exists(name: str) -> bool:
    return (ROOT / "tests" / name).is_file()


PARSE_ONLY = commands("sh parse-only") + commands("sh local")
USAGE = commands("sh usage")


def test_every_block_has_a_known_kind() -> None:
    unknown = [f"{b.path.relative_to(ROOT)}:{b.line} ```{b.info}" for b in all_blocks()
               if b.info not in SHELL_KINDS | OTHER_KINDS]
    assert not unknown, "fenced blocks must say sh, sh parse-only, sh usage, sh local, yaml, json or text"


def test_the_docs_have_commands_of_each_kind() -> None:
    assert len(commands("sh")) >= 10 and len(PARSE_ONLY) >= 10 and len(USAGE) >= 10


@pytest.mark.parametrize("command", PARSE_ONLY, ids=lambda c: c.id)
def test_parse_only_command_parses(command: Command) -> None:
    for words in simple_commands(command.text):
        problem = check_parse_only(words)
        assert problem is None, f"{command.id}: {command.text}\n{problem}"
        key = _key(words)
        assert key in REAL_RUNS, f"{command.id}: name the test that runs `{key}` for real in REAL_RUNS"
        assert _test_file_exists(REAL_RUNS[key]), f"{REAL_RUNS[key]} is gone: which test runs `{key}` now?"


@pytest.mark.parametrize("command", USAGE, ids=lambda c: c.id)
def test_usage_line_names_real_flags(command: Command) -> None:
    code = command.text.split(" #")[0]
    words = code.split()
    assert argparse_main(words) is not None, f"{command.id}: a synopsis of our own commands only"
    problem = check_usage(words, code)
    missing = missing_repo_paths(words)
    assert not missing, f"{command.id}: no such files {missing}"
    assert problem is None, f"{command.id}: {command.text}\n{problem}"


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.info in ("yaml", "json")],
                         ids=lambda b: f"{Path(b.path).relative_to(ROOT)}:{b.line}")
def test_data_blocks_parse(block: object) -> None:
    from tests.docs.mdblocks import Block

    assert isinstance(block, Block)
    if block.info == "yaml":
        yaml.safe_load(block.text)
    else:
        json.loads(block.text)


def test_links_between_pages_resolve() -> None:
    import re

    from tests.docs.mdblocks import doc_files

    def slugs(page: Path) -> set[str]:
        """GitHub's anchors for a page's headings."""
        heads = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.MULTILINE)
        return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}

    broken = []
    for path in doc_files():
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", path.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            page = path.parent / target if target else path
            if not page.exists():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
            elif anchor and page.suffix == ".md" and anchor not in slugs(page):
                broken.append(f"{path.relative_to(ROOT)} -> {target}#{anchor}")
    assert not broken, broken


def test_test_files_the_docs_name_exist() -> None:
    """A test named in the docs (`tests/x/test_y.py`, or `test_y.py` alone) is still there."""
    import re

    from tests.docs.mdblocks import doc_files

    missing = []
    for path in doc_files():
        text = path.read_text()
        for name in sorted(set(re.findall(r"(?<![\w/])(tests/[\w/]+\.py|test_\w+\.py)", text))):
            exists = (ROOT / name).exists() if name.startswith("tests/") else any((ROOT / "tests").rglob(name))
            if not exists and "*" not in name:
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, missing


@pytest.mark.parametrize("words", [
    ["python", "-m", "pools", "plan", "--topology", "hgx-h100", "--no-such-flag"],
    ["python", "-m", "topology", "no-such-command"],
    ["python", "-m", "loadtest", "no-such-command"],
    ["isle", "no-such-command"],
    [".venv/bin/serve", "deploy", "configs/local.yaml", "--no-such-flag"],
    ["ray", "no-such-command"],
    ["make", "no-such-target"],
    ["curl", "-d", "{not json", "http://127.0.0.1:8000/v1/models"],
    ["curl", "http://example.com/v1/models"],
    ["python", "-c", "import no_such_module_here"],
    ["no-such-program", "--help"],
    [".venv/bin/pip", "install", "no-such-package"],
    ["serve", "deploy", "configs/no-such.yaml"],
], ids=" ".join)
def test_the_parse_check_catches_what_it_should(words: list[str]) -> None:
    assert check_parse_only(words) is not None


def test_the_usage_check_catches_a_flag_that_is_not_there() -> None:
    line = "python -m pools cost decode --model M --no-such-flag X"
    assert check_usage(line.split(), line) is not None
    good = "python -m pools cost decode --model M --gpu G --tp T --batch B --context C [--dtype bf16|fp8] --format json"
    assert check_usage(good.split(), good) is None


def test_the_readme_links_every_page_and_the_decisions_index_every_decision() -> None:
    readme = (ROOT / "README.md").read_text()
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert [p.name for p in pages if f"(docs/{p.name})" not in readme] == []
    index = (ROOT / "docs" / "decisions" / "README.md").read_text()
    decisions = sorted((ROOT / "docs" / "decisions").glob("*.md"))
    assert [p.name for p in decisions if p.name != "README.md" and f"({p.name})" not in index] == []
    assert len(readme.splitlines()) < 250
