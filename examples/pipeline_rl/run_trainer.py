"""Pipeline RL learner (same flags as `ludic learner tictactoe`): train on batches pulled from
Redis, checkpoint (then acknowledge what the checkpoint holds), publish and announce weights.

    python examples/pipeline_rl/run_trainer.py --redis-url redis://127.0.0.1:6379/0 --run-dir runs/p1 \\
        --train-steps 100 --behavior-is token_truncate --max-lag 2
"""

import json

from ludic.config import parse_config
from ludic.tictactoe.train import TrainTicTacToeConfig
from ludic.tictactoe.pipeline import run_learner

if __name__ == "__main__":
    out = run_learner(parse_config(TrainTicTacToeConfig, prog="run_trainer.py"))
    print(json.dumps({k: v for k, v in out.items() if isinstance(v, (int, float, dict))}, indent=2))
