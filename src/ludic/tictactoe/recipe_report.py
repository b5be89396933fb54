"""The tic-tac-toe recipe's report (``ludic recipe tictactoe``): report.md (exact metrics per stage, stage
times, the machine, the command that evaluates the result again) and learning_curves.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ludic.data.jsonl import read_jsonl
from ludic.tictactoe.prompts import ANSWER_TOKENS
from ludic.tictactoe.showcase import games_markdown


def eval_command(run_dir: Path, cfg: dict[str, Any]) -> str:
    """The ``ludic eval tictactoe --exact`` command line that sees the recipe's prompts."""
    import shlex

    policy = (f"--model {run_dir / 'sft' / 'final'} --adapter {run_dir / 'rl' / 'final'}" if cfg.get("lora_rank", 16)
              else f"--model {run_dir / 'rl' / 'final'}")  # --lora-rank 0: RL trained the layers, saved as a model
    return (f"ludic eval tictactoe --exact --opponent minimax {policy} --ctx last {'--compact' if cfg['compact'] else '--no-compact'} "
            f"--no-show-opponent-move {'--show-moves' if cfg['show_moves'] else '--no-show-moves'} "
            f"--system-prompt {shlex.quote(cfg['system_prompt'])} --answer {cfg['answer']} "
            f"--max-tokens {ANSWER_TOKENS[cfg['answer']]}")


def precision(model: Any, requested: str, adapter: bool = True) -> dict[str, str]:
    """The compute dtype ``--dtype`` (``requested``) resolved to, how each stage kept its weights (RL: a LoRA
    ``adapter``, or the layers themselves under ``--lora-rank 0``), and the fast path."""
    from ludic import fastpath

    dtype = str(next(p for n, p in model.named_parameters() if "lora_" not in n).dtype).replace("torch.", "")
    low = dtype != "float32"
    return {"dtype": dtype, "requested": requested,
            "sft": f"{dtype} compute, fp32 master weights and AdamW state" if low else "float32",
            "rl": (f"{dtype} compute, fp32 {'LoRA adapters' if adapter else 'master weights'} and AdamW state"
                   if low else "float32"),
            "evaluated_in": dtype, "fast_path": fastpath.describe()}


