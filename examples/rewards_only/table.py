"""The rewards-only tic-tac-toe tables, from the recipe's own report.json files (examples/rewards_only/results/).

    python examples/rewards_only/table.py [results dir] [--plot OUT.png [run names...]]

Per run: exact non-loss against minimax in each seat (every branch of minimax's random tie-breaks, greedy
policy), legal moves (on the 335 positions perfect play can face, and forfeits against minimax), at the base
model, after the format cold start (random legal cells: no strategy), at the kept round and at the last round,
with the minutes at which each was measured; then the curve of exact non-loss against minutes. ``--plot`` draws
that curve (each seat, each run named, or every run) into one picture.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def row(name: str, r: dict, minutes: float | None) -> str:
    mm, tp = r["minimax"], r.get("teacher_positions") or {}  # a round whose games lost did not sweep them
    forfeit = mm["illegal_rate"] + mm["parse_error_rate"]
    return (f"| {name} | {pct(mm['x/non_loss_rate'])} | {pct(mm['o/non_loss_rate'])} | {pct(tp.get('legal_rate'))} | "
            f"{pct(forfeit)} | {pct(tp.get('value_preserving_rate'))} | "
            f"{'-' if minutes is None else f'{minutes:.1f}'} |")


def main(root: Path) -> None:
    for d in sorted(p for p in root.glob("*-s*") if (p / "report.json").exists()):
        rep = json.loads((d / "report.json").read_text())
        curve = rep.get("curve", [])
        at = {(c["stage"], c["step"]): c["t"] / 60 for c in curve if "minimax_non_loss_rate" in c}
        goal = all(rep["results"]["rl"]["minimax"][f"{s}/non_loss_rate"] >= 0.95 for s in "xo")
        print(f"\n{d.name} (reward {rep.get('reward', 'move')}, teacher {rep['teacher']}): "
              f"{rep['total_seconds'] / 60:.1f} min in all, RL {rep['rl_steps']} batches, kept batch "
              f"{rep['rl_kept_step']}, stopped by {rep.get('rl_stopped')}; goal (>= 95% each seat) "
              f"{'met' if goal else 'not met'}\n")
        print("| stage | non-loss vs minimax, X | O | legal (335 positions) | forfeits vs minimax | "
              "value-preserving (335) | minutes |")
        print("|---|---|---|---|---|---|---|")
        if "base" in rep["results"]:
            print(row("base", rep["results"]["base"], at.get(("base", 0))))
        print(row("after the cold start", rep["results"]["sft"], at.get(("sft", rep["sft_steps"]))))
        print(row(f"kept (batch {rep['rl_kept_step']})", rep["results"]["rl"], at.get(("rl", rep["rl_kept_step"]))))
        last = rep.get("rl_last_round") or {}
        if last and last.get("step") != rep["rl_kept_step"]:
            print(row(f"last round (batch {last['step']})", last, at.get(("rl", last["step"]))))
        pts = ", ".join(f"{c['t'] / 60:.1f} min: X {pct(c['minimax_x_non_loss_rate'])} O "
                        f"{pct(c['minimax_o_non_loss_rate'])}" for c in curve if "minimax_x_non_loss_rate" in c)
        print(f"\nExact non-loss against minimax over time: {pts}")
        print(f"\nWhere the time went: {time_split(rep)}")


def time_split(rep: dict) -> str:
    """The recipe's wall clock by part (report.json's ``seconds``), evaluations summed apart from training."""
    secs, total = rep.get("seconds", {}), rep["total_seconds"]
    evals = sum(v for k, v in secs.items() if k.startswith("eval"))
    parts = [f"{k} {v / 60:.1f} min" for k, v in secs.items()]
    return (f"{'; '.join(parts)} (evaluations {evals / 60:.1f} min = {100 * evals / total:.0f}% of "
            f"{total / 60:.1f}; RL training {secs.get('rl', 0) / 60:.1f} min = {100 * secs.get('rl', 0) / total:.0f}%)")


def plot(root: Path, out: Path, names: list[str] | None = None) -> None:
    """Exact non-loss against minimax in each seat, against the run's minutes, one line per run and seat."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for d in sorted(p for p in root.glob("*-s*") if (p / "report.json").exists() and (not names or p.name in names)):
        rep = json.loads((d / "report.json").read_text())
        pts = [c for c in rep.get("curve", []) if "minimax_x_non_loss_rate" in c]
        for ax, seat in zip(axes, "xo"):
            ax.plot([c["t"] / 60 for c in pts], [100 * c[f"minimax_{seat}_non_loss_rate"] for c in pts], "o-",
                    ms=3, label=d.name)
    for ax, seat in zip(axes, "XO"):
        ax.axhline(95, color="grey", ls=":", lw=1)
        ax.set(title=f"as {seat}: exact non-loss vs minimax", xlabel="minutes (the whole run)", ylim=(-2, 102))
        ax.legend(fontsize=8)
    axes[0].set_ylabel("% of minimax's branches")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    args = sys.argv[1:]
    results = Path(args[0]) if args and not args[0].startswith("--") else Path(__file__).parent / "results"
    if "--plot" in args:
        at = args.index("--plot")
        plot(results, Path(args[at + 1]), args[at + 2:] or None)
    else:
        main(results)
