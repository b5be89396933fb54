"""Ludic installs beside other code: ``pip install .`` into an environment that already has another torch
in the range the package declares keeps that torch (a GPU user's CUDA build is not replaced or
downgraded). The exact CPU build CI uses is pinned in scripts/setup.sh, not in the package metadata.

The torch already installed here is a stand-in, named as such: a wheel holding only the metadata of
torch 2.12.0 (a real other build is gigabytes, and only its version matters to pip's resolver). pip
resolves everything else for real (``--dry-run``: nothing is installed) from the configured index.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def torch_range() -> str:
    deps = re.search(r"^dependencies = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S).group(1)
    found = re.findall(r'"(torch[^"]*)"', deps)
    assert len(found) == 1, found
    return found[0]


def stand_in_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel with ``name``'s metadata at ``version`` and an empty package (a stand-in)."""
    files = {f"{name}/__init__.py": f"__version__ = {version!r}  # a stand-in: metadata only\n",
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: ludic-tests\nRoot-Is-Purelib: true\n"
                                                  "Tag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join(record + [f"{name}-{version}.dist-info/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def test_the_package_declares_a_torch_range_not_a_pin():
    spec = torch_range()
    assert "==" not in spec and ">=" in spec and "<" in spec, spec
    assert 'torch==' in (ROOT / "scripts" / "setup.sh").read_text()  # the exact build lives in the set-up


@pytest.mark.integration
def test_pip_install_keeps_another_torch_in_the_declared_range(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    wheel = stand_in_wheel(tmp_path, "torch", "2.12.0")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = [py, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["install", "--no-deps", str(wheel)], check=True, timeout=300, env=env)
    report = tmp_path / "report.json"
    out = subprocess.run(pip + ["install", "--dry-run", "--report", str(report), str(ROOT)],
                         capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    planned = {item["metadata"]["name"].lower(): item["metadata"]["version"]
               for item in json.loads(report.read_text())["install"]}
    assert "ludic" in planned and "transformers" in planned, sorted(planned)
    assert "torch" not in planned, f"pip would replace the installed torch 2.12.0 with {planned.get('torch')}"
