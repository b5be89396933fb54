"""scripts/gpu_check.sh where there is no GPU (CI, this machine): it says so and exits 0 at once,
installing and writing nothing. Forced past that with a Python that fails, it still reports every
check and writes its one table as markdown and JSON. A fake ``nvidia-smi`` that fails stands in for
the GPU-less machine, so these tests never start the real check on a machine that has a GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _exe(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def _run(tmp_path: Path, *args: str, fake_smi: bool = True, **env: str) -> subprocess.CompletedProcess:
    """The script from ``tmp_path`` (its default results folder is relative to the caller)."""
    bindir = tmp_path / "bin"
    if fake_smi:  # what nvidia-smi prints on a machine with the utilities but no driver
        _exe(bindir / "nvidia-smi", "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                                    "driver.\"; exit 9")
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_") and k != "OUT"}
    full.update(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", GPU_CHECK_BUNDLE=str(tmp_path / "bundle"), **env)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=full, capture_output=True, text=True,
                          timeout=120)


def test_the_script_parses():
    res = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_shellcheck_is_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    res = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    (tmp_path / "bundle" / "wheels").mkdir(parents=True)  # a bundle it must not install
    res = _run(tmp_path, OUT=str(tmp_path / "out"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "NO GPU on this machine" in res.stdout and "couldn't communicate" in res.stdout
    assert "nothing installed" in res.stdout
    assert not (tmp_path / "out").exists() and not (tmp_path / "gpu_check_results").exists()


def test_without_nvidia_smi_it_says_so_and_exits_0(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi (the fake one in the other test stands in)")
    res = _run(tmp_path, fake_smi=False)
    assert res.returncode == 0 and "NO GPU on this machine (nvidia-smi not found)" in res.stdout, res.stdout


def test_an_unknown_check_is_refused(tmp_path):
    res = _run(tmp_path, "--only", "tests,bogus")
    assert res.returncode == 2 and "unknown check 'bogus'" in res.stderr


def test_forced_run_reports_every_check_and_writes_the_table(tmp_path):
    """GPU_CHECK_FORCE=1 past the missing GPU, with a Python that fails: the env check fails, every
    later check is reported as skipped, the exit status is 1, and the table is in both files."""
    stub = _exe(tmp_path / "bin" / "stub-python", "echo 'stub python: nothing here' >&2; exit 1")
    res = _run(tmp_path, GPU_CHECK_FORCE="1", GPU_CHECK_PYTHON=str(stub))
    assert res.returncode == 1, res.stdout + res.stderr
    out = tmp_path / "gpu_check_results"
    data = json.loads((out / "gpu_check.json").read_text())
    status = {c["check"].split(":")[0].split(" ")[0]: c["status"] for c in data["checks"]}
    assert status == {"install": "skip", "env": "fail", "models": "skip", "tests": "skip", "grpo": "skip",
                      "push": "skip", "train": "skip"}, data
    assert data["gpu_count"] == 0 and data["failed"] == 1 and data["complete"] is True
    assert "couldn't communicate" in data["no_gpu"]
    env = next(c for c in data["checks"] if c["check"] == "env")
    assert "stub python" in env["note"]
    md = (out / "gpu_check.md").read_text()
    assert "| check" in md and "| status |" in md and "| env " in md
    assert "| check" in res.stdout  # the same table ends the output
    assert (out / "gpu_check.log").exists()
