"""Tic-tac-toe GRPO + LoRA on the Tinker backend (serverless: no local vLLM, no local training).

    TINKER_API_KEY=... WANDB_API_KEY=... python examples/tic_tac_toe/train_tic_tac_toe_tinker.py \
        --train-steps 20 --wandb-name ttt-tinker
    ... --base-url https://my-tinker-endpoint            # a custom Tinker endpoint
    python examples/tic_tac_toe/train_tic_tac_toe_tinker.py --standin --train-steps 5 --logger print
                                                          # offline: Ludic's local stand-in (not Tinker), CPU

Envs, agents, protocols and credit are Ludic's; sampling and the LoRA's training steps go through the
official `tinker` SDK. Every flag: --help (ludic.tictactoe.tinker.TinkerTicTacToeConfig).
"""

from ludic.config import parse_config
from ludic.tictactoe.tinker import TinkerTicTacToeConfig, train_tinker

if __name__ == "__main__":
    out = train_tinker(parse_config(TinkerTicTacToeConfig, prog="train_tic_tac_toe_tinker.py"))
    print({k: v for k, v in out.items()})
