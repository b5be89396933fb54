"""The ``ludic`` command.

    ludic train env --env SPEC        GRPO + LoRA on any env: a registered name, textarena:ID,
                                      reasoning_gym:NAME, verifiers:ID, gem:ID, gym:ID or module:factory;
                                      --tools module:function,... for a tool-calling agent
    ludic eval env --env SPEC         success rate (95% CI) and mean reward on held-out episodes (--samples K: pass@k,
                                      majority vote), written to a run folder runs/eval-<time>/
    ludic eval rescore RUN_OR_FILE --reward module:function
                                      score stored episodes again with another reward function (no generation)
    ludic train tictactoe [flags]     GRPO + LoRA on tic-tac-toe
    ludic train prompts [flags]       GRPO on a JSONL prompt dataset with a reward function
    ludic train qa [flags]            GRPO on graded QA / math answers (arith, JSONL, parquet, GSM8K; --tools)
    ludic eval qa [flags]             QA accuracy with a 95% CI and pass@k
    ludic train games [flags]         PPO (value head, GAE, adaptive KL) + LoRA on OpenSpiel games
    ludic eval games [flags]          score / success / invalid answers per game (--exploitability: NashConv)
    ludic train tictactoe --pipeline N  pipeline RL: Redis, N actor processes, this one learns
    ludic train tictactoe --overlap     the same in one process: an actor thread, max_lag 1
    ludic actor tictactoe [flags]     pipeline actor: roll out, push to Redis, follow the weights
    ludic learner tictactoe [flags]   pipeline learner: train on Redis batches, checkpoint, announce
    ludic actor env --env SPEC        the same two parts on any env (train env's flags, plus --redis-url)
    ludic learner env --env SPEC
    ludic eval tictactoe [flags]      win / draw / loss / illegal / parse-error rates (--exact: enumerated)
    ludic datagen tictactoe [flags]   SFT data: rejection sampling or the solver teacher
    ludic datagen thinktactoe [flags] ThinkTacToe-format SFT / DPO / GRPO / minimax datasets
    ludic sft [flags]                 supervised fine-tuning on JSONL (torchrun-ready)
    ludic dpo [flags]                 preference optimisation (DPO / IPO / hinge) on JSONL pairs
    ludic recipe tictactoe [flags]    teacher data -> SFT -> GRPO -> eval, with a report
    ludic report RUN_DIR              (re)write RUN_DIR/report.html: curves, eval tables, trajectories
    ludic model prepare               convert the packaged model once (cached)

Run ``ludic <command> <target> --help`` for the flags of each command.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

from ludic.config import parse_config


def _train_tictactoe(argv: list[str]) -> None:
    from ludic.tictactoe.train import TrainTicTacToeConfig, train

    cfg = parse_config(TrainTicTacToeConfig, argv, prog="ludic train tictactoe")
    if cfg.pipeline or cfg.overlap:
        from ludic.tictactoe.pipeline import run_local

        metrics = run_local(cfg)
    else:
        metrics = train(cfg)
    print(json.dumps({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, indent=2))


def _actor_tictactoe(argv: list[str]) -> None:
    from ludic.tictactoe.train import TrainTicTacToeConfig
    from ludic.tictactoe.pipeline import run_actor

    run_actor(parse_config(TrainTicTacToeConfig, argv, prog="ludic actor tictactoe"))


def _learner_tictactoe(argv: list[str]) -> None:
    from ludic.tictactoe.train import TrainTicTacToeConfig
    from ludic.tictactoe.pipeline import run_learner

    out = run_learner(parse_config(TrainTicTacToeConfig, argv, prog="ludic learner tictactoe"))
    print(json.dumps({k: v for k, v in out.items() if isinstance(v, (int, float, dict))}, indent=2))


def _actor_env(argv: list[str]) -> None:
    from ludic.recipes.env_pipeline import EnvPipelineConfig, run_actor

    run_actor(parse_config(EnvPipelineConfig, argv, prog="ludic actor env"))


def _learner_env(argv: list[str]) -> None:
    from ludic.recipes.env_pipeline import EnvPipelineConfig, run_learner

    out = run_learner(parse_config(EnvPipelineConfig, argv, prog="ludic learner env"))
    print(json.dumps({k: v for k, v in out.items() if isinstance(v, (int, float, dict))}, indent=2))


def _train_prompts(argv: list[str]) -> None:
    from ludic.recipes.grpo_prompts import TrainPromptsConfig, train_prompts

    out = train_prompts(parse_config(TrainPromptsConfig, argv, prog="ludic train prompts"))
    print(json.dumps({k: v for k, v in out.items() if isinstance(v, (int, float, str))}, indent=2))


def _eval_tictactoe(argv: list[str]) -> None:
    from ludic.tictactoe.train import EvalTicTacToeConfig, evaluate

    cfg = parse_config(EvalTicTacToeConfig, argv, prog="ludic eval tictactoe")
    metrics = evaluate(cfg)
    if cfg.exact:
        from ludic.tictactoe.exact import format_table

        print(format_table(metrics, cfg.opponent))
        print(f"decisions written to {cfg.out}")
        return
    for k, v in metrics.items():
        if "_ci95_" in k:
            continue
        ci = (f"  (95% CI {metrics[k + '_ci95_low'] * 100:.1f}-{metrics[k + '_ci95_high'] * 100:.1f}%)"
              if k + "_ci95_low" in metrics else "")
        print(f"{k:>24}: {v * 100:6.1f}%{ci}" if k.endswith("_rate") else f"{k:>24}: {v:.3f}")
    print(f"records written to {cfg.out}")


def _datagen_tictactoe(argv: list[str]) -> None:
    from ludic.tictactoe.datagen import DatagenConfig, datagen

    print(json.dumps(datagen(parse_config(DatagenConfig, argv, prog="ludic datagen tictactoe")), indent=2))


def _datagen_thinktactoe(argv: list[str]) -> None:
    from ludic.tictactoe.thinktactoe import main as thinktactoe_main

    thinktactoe_main(argv)


def _sft(argv: list[str]) -> None:
    from ludic.recipes.sft import SFTConfig, sft

    out = sft(parse_config(SFTConfig, argv, prog="ludic sft"))
    print(json.dumps({k: v for k, v in out.items() if isinstance(v, (int, float, str))}, indent=2))


def _dpo(argv: list[str]) -> None:
    from ludic.recipes.dpo import DPOTrainConfig, dpo

    out = dpo(parse_config(DPOTrainConfig, argv, prog="ludic dpo"))
    print(json.dumps({k: v for k, v in out.items() if isinstance(v, (int, float, str))}, indent=2))


def _flag(argv: list[str], flag: str, default: str) -> str:
    """The value ``argv`` gives ``flag`` (``--flag v`` or ``--flag=v``; the last one wins, as argparse), or ``default``."""
    found = default
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif a.startswith(flag + "="):
            found = a.split("=", 1)[1]
    return found


def recipe_tictactoe_config(argv: list[str]) -> Any:
    """``ludic recipe tictactoe``'s flags parsed: a ``SeedRecipeConfig`` for ``--ctx truncated`` (the seed's own
    workflow), else a ``RecipeConfig``, with ``rewards_only_defaults`` as the defaults under ``--teacher none``."""
    from ludic.tictactoe.recipe import RecipeConfig
    from ludic.tictactoe.rewards_only import rewards_only_defaults
    from ludic.tictactoe.seed_recipe import SeedRecipeConfig

    if _flag(argv, "--ctx", "last") != "last":  # multi-turn prompts, rejection sampling, GRPO on games
        return parse_config(SeedRecipeConfig, argv, prog="ludic recipe tictactoe --ctx truncated")
    none = _flag(argv, "--teacher", "solver") == "none"
    mode = rewards_only_defaults(_flag(argv, "--reward", "move")) if none else None
    return parse_config(RecipeConfig, argv, prog="ludic recipe tictactoe", defaults=mode)


def _recipe_tictactoe(argv: list[str]) -> None:
    from ludic.tictactoe.recipe import RecipeConfig, recipe
    from ludic.tictactoe.seed_recipe import seed_recipe

    cfg = recipe_tictactoe_config(argv)
    report = recipe(cfg) if isinstance(cfg, RecipeConfig) else seed_recipe(cfg)
    print(json.dumps({"results": report["results"], "seconds": report["seconds"]}, indent=2))


def _train_games(argv: list[str]) -> None:
    from pathlib import Path

    from ludic.recipes.games import TrainGamesConfig, train_games
    from ludic.recipes.games_config import original_config_argv

    def flag(name: str) -> str | None:
        for k, v in zip(argv, argv[1:]):
            if k == name:
                return v
        return next((a.split("=", 1)[1] for a in argv if a.startswith(name + "=")), None)

    def load(path: str | None) -> dict | None:
        if not path:
            return None
        try:
            return json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"ludic train games: cannot read {path}: {e}")

    # the original trainer's JSON configs first: flags given on the command line come later and win
    base = original_config_argv(load(flag("--config")), load(flag("--env-config")))
    out = train_games(parse_config(TrainGamesConfig, base + argv, prog="ludic train games"))
    print(json.dumps({k: v for k, v in out.items() if isinstance(v, (int, float, list))}, indent=2))


def _train_qa(argv: list[str]) -> None:
    from ludic.recipes.qa import TrainQAConfig, train_qa

    out = train_qa(parse_config(TrainQAConfig, argv, prog="ludic train qa"))
    print(json.dumps({k: v for k, v in out.items() if k in ("before", "after", "accuracy_gain", "run_dir")},
                     indent=2))


def _eval_qa(argv: list[str]) -> None:
    from ludic.recipes.qa import EvalQAConfig, eval_qa

    eval_qa(parse_config(EvalQAConfig, argv, prog="ludic eval qa"))


def _train_env(argv: list[str]) -> None:
    from ludic.recipes.env import TrainEnvConfig, train_env

    out = train_env(parse_config(TrainEnvConfig, argv, prog="ludic train env"))
    print(json.dumps({k: out[k] for k in ("base", "format_demos", "trained", "success_gain", "kept", "run_dir")
                      if k in out}, indent=2))


def _eval_env(argv: list[str]) -> None:
    from ludic.recipes.env import EvalEnvConfig, eval_env

    eval_env(parse_config(EvalEnvConfig, argv, prog="ludic eval env"))


def _eval_rescore(argv: list[str]) -> None:
    from ludic.eval.rescore import RescoreConfig, rescore

    if argv and not argv[0].startswith("-"):  # RUN_OR_FILE first, as a positional argument
        argv = ["--source", argv[0], *argv[1:]]
    rescore(parse_config(RescoreConfig, argv, prog="ludic eval rescore"))


def _eval_games(argv: list[str]) -> None:
    from ludic.recipes.games import EvalGamesConfig, eval_games

    print(json.dumps(eval_games(parse_config(EvalGamesConfig, argv, prog="ludic eval games")), indent=2))


def _report(argv: list[str]) -> None:
    import argparse

    from ludic.report import build_report

    parser = argparse.ArgumentParser(prog="ludic report", description="(Re)write RUN_DIR/report.html from the run's logs.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by ludic train/recipe")
    args = parser.parse_args(argv)
    try:
        print(f"report written to {build_report(args.run_dir)}")
    except FileNotFoundError as e:
        raise SystemExit(f"ludic report: {e}")


def _model_prepare(argv: list[str]) -> None:
    from ludic.inference.models import make_tiny_model, packaged_model_dir, cache_dir

    path = packaged_model_dir()
    print(f"packaged model ready: {path}")
    tiny = make_tiny_model(cache_dir() / "models" / "tiny-random-llama")
    print(f"tiny test model ready: {tiny}")


COMMANDS: dict[tuple[str, ...], Callable[[list[str]], None]] = {
    ("train", "tictactoe"): _train_tictactoe,
    ("train", "prompts"): _train_prompts,
    ("train", "env"): _train_env,
    ("eval", "env"): _eval_env,
    ("eval", "rescore"): _eval_rescore,
    ("train", "games"): _train_games,
    ("eval", "games"): _eval_games,
    ("train", "qa"): _train_qa,
    ("eval", "qa"): _eval_qa,
    ("actor", "tictactoe"): _actor_tictactoe,
    ("learner", "tictactoe"): _learner_tictactoe,
    ("actor", "env"): _actor_env,
    ("learner", "env"): _learner_env,
    ("eval", "tictactoe"): _eval_tictactoe,
    ("datagen", "tictactoe"): _datagen_tictactoe,
    ("datagen", "thinktactoe"): _datagen_thinktactoe,
    ("sft",): _sft,
    ("dpo",): _dpo,
    ("recipe", "tictactoe"): _recipe_tictactoe,
    ("model", "prepare"): _model_prepare,
    ("report",): _report,
}


def _main_task(frame: Any) -> Any:
    """``asyncio.run``'s main task, found in the frames a signal interrupted (``asyncio.runners.Runner.run``
    holds it as ``task``, Python 3.11-3.13); None outside an event loop."""
    import asyncio

    while frame is not None:
        if frame.f_code.co_name == "run" and frame.f_globals.get("__name__") == "asyncio.runners":
            task = frame.f_locals.get("task")
            if isinstance(task, asyncio.Task):
                return task
        frame = frame.f_back
    return None


def stop_on_sigterm() -> None:
    """Make SIGTERM stop a run as Ctrl-C does: a scheduler (Slurm's time limit, a Kubernetes eviction) or ``kill``
    then leaves a checkpoint of the step it stopped on, the final weights and ``summary.json``, not a dead process.
    Inside ``asyncio.run`` the handler cancels the main task, as asyncio's own Ctrl-C handler does (an exception
    raised from a signal handler could land in any task: the engine's, say); outside it (loading the model) it
    raises ``errors.Terminated``. Whether SIGINT is handled or ignored (a run started in a script's background)
    does not matter. A second SIGTERM kills at once. The main thread only (signals are delivered there)."""
    import signal
    import threading

    from ludic import errors

    def on_sigterm(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM is not asked twice
        errors.TERMINATED_BY = "SIGTERM"
        task = _main_task(frame)
        if task is None or task.done():
            raise errors.Terminated("SIGTERM")
        task.cancel(msg="SIGTERM")
        task.get_loop().call_soon_threadsafe(lambda: None)  # wake a loop waiting in select()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)


def main(argv: list[str] | None = None) -> None:
    """The ``ludic`` command. Run from the command line (``argv`` None) SIGTERM stops a run as Ctrl-C does
    (``stop_on_sigterm``); a caller passing ``argv`` keeps its own signal handlers."""
    if argv is None:
        stop_on_sigterm()
    argv = list(sys.argv[1:] if argv is None else argv)
    for n in (2, 1):
        if tuple(argv[:n]) in COMMANDS:
            from ludic import errors
            from ludic.errors import TrainingStopped, UsageError

            try:
                COMMANDS[tuple(argv[:n])](argv[n:])
            except UsageError as e:  # the user's flag or spec: its message, no traceback
                print(f"ludic {' '.join(argv[:n])}: error: {e}", file=sys.stderr)
                raise SystemExit(2) from None
            except TrainingStopped as e:  # a failed run, its results saved: why, no traceback
                print(f"ludic {' '.join(argv[:n])}: the run failed ({e.reason}): {e}", file=sys.stderr)
                raise SystemExit(3) from None
            except BaseException as e:  # noqa: B036  (after a SIGTERM: the Ctrl-C or cancellation it became)
                if not errors.TERMINATED_BY or isinstance(e, SystemExit):
                    raise
                print(f"ludic {' '.join(argv[:n])}: stopped by {errors.TERMINATED_BY} ({type(e).__name__}); what the "
                      "run saved on its way out (checkpoint, final weights, summary.json) is in its run directory",
                      file=sys.stderr)
                raise SystemExit(143) from None
            return
    print(__doc__)
    print("commands: " + ", ".join(" ".join(k) for k in COMMANDS))
    raise SystemExit(0 if argv[:1] in (["-h"], ["--help"]) else 2)


if __name__ == "__main__":
    main()
