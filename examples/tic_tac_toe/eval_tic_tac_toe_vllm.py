"""Evaluate win / loss / draw / illegal / parse-error rates (same flags as `ludic eval tictactoe`).

    python examples/tic_tac_toe/eval_tic_tac_toe_vllm.py --inference vllm --start-server --episodes 200 --ctx truncated
    python examples/tic_tac_toe/eval_tic_tac_toe_vllm.py --inference vllm --model ttt_rl --episodes 200
    python examples/tic_tac_toe/eval_tic_tac_toe_vllm.py --adapter runs/<run>/checkpoints/step_000030/model
"""

from ludic.cli import main

if __name__ == "__main__":
    import sys

    main(["eval", "tictactoe", *sys.argv[1:]])
