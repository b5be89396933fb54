"""Run untrusted Python in a subprocess that cannot hurt the host.

Limits, each enforced by the kernel, not by the program's good will:

- **time**: a wall-clock timeout; the whole process group and every process in the sandbox's
  cgroup are killed.
- **memory**: ``RLIMIT_AS`` (address space) for every process; an allocation past it fails.
- **processes**: a pids cgroup (v2 ``pids.max`` or v1 ``/sys/fs/cgroup/pids``) caps the
  process count, so a fork bomb stalls at the cap and is killed with the rest. Root ignores
  ``RLIMIT_NPROC``; without a writable cgroup the sandbox refuses to run (``SandboxUnavailable``)
  unless ``max_pids=None``.
- **network**: a fresh network namespace (``unshare -n``): no interface but a down loopback.
- **files**: a temporary working directory removed afterwards; output goes to a file capped by
  ``RLIMIT_FSIZE`` (a program printing forever is stopped at the cap, not buffered in the host).

    result = run_python("print(input())", stdin="hi", timeout_s=5)
    result.ok, result.stdout          # True, "hi\\n"
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path


class SandboxUnavailable(RuntimeError):
    """The machine lacks a mechanism a requested limit needs (cgroups, network namespaces)."""


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed program did."""

    stdout: str
    stderr: str
    returncode: int | None
    """Exit status (negative: killed by that signal); None when it was killed for the timeout."""
    reason: str | None
    """Why it did not finish normally: timeout, memory, output, processes, network (it tried to
    connect), error (another non-zero exit); None: ok."""
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.reason is None


_CGROUP_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


def _pids_root() -> Path | None:
    """A writable cgroup hierarchy with the pids controller (v1 or v2), or None."""
    for root in _CGROUP_ROOTS:
        if (root / "pids.max").exists() or (root / "cgroup.procs").exists():
            v2 = (root / "cgroup.controllers").exists()
            if v2 and "pids" not in (root / "cgroup.controllers").read_text().split():
                continue
            if not v2 and not root.name == "pids":
                continue
            if os.access(root, os.W_OK):
                return root
    return None


def _unshare() -> list[str] | None:
    exe = shutil.which("unshare")
    if exe is None:
        return None
    ok = subprocess.run([exe, "-n", "true"], capture_output=True).returncode == 0
    return [exe, "-n"] if ok else None


_NET: list[list[str] | None] = []


def network_isolation() -> list[str] | None:
    """The command prefix that gives a process an empty network namespace (cached), or None."""
    if not _NET:
        _NET.append(_unshare())
    return _NET[0]


def run_python(
    code: str,
    stdin: str = "",
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    max_pids: int | None = 32,
    network: bool = False,
    max_output_bytes: int = 4 << 20,
    python: str | None = None,
) -> SandboxResult:
    """Run ``code`` with ``stdin`` under the module's limits and return what it printed."""
    net_prefix: list[str] = []
    if not network:
        prefix = network_isolation()
        if prefix is None:
            raise SandboxUnavailable("no network namespace (unshare -n) available: cannot cut the network")
        net_prefix = prefix
    cg_root = _pids_root() if max_pids is not None else None
    if max_pids is not None and cg_root is None:
        raise SandboxUnavailable("no writable pids cgroup: cannot cap processes (root ignores RLIMIT_NPROC)")
    work = Path(tempfile.mkdtemp(prefix="ludic-sandbox-"))
    cgroup = None
    try:
        if cg_root is not None:
            cgroup = cg_root / f"ludic-sandbox-{uuid.uuid4().hex[:12]}"
            cgroup.mkdir()
            (cgroup / "pids.max").write_text(str(max_pids))
        (work / "main.py").write_text(code)
        (work / "stdin.txt").write_text(stdin)
        out_path, err_path = work / "stdout.txt", work / "stderr.txt"

        def limit() -> None:  # in the child, before exec
            os.setsid()
            if cgroup is not None:
                (cgroup / "cgroup.procs").write_text(str(os.getpid()))
            mem = memory_mb << 20
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
            resource.setrlimit(resource.RLIMIT_FSIZE, (max_output_bytes, max_output_bytes))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

        cmd = net_prefix + [python or sys.executable, "-I", "main.py"]
        t0 = time.perf_counter()
        with open(work / "stdin.txt", "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
            proc = subprocess.Popen(cmd, cwd=work, stdin=fin, stdout=fout, stderr=ferr, preexec_fn=limit,
                                    env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "HOME": str(work)})
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_all(proc, cgroup)
        duration = time.perf_counter() - t0
        stdout = out_path.read_bytes()[:max_output_bytes].decode("utf-8", "replace")
        stderr = err_path.read_bytes()[-20000:].decode("utf-8", "replace")
        rc = None if timed_out else proc.returncode
        events = (cgroup / "pids.events").read_text() if cgroup is not None and (cgroup / "pids.events").exists() else ""
        forked_out = "max" in events and not events.strip().endswith(" 0")
        reason = _reason(timed_out, rc, stderr, forked_out)
        return SandboxResult(stdout, stderr, rc, reason, duration)
    finally:
        if cgroup is not None:
            _kill_cgroup(cgroup)
            for _ in range(50):
                try:
                    cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
        shutil.rmtree(work, ignore_errors=True)


def _reason(timed_out: bool, rc: int | None, stderr: str, forked_out: bool) -> str | None:
    if timed_out:
        return "timeout"
    if rc == 0:
        return None
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "memory"
    if rc == -signal.SIGXFSZ or "File too large" in stderr:  # Python ignores SIGXFSZ: the write fails
        return "output"
    if "Network is unreachable" in stderr:
        return "network"
    if forked_out or "Resource temporarily unavailable" in stderr:
        return "processes"
    return "error"


def _kill_all(proc: subprocess.Popen, cgroup: Path | None) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if cgroup is not None:
        _kill_cgroup(cgroup)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait
        pass


def _kill_cgroup(cgroup: Path) -> None:
    """SIGKILL every process in ``cgroup`` until it is empty (a fork bomb forks while we kill)."""
    procs = cgroup / "cgroup.procs"
    for _ in range(200):
        try:
            pids = [int(p) for p in procs.read_text().split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
