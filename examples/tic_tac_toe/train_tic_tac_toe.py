"""Tic-tac-toe GRPO + LoRA (same flags as `ludic train tictactoe`).

    python examples/tic_tac_toe/train_tic_tac_toe.py --ctx truncated --micro-token-budget 8192 --max-seq-len 1024
"""

from ludic.config import parse_config
from ludic.tictactoe.train import TrainTicTacToeConfig, train

if __name__ == "__main__":
    metrics = train(parse_config(TrainTicTacToeConfig, prog="train_tic_tac_toe.py"))
    print({k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)})
