"""The README's five-task table from the study's run directories (``examples/ecosystem/study.sh``).

    python examples/ecosystem/table.py runs/study

Each ``<task>-s<seed>/summary.json`` holds the held-out success rate (greedy, 64 episodes, 95% Wilson
interval) before training ("base"), after the format cold start when there was one ("format_demos": then
the start of RL), and after training ("trained"). A task improves *beyond its interval* when the trained
score of the three seeds pooled (192 episodes) has its whole 95% interval above the start's interval
(the strict reading); the gain's own 95% interval (Newcombe's hybrid score interval for a difference of
two proportions, from the two Wilson intervals) is printed beside it, the usual test of a difference.
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

from ludic.eval.stats import wilson_interval


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def ci(m: dict) -> str:
    return f"{pct(m['success_rate'])} ({pct(m['success_ci95_low'])}-{pct(m['success_ci95_high'])})"


def gain_interval(p1: float, lo1: float, hi1: float, p2: float, lo2: float, hi2: float) -> tuple[float, float]:
    """95% interval of p2 - p1 (Newcombe 1998, method 10) from each proportion's Wilson interval."""
    d = p2 - p1
    return d - ((p2 - lo2) ** 2 + (hi1 - p1) ** 2) ** 0.5, d + ((hi2 - p2) ** 2 + (p1 - lo1) ** 2) ** 0.5


def wall_minutes(run: Path, summary: dict) -> float:
    """The run's wall time: ``wall_s`` in its summary, else config.json (written first) to summary.json (last)."""
    if "wall_s" in summary:
        return summary["wall_s"]["total"] / 60
    return ((run / "summary.json").stat().st_mtime - (run / "config.json").stat().st_mtime) / 60


def main(root: str) -> None:
    runs: dict[str, list[tuple[int, dict]]] = defaultdict(list)
    for path in sorted(Path(root).glob("*-s[0-9]*/summary.json")):
        task, seed = path.parent.name.rsplit("-s", 1)
        if seed.isdigit():
            runs[task].append((int(seed), json.loads(path.read_text())))
    print("| task (`--env`) | start (held out) | trained, per seed | trained, seeds pooled | intervals apart | "
          "gain (95% CI) | wall time per run |")
    print("|---|---|---|---|---|---|---|")
    for task, got in runs.items():
        got.sort(key=lambda x: x[0])
        first = got[0][1]
        start_stage = "format_demos" if "format_demos" in first else "base"
        start = first[start_stage]
        label = " (after format demos; base " + pct(first["base"]["success_rate"]) + ")" if start_stage != "base" else ""
        wins = sum(round(s["trained"]["success_rate"] * s["trained"]["episodes"]) for _, s in got)
        n = sum(s["trained"]["episodes"] for _, s in got)
        lo, hi = wilson_interval(wins, n)
        beyond = "yes" if lo > start["success_ci95_high"] else "no"
        g_lo, g_hi = gain_interval(start["success_rate"], start["success_ci95_low"], start["success_ci95_high"],
                                   wins / n, lo, hi)
        gain = f"{100 * (wins / n - start['success_rate']):+.1f} ({100 * g_lo:+.1f} to {100 * g_hi:+.1f})"
        worse = any(s["trained"]["success_rate"] < start["success_rate"] for _, s in got)
        walls = [wall_minutes(Path(root) / f"{task}-s{seed}", s) for seed, s in got]
        lo_w, hi_w = round(min(walls)), round(max(walls))
        wall = f"{lo_w} min" if lo_w == hi_w else f"{lo_w}-{hi_w} min"
        per_seed = ", ".join(f"s{seed} {pct(s['trained']['success_rate'])}" for seed, s in got)
        print(f"| {task} (`{first['env']}`) | {ci(start)}{label} | {per_seed}{' (one below its start)' if worse else ''} "
              f"| {pct(wins / n)} ({pct(lo)}-{pct(hi)}), {n} ep. | {beyond} | {gain} | {wall} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/study")
