"""The ``ludic`` command.

    ludic train tictactoe [flags]     GRPO + LoRA on tic-tac-toe
    ludic eval tictactoe [flags]      win / draw / loss / illegal / parse-error rates
    ludic model prepare               convert the packaged model once (cached)

Run ``ludic <command> <target> --help`` for the flags of each command.
"""

from __future__ import annotations

import json
import sys
from typing import Callable

from ludic.config import parse_config


def _train_tictactoe(argv: list[str]) -> None:
    from ludic.recipes.tictactoe import TrainTicTacToeConfig, train

    cfg = parse_config(TrainTicTacToeConfig, argv, prog="ludic train tictactoe")
    metrics = train(cfg)
    print(json.dumps({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, indent=2))


def _eval_tictactoe(argv: list[str]) -> None:
    from ludic.recipes.tictactoe import EvalTicTacToeConfig, evaluate

    cfg = parse_config(EvalTicTacToeConfig, argv, prog="ludic eval tictactoe")
    metrics = evaluate(cfg)
    for k, v in metrics.items():
        print(f"{k:>24}: {v * 100:6.1f}%" if k.endswith("_rate") else f"{k:>24}: {v:.3f}")
    print(f"records written to {cfg.out}")


def _model_prepare(argv: list[str]) -> None:
    from ludic.inference.models import make_tiny_model, packaged_model_dir, cache_dir

    path = packaged_model_dir()
    print(f"packaged model ready: {path}")
    tiny = make_tiny_model(cache_dir() / "models" / "tiny-random-llama")
    print(f"tiny test model ready: {tiny}")


COMMANDS: dict[tuple[str, str], Callable[[list[str]], None]] = {
    ("train", "tictactoe"): _train_tictactoe,
    ("eval", "tictactoe"): _eval_tictactoe,
    ("model", "prepare"): _model_prepare,
}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or (argv[0], argv[1]) not in COMMANDS:
        print(__doc__)
        print("commands: " + ", ".join(" ".join(k) for k in COMMANDS))
        raise SystemExit(0 if argv[:1] in (["-h"], ["--help"]) else 2)
    COMMANDS[(argv[0], argv[1])](argv[2:])


if __name__ == "__main__":
    main()
