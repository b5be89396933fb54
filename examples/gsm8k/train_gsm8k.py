"""GRPO (grouped advantages + PPO-style clip) on GSM8K: `ludic train qa` with GSM8K defaults.

    python examples/gsm8k/train_gsm8k.py                                   # openai/gsm8k from the hub
    python examples/gsm8k/train_gsm8k.py --data gsm8k_train.jsonl          # a local JSONL (question/answer)
    python examples/gsm8k/train_gsm8k.py --data arith --max-completion-tokens 16 --train-steps 30
                                                                           # offline: generated word problems
    python examples/gsm8k/train_gsm8k.py --inference vllm                  # sample on a vLLM server (GPU)

Held-out accuracy (greedy, the same parser and grader as the rewards) is printed before and after.
Any flag of `ludic train qa` works here; flags given on the command line win over these defaults.
"""

import sys

from ludic.cli import main

DEFAULTS = [
    "--data", "openai/gsm8k", "--grader", "math", "--answer", "auto",
    "--system-prompt", "First, think step by step. Then put your final answer inside \\boxed{...}.",
    "--template", "{question}", "--max-completion-tokens", "512", "--group-size", "8",
    "--algorithm", "grpo", "--max-grad-norm", "0.5", "--train-steps", "20", "--eval-limit", "1000",
]

if __name__ == "__main__":
    main(["train", "qa", *DEFAULTS, *sys.argv[1:]])
