"""The held-out study's tables, from the runs' own summary.json files (examples/study/results/<task>-s<seed>/).

    python examples/study/table.py [results dir] [--plot OUT.png]

Prints markdown, nothing typed in by hand (docs/study.md pastes it):

- one row per run: distinct test instances and how many of them the run trained on, the instance space, base
  test success, the start of RL (after a format cold start, when the task has one), trained test success, each
  with its 95% Wilson interval, the gain over the start with its 95% interval (Newcombe), whether the trained
  score lies beyond the start's interval, steps and wall time (with the machine's training pace, seconds per 1,000
  train tokens, where the summary has it: a slowed machine fits fewer steps into the budget);
- one row per task: the seeds' mean (its interval on one seed's episodes, since every seed plays the same test
  instances; pooling them would count each instance once per seed) and the mean gain over tasks;
- the two-player runs against every evaluation opponent, wins in play apart from wins by the opponent's invalid
  move or forfeit;
- each run's validation success against minutes;
- for tasks with reference answers, what the best constant answer scores on the same test instances and how many
  distinct answers the trained policy gave (a policy that answers the most common reference to everything
  learned the answers' base rate, not the task): from the summary, or from the kept test episodes
  (``eval_base.jsonl.gz``, ``eval_trained.jsonl.gz``) of runs summarised before the summary carried it.

``--plot OUT.png`` draws the curves instead: one panel per task, each seed's held-out validation success against
its run's minutes, the start of RL's test score (dashed) and each seed's trained test score (a cross at its end).
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from ludic.eval.samples import COLLAPSED_SHARE, answer_spread, outcome_of
from ludic.eval.stats import difference_interval, wilson_interval
from ludic.types import Rollout

SUPERSEDED = {"gem_guess_random": ("gem_guess_legal", "its teacher repeated guesses and GEM paid a lost game by its "
                                   "last guess's distance; gem_guess_legal is the same game with both fixed")}
"""A task config replaced by another of the same task: its rows stay in every table, marked, and once the successor
has runs the mean gain counts the successor only (one game counted once)."""


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


def pace(s: dict) -> str:
    """The machine's training pace in a run (seconds per 1,000 train tokens), where its summary has it."""
    p = s.get("machine", {}).get("train_s_per_1k_tokens")
    return f" ({p:.2f} s/1k tok)" if p else ""


def start_of(s: dict) -> dict:
    """Where RL started: after the format cold start when the run had one, else the base model."""
    return s.get("format_demos") or s["base"]


def seeds_mean(stages: list[dict], n: int) -> dict:
    """One stage over a task's seeds: the mean success with the Wilson interval of that share of ``n`` episodes."""
    mean = statistics.fmean(st["success_rate"] for st in stages)
    lo, hi = wilson_interval(round(mean * n), n)
    return {"success_rate": mean, "success_ci95_low": lo, "success_ci95_high": hi}


def mean_start(summaries: list[dict], n: int) -> dict:
    """A task's start of RL over its seeds: the base model's (the same for every seed: the same model on the same
    test instances), or, after a format cold start (trained per seed, so scored per seed), the seeds' mean."""
    starts = [start_of(s) for s in summaries]
    if all(st is s["base"] for st, s in zip(starts, summaries)):
        return starts[0]
    return seeds_mean(starts, n)


def gain(start: dict, rate: float, lo: float, hi: float) -> str:
    g_lo, g_hi = difference_interval(start["success_rate"], start["success_ci95_low"], start["success_ci95_high"],
                                     rate, lo, hi)
    return f"{100 * (rate - start['success_rate']):+.1f} ({100 * g_lo:+.1f} to {100 * g_hi:+.1f})"


def opponent_rows(summaries: list[dict]) -> list[tuple[str, list[tuple[float, float]]]]:
    """A two-player task's opponents over its seeds: (name, [(base, trained) success per seed]) for the frozen start
    it trained against and every evaluation opponent that each seed measured before and after."""
    rows = [("frozen start (trained against)", [(s["base"]["success_rate"], s["trained"]["success_rate"])
                                                for s in summaries])]
    for name in summaries[0]["opponents"]:
        stages = [s["opponents"].get(name, {}) for s in summaries]
        if all(st.get("base") and st.get("trained") for st in stages):
            rows.append((name, [(st["base"]["success_rate"], st["trained"]["success_rate"]) for st in stages]))
    return rows


def given(a: dict) -> str:
    """The answers a stage gave: how many distinct ones, the most common and its share of the episodes."""
    if "distinct_answers" not in a:
        return "none"
    top = a["top_answer"] if len(a["top_answer"]) <= 24 else a["top_answer"][:21] + "..."
    return f"{a['distinct_answers']} ({top!r}, {pct(a['top_answer_share'])})"


