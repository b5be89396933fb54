"""Serving code stays apart from training code: importing the server package (and the names it
shares with clients) loads neither ludic.training nor torch nor vLLM (fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys


def test_server_package_imports_light() -> None:
    code = ("import sys, ludic.inference.vllm_server, ludic.inference.vllm_server.__main__; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm') "
            "or m.startswith('ludic.training')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
