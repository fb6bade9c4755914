#!/usr/bin/env bash
# The GPU check, for a machine with NVIDIA GPUs and no network (one GPU is enough): Python 3.12
# with torch, no Ray, no vLLM needed. Installs the project from tests/gpu/wheels (made by
# tests/gpu/prepare.sh), then: NVML discovery against `nvidia-smi topo -m` on the same machine,
# link health counters sampled over 2 s, host<->device copies and (2+ GPUs) peer copies with
# torch, and — only where vLLM is installed — one replica behind the router. Ends with one
# summary line saying what ran, what passed and what was skipped and why. Under 8 minutes.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$(mktemp -d)}"
py="${PYTHON:-python3}"
site="$(mktemp -d)/site"  # beside the machine's own packages (its python3 is the one with torch)
# only what such a machine lacks; its own pyyaml, prometheus-client and nvidia-ml-py are used
"$py" -m pip install --quiet --no-index --find-links "$here/wheels" --no-deps --target "$site" \
  "$here"/wheels/{isleserve,pydantic,annotated_types,typing_extensions,typing_inspection,orjson,httptools}*.whl \
  2>&1 | grep -v "^WARNING" || true
cd "$(mktemp -d)"  # import the installed project, not a source tree
PYTHONPATH="$site" PYTHONUNBUFFERED=1 timeout 420 "$py" -X faulthandler "$here/check.py" --out "$out"