def spread(run: Path, stage: str, m: dict) -> dict:
    """``m``'s answer spread (``eval.samples.answer_spread``), else computed from the run's kept test episodes."""
    if "constant_answer_rate" in m or "distinct_answers" in m:
        return m
    path = run / f"eval_{stage}.jsonl.gz"
    if not path.exists():
        return {}
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    return answer_spread([outcome_of(Rollout.from_dict(json.loads(line))) for line in lines if line])


def load(root: Path) -> list[tuple[str, int, dict]]:
    runs = []
    for d in sorted(root.glob("*-s*")):
        task, _, seed = d.name.rpartition("-s")
        if (d / "summary.json").exists() and seed.isdigit():
            runs.append((task, int(seed), json.loads((d / "summary.json").read_text())))
    return runs


def main(root: Path) -> None:
    runs = load(root)
    present = {task for task, _, _ in runs}
    replaced = {t: SUPERSEDED[t] for t in present if t in SUPERSEDED and SUPERSEDED[t][0] in present}

    def name(task: str) -> str:
        return f"{task} (superseded by {replaced[task][0]})" if task in replaced else task
    answers = {(task, seed): (spread(root / f"{task}-s{seed}", "base", s["base"]),
                              spread(root / f"{task}-s{seed}", "trained", s["trained"])) for task, seed, s in runs}
    print("| task | seed | distinct test instances (trained on) | instance space | base (95% CI) | start of RL | "
          "trained (95% CI) | gain over the start (95% CI) | beyond the start's interval | steps | wall | stopped |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    by_task: dict[str, list[dict]] = defaultdict(list)
    for task, seed, s in runs:
        inst, start, t = s["instances"], start_of(s), s["trained"]
        by_task[task].append(s)
        label = "" if inst.get("held_out") else f" **{inst.get('label')}**"
        print(f"| {name(task)}{label} | {seed} | {inst['test_distinct']} ({inst['test_trained']}) | {space(inst)} | "
              f"{ci(s['base'])} | {'base' if start is s['base'] else ci(start) + ' (cold start)'} | {ci(t)} | "
              f"{gain(start, t['success_rate'], t['success_ci95_low'], t['success_ci95_high'])} | "
              f"{'yes' if t['success_rate'] > start['success_ci95_high'] else 'no'} | {s['stopped']['step']} | "
              f"{s['wall_s']['total'] / 60:.1f} min{pace(s)} | {s['stopped']['reason']} |")
    if not runs:
        return
    print("\n| task | seeds | start of RL | trained, mean of the seeds (95% CI) | gain (95% CI) | beyond the start's "
          "interval | a constant answer? |")
    print("|---|---|---|---|---|---|---|")
    gains, left_out = [], []
    for task, summaries in by_task.items():
        n = summaries[0]["trained"]["episodes"]
        start = mean_start(summaries, n)
        trained = seeds_mean([s["trained"] for s in summaries], n)
        mean, lo, hi = trained["success_rate"], trained["success_ci95_low"], trained["success_ci95_high"]
        constant = any(answers[t, seed][1].get("top_answer_share", 0.0) >= COLLAPSED_SHARE
                       for t, seed, _ in runs if t == task)
        # a collapse onto one answer leaves the mean only when it gained (the answers' base rate, not the task); a
        # collapse that lost is RL failing at the task, and counts
        if task not in replaced:
            (left_out if constant and mean > start["success_rate"] else gains).append((task, mean - start["success_rate"]))
        print(f"| {name(task)} | {len(summaries)} | {ci(start)} | {pct(mean)} ({pct(lo)}-{pct(hi)}) | "
              f"{gain(start, mean, lo, hi)} | {'yes' if mean > start['success_ci95_high'] else 'no'} | "
              f"{'**yes**: one answer to almost every question' if constant else 'no'} |")
    if gains:
        print(f"\nMean gain over {len(gains)} task(s) (each task's mean over its seeds, from the start of RL; a "
              f"two-player task against the opponent it trained against): "
              f"{100 * statistics.fmean(g for _, g in gains):+.1f} points"
              + (f"; left out: {', '.join(t for t, _ in left_out)} (the policy gave one answer to almost every "
                 "question and gained: the answers' base rate, not the task)" if left_out else "")
              + "".join(f"; superseded: {t} ({why})" for t, (_, why) in sorted(replaced.items())) + ".")
    against_random: dict[str, float | None] = {}  # a two-player task's gain against the random player (None: unmeasured)
    for task, summaries in by_task.items():
        if not all(s.get("opponents") for s in summaries):
            continue
        print(f"\n{task} over its {len(summaries)} seed(s), test deals against each opponent (the mean of the seeds' "
              "success; the gain is each seed's trained minus its own base, averaged):\n")
        print("| opponent | base | trained | gain |")
        print("|---|---|---|---|")
        against_random[task] = None
        for name, per_seed in opponent_rows(summaries):
            base, trained = [statistics.fmean(x) for x in zip(*per_seed)]
            print(f"| {name} | {pct(base)} | {pct(trained)} | {100 * (trained - base):+.1f} |")
            if name == "random":
                against_random[task] = trained - base
    random_gains = [against_random[task] if task in against_random else g for task, g in gains]
    if against_random and gains and None not in random_gains:
        print(f"\nThe same mean gain with each two-player task counted against the uniformly random legal player it "
              f"never trained against: {100 * statistics.fmean(random_gains):+.1f} points.")
    for task, seed, s in [(t, seed, s) for t, seed, s in runs if s.get("opponents")]:
        print(f"\n{task} seed {seed}, test deals against each opponent (success with its interval; wins in play / "
              "by the opponent's invalid move):\n")
        print("| opponent | base | trained |")
        print("|---|---|---|")
        rows = [("frozen start (trained against)", s["base"], s["trained"])]
        snap = s.get("league_snapshot") or {}
        rows += [(f"league snapshot (step {snap['step']} of {snap['steps_run']})" if name == "league" and snap.get("step")
                  else name, st.get("base"), st.get("trained")) for name, st in s["opponents"].items()]
        for name, b, t in rows:
            print(f"| {name} | {wins(b)} | {wins(t)} |")
    with_refs = [(task, seed, *answers[task, seed], s) for task, seed, s in runs
                 if "constant_answer_rate" in answers[task, seed][1]]
    if with_refs:
        print("\nThe best constant answer on the same test instances, and the answers the policy gave:\n")
        print("| task | seed | best constant answer: its score | trained | base: distinct answers (most common, "
              "share) | trained: distinct answers (most common, share) |")
        print("|---|---|---|---|---|---|")
        for task, seed, b, t, s in with_refs:
            print(f"| {task} | {seed} | {t['constant_answer']!r}: {pct(t['constant_answer_rate'])} | "
                  f"{pct(s['trained']['success_rate'])} | {given(b)} | {given(t)} |")
    print("\nValidation success (held-out validation instances) against minutes:\n")
    for task, seed, s in runs:
        pts = ", ".join(f"{pct(c['success_rate'])} at {c['minutes']:.1f}" for c in s.get("curve", []))
        kept = s.get("kept") or {}
        print(f"- {task} seed {seed}: {pts or 'none'}; kept step {kept.get('step')} of {s['stopped']['step']}")


def plot(root: Path, out: Path) -> list[str]:
    """Each task's validation success against minutes, one line per seed, into ``out``; returns the panels' titles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_task: dict[str, list[tuple[int, dict]]] = defaultdict(list)
    for task, seed, s in load(root):
        by_task[task].append((seed, s))
    cols = min(4, len(by_task)) or 1
    rows = -(-len(by_task) // cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False, sharey=True)
    titles = []
    for ax, (task, seeds) in zip(axes.flat, by_task.items()):
        n = seeds[0][1]["trained"]["episodes"]
        start = mean_start([s for _, s in seeds], n)["success_rate"]
        ax.axhline(100 * start, color="grey", ls="--", lw=1, label="start of RL (test)")
        for seed, s in seeds:
            pts = s.get("curve", [])
            line, = ax.plot([c["minutes"] for c in pts], [100 * c["success_rate"] for c in pts], "o-", ms=2.5,
                            lw=1, label=f"seed {seed} (validation)")
            end = s["wall_s"]["total"] / 60
            ax.plot([end], [100 * s["trained"]["success_rate"]], "x", ms=7, color=line.get_color())
        inst = [s["instances"] for _, s in seeds]
        titles.append(f"{task}: {min(i['test_distinct'] for i in inst)} test instances, "
                      f"{max(i['test_trained'] for i in inst)} trained on"
                      + (" (vs its frozen start)" if any(s.get("opponents") for _, s in seeds) else ""))
        ax.set_title(titles[-1], fontsize=8)
        ax.set_xlabel("minutes", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    for ax in axes.flat[len(by_task):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("held-out success, %", fontsize=8)
    fig.suptitle("validation success over each run (x: the trained policy's test score at the run's end)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return titles


if __name__ == "__main__":
    args = sys.argv[1:]
    results = Path(args[0]) if args and not args[0].startswith("--") else Path(__file__).parent / "results"
    if "--plot" in args:
        for title in plot(results, Path(args[args.index("--plot") + 1])):
            print(title)
    else:
        main(results)
