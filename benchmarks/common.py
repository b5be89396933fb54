"""Helpers shared by the benchmarks: the machine header, the matmul peak, the ratio table, memory.

Every benchmark compares Ludic with a peer measured in the same run, on the same machine, and
reports ratios. A part returns a dict whose ``"rows"`` are table rows made by ``row``:

    part  what  ludic  peer  ratio  goal  met?

``format_table`` lays the rows out for the console. The pure helpers here (``row``,
``format_table``, ``fmt``, ``cpu_info``) import nothing heavy, so tests can call them.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
"""The CPU flags that decide which dtype is fast (printed in every header)."""


def cpu_info(cpuinfo: str | None = None) -> dict[str, Any]:
    """CPU model name, the flags of ``FLAGS`` it has, and the core count (from /proc/cpuinfo)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    name, flags = platform.processor() or platform.machine(), set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            name = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {"cpu": name, "flags": [f for f in FLAGS if f in flags], "cores": os.cpu_count()}


def machine_info(dtype: str) -> dict[str, Any]:
    """``cpu_info`` plus torch's version, threads and the dtype the run uses."""
    import torch

    info = cpu_info()
    info.update(torch=torch.__version__, torch_threads=torch.get_num_threads(), dtype=dtype,
                cuda=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    return info


def header(info: dict[str, Any]) -> str:
    """One line naming the machine: what every ratio below was measured on."""
    flags = " ".join(info.get("flags") or []) or "none of " + "/".join(FLAGS)
    gpu = f" | gpu {info['cuda']}" if info.get("cuda") else ""
    return (f"cpu: {info['cpu']} | flags: {flags} | cores: {info['cores']} | torch {info.get('torch', '?')} "
            f"({info.get('torch_threads', '?')} threads) | dtype {info.get('dtype', '?')}{gpu}")


def precision_of(model: Any, optimizer: Any = None, autocast: str | None = None) -> str:
    """How a side computes and keeps its weights: the frozen and the trained parameters' dtypes, the
    dtype of what the optimizer steps (fp32 masters or the parameters themselves) and of its state,
    and an autocast dtype where the side runs under one (TRL's ``bf16=True``)."""
    def kinds(ps: Iterable[Any]) -> str:
        names = sorted({str(p.dtype).replace("torch.", "") for p in ps})
        return "/".join(names) or "-"

    params = list(model.parameters())
    text = (f"frozen weights {kinds(p for p in params if not p.requires_grad)}, trained "
            f"{kinds(p for p in params if p.requires_grad)}")
    if optimizer is not None:
        stepped = [p for g in optimizer.param_groups for p in g["params"]]
        state = [t for s in optimizer.state.values() for k, t in s.items() if k != "step" and hasattr(t, "dtype")]
        text += f"; optimizer steps {kinds(stepped)}, state {kinds(state)}"
    return text + (f"; autocast {autocast}" if autocast else "")


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def matmul_peak_gflops(dtype: str, n: int = 2048, seconds: float = 2.0) -> dict[str, Any]:
    """The machine's dense matmul rate in ``dtype``: a square ``n x n`` ``torch.matmul`` repeated
    for about ``seconds`` (after one warm-up), 2 n^3 FLOPs each. The size grows from 256 to ``n``
    only while one product stays under a second, so a dtype without hardware support (bf16 on an
    AVX2 CPU: ~0.3 GFLOP/s) is measured on a smaller product instead of taking minutes."""
    import torch

    dt = getattr(torch, dtype)
    size = 256
    while True:
        a, b = torch.randn(size, size).to(dt), torch.randn(size, size).to(dt)
        t0 = time.perf_counter()
        torch.matmul(a, b)
        one = time.perf_counter() - t0
        if size >= n or one * 8 > 1.0:
            break
        size *= 2
    reps, t0 = 0, time.perf_counter()
    while reps < 3 or time.perf_counter() - t0 < seconds:
        torch.matmul(a, b)
        reps += 1
    el = time.perf_counter() - t0
    return {"gflops": 2 * size**3 * reps / el / 1e9, "n": size, "repeats": reps, "dtype": dtype}


# ----------------------------------------------------------------------------- the table


def row(part: str, what: str, ludic: float | None, peer: float | None, ratio: float | None, *,
        unit: str = "", ratio_kind: str = "x", goal: str = "-", met: bool | None = None) -> dict[str, Any]:
    """One table row. ``ratio_kind`` is "x" (a factor) or "%" (an overhead: ratio - 1 in percent)."""
    return {"part": part, "what": what, "ludic": ludic, "peer": peer, "ratio": ratio, "unit": unit,
            "ratio_kind": ratio_kind, "goal": goal, "met": met}


def at_least(value: float | None, goal: float) -> bool | None:
    return None if value is None or value != value else value >= goal


def at_most(value: float | None, goal: float) -> bool | None:
    return None if value is None or value != value else value <= goal


def fmt(x: float | None, unit: str = "") -> str:
    """A number for the table: 3 significant digits, "-" for missing."""
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    if isinstance(x, str):
        return x
    ax = abs(x)
    s = f"{x:.0f}" if ax >= 100 else f"{x:.1f}" if ax >= 10 else f"{x:.2f}" if ax >= 0.1 else f"{x:.3g}"
    return f"{s} {unit}".strip()


def fmt_ratio(r: dict[str, Any]) -> str:
    x = r.get("ratio")
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    if r.get("ratio_kind") == "%":
        return f"{(x - 1) * 100:+.1f}%"
    return f"{x:.2f}x"


def format_table(rows: Iterable[dict[str, Any]]) -> str:
    """The rows as an aligned text table (columns: part, what, ludic, peer, ratio, goal, met?)."""
    head = ("part", "what", "ludic", "peer", "ratio", "goal", "met?")
    cells = [head]
    for r in rows:
        met = r.get("met")
        cells.append((r["part"], r["what"], fmt(r.get("ludic"), r.get("unit", "")), fmt(r.get("peer"), r.get("unit", "")),
                      fmt_ratio(r), r.get("goal") or "-", "-" if met is None else ("yes" if met else "NO")))
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    right = {2, 3, 4}
    lines = []
    for k, c in enumerate(cells):
        lines.append("  ".join(v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(c, widths))))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


# ----------------------------------------------------------------------------- memory


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS; False where Linux refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def rss_mb() -> dict[str, float]:
    """Current (VmRSS) and peak (VmHWM) resident memory of this process, in MB, and ru_maxrss."""
    import resource

    out = {"maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                out["rss_mb" if key == "VmRSS" else "peak_mb"] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out
