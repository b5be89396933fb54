"""Run untrusted Python in a subprocess that cannot hurt the host.

The program runs inside bubblewrap (``bwrap``, Debian's ``bubblewrap``; ``scripts/setup.sh``
installs it), which builds the sandbox from kernel namespaces. Every limit is enforced by the
kernel, not by the program's good will:

- **who**: an unprivileged user (when the trainer is root, bwrap itself runs as ``nobody``, so the
  program is ``nobody`` on the host too, with no capabilities), in its own user, PID, IPC, UTS and
  cgroup namespaces: it sees no host process (it cannot signal the trainer) and dies with it.
- **files**: a read-only view of the system's ``/usr`` (the system Python lives there) and nothing
  else of the host: no home folder, no ``/etc``, no ``/tmp``, no trainer file. One writable scratch
  folder, a tmpfs capped at ``scratch_mb``; the program's own source is handed to bwrap as an open
  file and bound read-only. On the host, the folder holding the program, its input and its output
  is the trainer's alone (0700, its files 0600): no other local user reads them.
- **network**: a fresh network namespace: no interface but a down loopback.
- **time**: a wall-clock timeout; the whole process group and every process in the sandbox's
  cgroup are killed.
- **memory**: ``RLIMIT_AS`` (address space) for every process; an allocation past it fails.
- **processes**: a pids cgroup (v2 ``pids.max`` or v1 ``/sys/fs/cgroup/pids``) caps the process
  count, so a fork bomb stalls at the cap and is killed with the rest. The cap always applies:
  ``max_pids`` must be a number (``None`` is refused with a ``ValueError``). ``RLIMIT_NPROC`` is no
  fallback: it counts every process of the host user (the trainer's threads, other sandboxes).
- **output**: stdout and stderr go to host files capped by ``RLIMIT_FSIZE`` (a program printing
  forever is stopped at the cap, not buffered in the host).

Without bubblewrap or a working user namespace, or without a writable pids cgroup, the sandbox
refuses to run (``SandboxUnavailable``) rather than run unconfined.

    result = run_python("print(input())", stdin="hi", timeout_s=5)
    result.ok, result.stdout          # True, "hi\\n"
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
"""The uid and gid the sandbox runs as when the trainer is root."""
SYSTEM_PYTHON = "/usr/bin/python3"
"""The interpreter inside the sandbox: the system's, under the read-only ``/usr`` (the trainer's own
Python often lives in a home folder the sandbox does not show)."""


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
    """Why it did not finish normally: timeout, memory, output (past the output cap), disk (past the
    scratch folder's cap), filesystem (it reached for a file outside the sandbox), processes, network
    (it tried to connect), error (another non-zero exit); None: ok."""
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


def _drop_privileges() -> None:
    """In the child: become ``nobody`` when the trainer is root (bwrap then maps the sandbox to that
    unprivileged user on the host too)."""
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)


def _private(path: str, flags: int) -> int:
    """An ``open`` opener: a file created readable and writable by its owner only (0600)."""
    return os.open(path, flags, 0o600)


def _bwrap_args(main_fd: int, python: str, scratch_mb: int, network: bool) -> list[str]:
    """bwrap's command line; ``main_fd`` is an open file of the program (bwrap copies it in, so the trainer's
    private folder holding it need not be readable by the sandbox's user)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed: `apt-get install bubblewrap` "
                                 "(scripts/setup.sh does); the sandbox will not run programs unconfined")
    args = [bwrap, "--unshare-all", *(["--share-net"] if network else []), "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/sandbox/scratch",
            "--setenv", "PYTHONHASHSEED", "0", "--setenv", "LANG", "C.UTF-8", "--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # merged /usr: the top-level links
        link = Path("/") / top
        if link.is_symlink():
            args += ["--symlink", os.readlink(link), str(link)]
        elif link.is_dir():
            args += ["--ro-bind", str(link), str(link)]
    if not python.startswith("/usr/"):
        prefix = str(Path(python).resolve().parent.parent)
        args += ["--ro-bind", prefix, prefix]
    return args + ["--proc", "/proc", "--dev", "/dev", "--size", str(scratch_mb << 20), "--tmpfs", "/sandbox/scratch",
                   "--ro-bind-data", str(main_fd), "/sandbox/main.py", "--chdir", "/sandbox/scratch",
                   python, "-I", "-S", "/sandbox/main.py"]


_PROBED: dict[tuple[str, bool], str | None] = {}


def sandbox_problem(python: str = SYSTEM_PYTHON, network: bool = False) -> str | None:
    """Why the sandbox cannot run here (bubblewrap missing, no user namespaces, no interpreter), or
    None; probed once per process by running ``pass`` in it."""
    key = (python, network)
    if key not in _PROBED:
        with tempfile.TemporaryDirectory(prefix="ludic-sandbox-probe-") as d:
            with open(Path(d) / "main.py", "w", opener=_private) as f:
                f.write("pass\n")
            try:
                with open(Path(d) / "main.py", "rb") as main:
                    out = subprocess.run(_bwrap_args(main.fileno(), python, 1, network), capture_output=True,
                                         text=True, timeout=30, preexec_fn=_drop_privileges, cwd="/",
                                         pass_fds=(main.fileno(),))
                _PROBED[key] = None if out.returncode == 0 else (
                    f"bubblewrap could not build the sandbox (exit {out.returncode}): {out.stderr.strip()[-300:]}")
            except SandboxUnavailable as e:
                _PROBED[key] = str(e)
            except (OSError, subprocess.TimeoutExpired) as e:
                _PROBED[key] = f"bubblewrap failed to start: {e}"
    return _PROBED[key]


def run_python(
    code: str,
    stdin: str = "",
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    max_pids: int = 32,
    network: bool = False,
    max_output_bytes: int = 4 << 20,
    scratch_mb: int = 64,
    python: str | None = None,
) -> SandboxResult:
    """Run ``code`` with ``stdin`` under the module's limits and return what it printed.
    ``max_pids``: the processes the program may have at once (the pids cgroup's cap; required).
    ``python``: the interpreter inside (default ``SYSTEM_PYTHON``; one outside ``/usr`` has its
    installation folder bound read-only too)."""
    if isinstance(max_pids, bool) or not isinstance(max_pids, int) or max_pids < 1:
        raise ValueError(f"max_pids must be a number of processes >= 1, got {max_pids!r}: the sandbox always caps "
                         "processes (a fork bomb would otherwise run until the timeout)")
    python = python or SYSTEM_PYTHON
    problem = sandbox_problem(python, network)
    if problem is not None:
        raise SandboxUnavailable(problem)
    cg_root = _pids_root()
    if cg_root is None:
        raise SandboxUnavailable("no writable pids cgroup: cannot cap processes (RLIMIT_NPROC would count every "
                                 "process of the host user, not the sandbox's)")
    work = Path(tempfile.mkdtemp(prefix="ludic-sandbox-"))  # 0700: the trainer's alone
    cgroup: Path | None = None
    try:
        cgroup = cg_root / f"ludic-sandbox-{uuid.uuid4().hex[:12]}"
        cgroup.mkdir()
        (cgroup / "pids.max").write_text(str(max_pids))
        for name, text in (("main.py", code), ("stdin.txt", stdin)):
            with open(work / name, "w", opener=_private) as f:
                f.write(text)
        out_path, err_path = work / "stdout.txt", work / "stderr.txt"

        def limit() -> None:  # in the child, before exec: as root, then drop to nobody
            os.setsid()
            if cgroup is not None:
                (cgroup / "cgroup.procs").write_text(str(os.getpid()))
            mem = memory_mb << 20
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
            resource.setrlimit(resource.RLIMIT_FSIZE, (max_output_bytes, max_output_bytes))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
            _drop_privileges()

        t0 = time.perf_counter()
        with open(work / "main.py", "rb") as main, open(work / "stdin.txt", "rb") as fin, \
                open(out_path, "wb", opener=_private) as fout, open(err_path, "wb", opener=_private) as ferr:
            cmd = _bwrap_args(main.fileno(), python, scratch_mb, network)
            proc = subprocess.Popen(cmd, cwd="/", stdin=fin, stdout=fout, stderr=ferr, preexec_fn=limit, env={},
                                    pass_fds=(main.fileno(),))
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
    if "No space left on device" in stderr:
        return "disk"
    if any(f"{e}: '/" in stderr for e in ("Read-only file system", "No such file or directory", "Permission denied")):
        return "filesystem"  # an absolute path outside the sandbox's view
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
