"""Offline SFT on pre-generated data (same flags as `ludic sft`); runs under torchrun too.

    python examples/tic_tac_toe/sft_tic_tac_toe.py --data data/tictactoe_sft_train_data.jsonl --epochs 1 \
        --batch-size 4 --micro-token-budget 8192 --max-seq-len 1024
    torchrun --nproc_per_node=2 examples/tic_tac_toe/sft_tic_tac_toe.py --data ...   # gloo on CPU, NCCL on GPU

Uses OfflineBatchSource + make_sft() (uniform-weight NLL on completion tokens).
"""

from ludic.config import parse_config
from ludic.recipes.sft import SFTConfig, sft

if __name__ == "__main__":
    out = sft(parse_config(SFTConfig, prog="sft_tic_tac_toe.py"))
    print({k: v for k, v in out.items() if isinstance(v, (int, float, str))})
