"""The held-out study's tables, from the runs' own summary.json files (examples/study/results/<task>-s<seed>/).

    python examples/study/table.py [results dir]

Prints markdown: one row per run (distinct test instances and how many were trained on, the instance space,
base and trained test success with 95% intervals, the gain, steps, wall time), the two-player runs against
every evaluation opponent (wins in play apart from wins by the opponent's invalid move), each run's validation
curve against minutes, and the mean gain over tasks. Nothing is typed in by hand: docs/study.md pastes this.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def ci(m: dict) -> str:
    return f"{pct(m['success_rate'])} ({pct(m['success_ci95_low'])}-{pct(m['success_ci95_high'])})"


def wins(m: dict | None) -> str:
    """A two-player stage: success with its interval; wins in play / by the opponent's invalid move."""
    if not m:
        return "-"
    return f"{ci(m)}; {pct(m.get('play_win_rate'))} / {pct(m.get('forfeit_win_rate'))}"


def space(inst: dict) -> str:
    sp = inst.get("space") or {}
    if not sp:
        return "?"
    return f"{sp['estimate']:,}" + ("" if sp.get("exact") else " (est.)")


def load(root: Path) -> list[tuple[str, int, dict, dict]]:
    runs = []
    for d in sorted(root.glob("*-s*")):
        if not (d / "summary.json").exists():
            continue
        task, _, seed = d.name.rpartition("-s")
        config = json.loads((d / "config.json").read_text()) if (d / "config.json").exists() else {}
        runs.append((task, int(seed), json.loads((d / "summary.json").read_text()), config))
    return runs


def main(root: Path) -> None:
    runs = load(root)
    print("| task | seed | distinct test instances (trained on) | instance space | base (95% CI) | "
          "trained (95% CI) | gain | beyond the base's interval | steps | wall | stopped |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    gains: dict[str, list[float]] = defaultdict(list)
    for task, seed, s, _ in runs:
        inst, base, trained = s["instances"], s["base"], s["trained"]
        gain = trained["success_rate"] - base["success_rate"]
        gains[task].append(gain)
        label = "" if inst.get("held_out") else f" **{inst.get('label')}**"
        print(f"| {task}{label} | {seed} | {inst['test_distinct']} ({inst['test_trained']}) | {space(inst)} | "
              f"{ci(base)} | {ci(trained)} | {100 * gain:+.1f} | "
              f"{'yes' if trained['success_rate'] > base['success_ci95_high'] else 'no'} | {s['stopped']['step']} | "
              f"{s['wall_s']['total'] / 60:.1f} min | {s['stopped']['reason']} |")
    if gains:
        means = [statistics.fmean(g) for g in gains.values()]
        print(f"\nMean gain over {len(gains)} task(s) (each task's mean over its seeds): "
              f"{100 * statistics.fmean(means):+.1f} points.")
    two = [(t, seed, s) for t, seed, s, _ in runs if s.get("opponents")]
    for task, seed, s in two:
        print(f"\n{task} seed {seed}, test deals against each opponent (win rate; in play / by the opponent's "
              "invalid move):\n")
        print("| opponent | base | trained |")
        print("|---|---|---|")
        rows = [("frozen start (trained against)", s["base"], s["trained"])]
        rows += [(name, st.get("base"), st.get("trained")) for name, st in s["opponents"].items()]
        for name, b, t in rows:
            print(f"| {name} | {wins(b)} | {wins(t)} |")
    print("\nValidation success (held-out validation instances) against minutes:\n")
    for task, seed, s, _ in runs:
        pts = ", ".join(f"{pct(c['success_rate'])} at {c['minutes']:.1f}" for c in s.get("curve", []))
        kept = s.get("kept") or {}
        print(f"- {task} seed {seed}: {pts or 'none'}; kept step {kept.get('step')} of {s['stopped']['step']}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "results")
