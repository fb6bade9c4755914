#!/usr/bin/env bash
# Build what tests/gpu/run.sh installs on a GPU machine with no network: the project as a wheel
# and the few runtime packages that machine's Python 3.12 lacks, into tests/gpu/wheels (ignored).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
rm -rf "$here/wheels" && mkdir -p "$here/wheels"
"$py" -m pip wheel --quiet --no-deps --wheel-dir "$here/wheels" "$root"
"$py" -m pip download --quiet --dest "$here/wheels" --python-version 3.12 --only-binary=:all: \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  pydantic orjson httptools pyyaml prometheus-client nvidia-ml-py
ls "$here/wheels"
