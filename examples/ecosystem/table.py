"""The README's five-task table from the study's run directories (``examples/ecosystem/study.sh``).

    python examples/ecosystem/table.py runs/study_v3

    python examples/ecosystem/table.py runs/study_v3 --larger runs/study_v3/eval256

Each ``<task>-s<seed>/summary.json`` holds the held-out success rate (greedy, 64 episodes, 95% Wilson
interval) before training ("base"), after the format cold start when there was one ("format_demos": then
the start of RL), and after training ("trained"). The seeds' trained scores are averaged; the mean's
interval is the Wilson interval on one seed's episodes, not on their sum, because every seed plays the
same held-out episodes (pooling them would count each problem three times and make the interval too
narrow). A task improves *beyond its interval* when that interval lies wholly above the start's (the
strict reading); the gain's own 95% interval (Newcombe's hybrid score interval for a difference of two
proportions, from the two Wilson intervals) is printed beside it, the usual test of a difference.

``--larger DIR``: a second table from ``ludic eval env --episodes N --out DIR/<task>-base.jsonl`` (the
start) and ``--adapter <task>-s<seed>/final --out DIR/<task>-s<seed>.jsonl`` (each trained policy), for
tasks whose evaluation is cheap enough to run on more held-out episodes.

``examples/ecosystem/results/study_v3`` keeps each finished run's ``summary.json`` and ``config.json``
(committed: run directories do not outlive the machine they ran on), so the table of those runs prints
from the repository: ``python examples/ecosystem/table.py examples/ecosystem/results/study_v3``.
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

from ludic.eval.stats import difference_interval, wilson_interval


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def ci(m: dict) -> str:
    return f"{pct(m['success_rate'])} ({pct(m['success_ci95_low'])}-{pct(m['success_ci95_high'])})"


def wall_minutes(run: Path, summary: dict) -> float:
    """The run's wall time: ``wall_s`` in its summary, else config.json (written first) to summary.json (last)."""
    if "wall_s" in summary:
        return summary["wall_s"]["total"] / 60
    return ((run / "summary.json").stat().st_mtime - (run / "config.json").stat().st_mtime) / 60


def seeds_mean(rates: list[float], episodes: int) -> tuple[float, float, float]:
    """The seeds' mean success rate and its 95% interval on one seed's ``episodes`` (see the docstring)."""
    mean = sum(rates) / len(rates)
    lo, hi = wilson_interval(round(mean * episodes), episodes)
    return mean, lo, hi


def compare(start: dict, rates: list[float], episodes: int) -> tuple[str, str, str]:
    """(trained mean with interval, intervals apart?, gain with its 95% interval) against ``start``."""
    mean, lo, hi = seeds_mean(rates, episodes)
    beyond = "yes" if lo > start["success_ci95_high"] else "no"
    g_lo, g_hi = difference_interval(start["success_rate"], start["success_ci95_low"], start["success_ci95_high"], mean, lo, hi)
    gain = f"{100 * (mean - start['success_rate']):+.1f} ({100 * g_lo:+.1f} to {100 * g_hi:+.1f})"
    return f"{pct(mean)} ({pct(lo)}-{pct(hi)})", beyond, gain


def main(root: str, larger: str | None = None) -> None:
    runs: dict[str, list[tuple[int, dict]]] = defaultdict(list)
    for path in sorted(Path(root).glob("*-s[0-9]*/summary.json")):
        task, seed = path.parent.name.rsplit("-s", 1)
        if seed.isdigit():
            runs[task].append((int(seed), json.loads(path.read_text())))
    print("| task (`--env`) | start (held out) | trained, per seed | trained, mean of seeds | intervals apart | "
          "gain (95% CI) | wall time per run |")
    print("|---|---|---|---|---|---|---|")
    for task, got in runs.items():
        got.sort(key=lambda x: x[0])
        first = got[0][1]
        start_stage = "format_demos" if "format_demos" in first else "base"
        start = first[start_stage]
        label = " (after format demos; base " + pct(first["base"]["success_rate"]) + ")" if start_stage != "base" else ""
        n = first["trained"]["episodes"]
        mean, beyond, gain = compare(start, [s["trained"]["success_rate"] for _, s in got], n)
        worse = any(s["trained"]["success_rate"] < start["success_rate"] for _, s in got)
        walls = [wall_minutes(Path(root) / f"{task}-s{seed}", s) for seed, s in got]
        lo_w, hi_w = round(min(walls)), round(max(walls))
        wall = f"{lo_w} min" if lo_w == hi_w else f"{lo_w}-{hi_w} min"
        per_seed = ", ".join(f"s{seed} {pct(s['trained']['success_rate'])}"
                             + (f" (kept step {s['kept']['step']})" if "kept" in s else "") for seed, s in got)
        print(f"| {task} (`{first['env']}`) | {ci(start)}{label} | {per_seed}{' (one below its start)' if worse else ''} "
              f"| {mean}, {len(got)} seed{'s' * (len(got) > 1)} x {n} ep. | {beyond} | {gain} | {wall} |")
    if larger:
        larger_table(Path(larger))


def larger_table(d: Path) -> None:
    from ludic.recipes.env_setup import summarize
    from ludic.types import Rollout

    def load(path: Path) -> dict:
        return summarize([Rollout.from_dict(json.loads(x)) for x in path.read_text().splitlines() if x.strip()])

    print("\n| task | start (held out) | trained, per seed | trained, mean of seeds | intervals apart | gain (95% CI) |")
    print("|---|---|---|---|---|---|")
    for base in sorted(d.glob("*-base.jsonl")):
        task = base.name[: -len("-base.jsonl")]
        start = load(base)
        seeds = sorted((int(p.stem.rsplit("-s", 1)[1]), load(p)) for p in d.glob(f"{task}-s[0-9]*.jsonl"))
        if not seeds:
            continue
        n = seeds[0][1]["episodes"]
        mean, beyond, gain = compare(start, [m["success_rate"] for _, m in seeds], n)
        per_seed = ", ".join(f"s{seed} {pct(m['success_rate'])}" for seed, m in seeds)
        print(f"| {task} | {ci(start)}, {start['episodes']} ep. | {per_seed} | {mean}, {len(seeds)} seeds x {n} ep. "
              f"| {beyond} | {gain} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", default="runs/study_v3")
    ap.add_argument("--larger", help="a folder of larger held-out evaluations (see the docstring)")
    args = ap.parse_args()
    main(args.root, args.larger)
