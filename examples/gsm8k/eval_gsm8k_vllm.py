"""GSM8K accuracy and pass@k on a vLLM server: `ludic eval qa` with GSM8K defaults.

    python examples/gsm8k/eval_gsm8k_vllm.py --start-server                  # start a vLLM server for the model
    python examples/gsm8k/eval_gsm8k_vllm.py --port 8000 --samples 8 --k 1,4,8 --temperature 0.8
    python examples/gsm8k/eval_gsm8k_vllm.py --inference transformers --data arith --max-completion-tokens 16

Answers are read by the same parser `ludic train qa` rewards with (`--answer`), and graded by the
same grader (`--grader`). Every sample goes to gsm8k_eval.jsonl (question, reply, parsed, correct).
"""

import sys

from ludic.cli import main

DEFAULTS = [
    "--data", "openai/gsm8k", "--split", "test", "--limit", "0", "--grader", "math", "--answer", "auto",
    "--system-prompt", "First, think step by step. Then put your final answer inside \\boxed{...}.",
    "--template", "{question}", "--max-completion-tokens", "512", "--inference", "vllm",
    "--out", "gsm8k_eval.jsonl",
]

if __name__ == "__main__":
    main(["eval", "qa", *DEFAULTS, *sys.argv[1:]])