def _precision_text(p: dict[str, str] | None, requested: str) -> str:
    if not p:
        return f"dtype {requested}."
    return (f"Compute dtype {p['dtype']} (--dtype {p['requested']}); SFT: {p['sft']}; RL: {p['rl']}; every "
            f"evaluation in {p['evaluated_in']}, the dtype the policy is served in; fast path {p['fast_path']}.")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def write_report(run_dir: Path, report: dict[str, Any]) -> None:
    """report.md (exact metrics per stage, stage times, the machine) and learning_curves.png."""
    rows = ["| stage | vs minimax: non-loss X | O | mean | vs random: non-loss | win | loss | illegal or unparsable "
            "| teacher positions: best move | value-preserving | legal |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    stages = [(s, r) for s, r in report["results"].items()]
    last = report.get("rl_last_round") or {}
    if last and last.get("step") != report.get("rl_kept_step"):  # the final round, when another was kept
        stages.append((f"rl, last round (batch {last['step']})", last))
    none = report.get("teacher") == "none"  # rewards only: the "sft" stage is the random-cell format cold start
    for stage, r in stages:
        if stage == "sft" and none:
            stage = "cold start (random legal cells)"
        if stage == "rl":
            stage = f"rl, kept (batch {report.get('rl_kept_step', '?')})"
        mm, rd, tp = r["minimax"], r.get("random"), r.get("teacher_positions") or {}  # a round may not sweep them
        forfeits = (mm["illegal_rate"] + mm["parse_error_rate"] + rd["illegal_rate"] + rd["parse_error_rate"]) / 2 \
            if rd else mm["illegal_rate"] + mm["parse_error_rate"]
        rows.append(f"| {stage} | {_pct(mm['x/non_loss_rate'])} | {_pct(mm['o/non_loss_rate'])} | "
                    f"{_pct(mm['non_loss_rate'])} | {_pct(rd and rd['non_loss_rate'])} | {_pct(rd and rd['win_rate'])} | "
                    f"{_pct(rd and rd['loss_rate'])} | {_pct(forfeits)} | {_pct(tp.get('best_move_rate'))} | "
                    f"{_pct(tp.get('value_preserving_rate'))} | {_pct(tp.get('legal_rate'))} |")
    shown = {"sft": "cold start (random legal cells)", "eval_sft": "eval_cold_start"} if none else {}
    times = "\n".join(f"| {shown.get(k, k)} | {v / 60:.2f} min |" for k, v in report["seconds"].items())
    m = report["machine"]
    budget = f" of a {report['budget_seconds'] / 60:.0f} min budget" if report["budget_seconds"] else ""
    text = (
        "# Tic-tac-toe recipe report\n\n"
        "Exact evaluation of the greedy policy: every branch of the opponent (minimax's tie-breaks, "
        "random's moves) and both seats enumerated; no sampling noise. Teacher positions: the "
        f"{report['teacher_positions']} positions the solver teacher can face (perfect play needs them all)"
        + (": the solver scores the policy's moves there and never shows it one" if none else "") + ".\n\n"
        + "\n".join(rows)
        + f"\n\n| stage | wall time |\n|---|---|\n{times}\n| **total** | **{report['total_seconds'] / 60:.2f} min**"
          f"{budget} |\n\n"
        + ("Cold start (format only, no strategy): " if none else "SFT: ")
        + f"{report['sft_steps']} steps ({report['sft_epochs']:.1f} epochs) on {report['sft_records']} records"
        + (" of uniformly random legal cells" if none else "") + ", "
        f"{report['prompt_tokens']:.0f} prompt + {report['answer_tokens']:.0f} answer tokens each. "
        + (f"RL: {report['rl_steps']} position-level GRPO batches (the solver's move-quality reward) in rounds, "
           if report.get("reward", "move") == "move" else
           f"RL: {report['rl_steps']} game-level GRPO batches (game outcome only, against the ladder "
           f"{report['config'].get('opponent_ladder')}; moved up at batches "
           f"{', '.join(f'{b} ({r})' for b, r in report.get('promotions') or []) or 'none'}) in rounds, ")
        + "each round evaluated exactly against "
        f"minimax (and on the teacher positions once its games lost nothing); the policy of the best round is kept (here after batch "
        f"{report['rl_kept_step']}; 0 is the {'cold-start' if none else 'SFT'} policy itself), selected on that same exact evaluation (minimax "
        "non-loss first, then value-preserving and legal teacher moves): the kept row is the best of the rounds "
        "it was chosen from, and the last round's row, when another was kept, shows where RL ended. "
        + {"goal": "RL stopped early because the goal was met: no losing decision against minimax and every "
                   "teacher position value-preserving.",
           "budget": "RL ran until the budget had no room for another round and the closing evaluation.",
           "rounds": "RL ran the rounds it was given.",
           "no_signal": "RL stopped because its batches carried no signal ("
                        f"{report.get('rl_stopped_why') or 'in every group all samples scored alike'}), so no step "
                        "was left to take.",
           "saturated": "RL stopped because its batches carried no signal: every sample succeeded."}.get(report.get("rl_stopped", ""), "")
        + "\n\n"
        f"Evaluate the result again (or against random) with:\n\n```\n{eval_command(run_dir, report['config'])}\n```\n\n"
        f"Machine: {m['cpus']} CPUs ({', '.join(m['isa']) or 'no AVX2'}), {m['torch_threads']} torch threads, "
        f"torch {m['torch']} ({m.get('kernels', '?')} kernels"
        + (f"; limited by {', '.join(f'{k}={v}' for k, v in m['isa_limits'].items())}" if m.get("isa_limits") else "")
        + f"). {_precision_text(report.get('precision'), report['config']['dtype'])}\n\n"
        "![learning curves](learning_curves.png)\n" + games_markdown(run_dir)
    )
    (run_dir / "report.md").write_text(text)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    sft = [m for m in _metrics(run_dir / "sft") if "loss" in m]
    rl = [m for m in _metrics(run_dir / "rl") if "reward_mean" in m]
    curve = report["curve"]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    axes[0].plot([m["step"] for m in sft], [m["loss"] for m in sft])
    none = report.get("teacher") == "none"
    axes[0].set(title="Cold-start loss (random legal cells)" if none else "SFT loss", xlabel="SFT step",
                ylabel="NLL per answer token", yscale="log")
    swept = [c for c in curve if "value_preserving_rate" in c]  # RL rounds that lost games did not sweep them
    t = [c["t"] / 60 for c in swept]
    axes[1].plot(t, [c["best_move_rate"] for c in swept], "o-", label="best move")
    axes[1].plot(t, [c["value_preserving_rate"] for c in swept], "o-", label="value-preserving")
    axes[1].set(title="Teacher positions answered right", xlabel="minutes", ylim=(0, 1.02))
    axes[1].legend()
    axes[2].plot([m["step"] for m in rl], [m["reward_mean"] for m in rl])
    axes[2].set(title="RL reward (" + ("solver" if report.get("reward", "move") == "move" else "game outcome")
                + ", sampled)", xlabel="RL batch")
    for key, label in (("minimax_x", "vs minimax as X"), ("minimax_o", "vs minimax as O"),
                       ("random", "vs random (mean)")):
        pts = [c for c in curve if f"{key}_non_loss_rate" in c]
        axes[3].plot([c["t"] / 60 for c in pts], [c[f"{key}_non_loss_rate"] for c in pts], "o-", label=label)
    axes[3].set(title="Exact non-loss at checkpoints", xlabel="minutes", ylim=(0, 1.02))
    axes[3].legend()
    fig.tight_layout()
    fig.savefig(run_dir / "learning_curves.png", dpi=100)
    plt.close(fig)


def _metrics(stage_dir: Path) -> list[dict[str, Any]]:
    """A stage's logged metrics (``metrics.jsonl``; none when the stage did not run)."""
    path = stage_dir / "metrics.jsonl"
    return read_jsonl(path) if path.exists() else []
