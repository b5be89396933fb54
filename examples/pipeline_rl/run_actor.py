"""Pipeline RL actor (same flags as `ludic actor tictactoe`): roll out tic-tac-toe games with the
in-process engine, push SAW items to Redis, follow the learner's weight announcements.

    redis-server --appendonly yes --appendfsync always &          # or any Redis 7
    python examples/pipeline_rl/run_actor.py --redis-url redis://127.0.0.1:6379/0 --actor-id a0
"""

from ludic.config import parse_config
from ludic.tictactoe.train import TrainTicTacToeConfig
from ludic.tictactoe.pipeline import run_actor

if __name__ == "__main__":
    run_actor(parse_config(TrainTicTacToeConfig, prog="run_actor.py"))
