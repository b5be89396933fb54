"""How a rewards-only run's policy spreads its probability over the cells, on the 335 teacher positions.

Scores every legal cell of every position as a whole reply (the cell and the end token) under the run's policy (the
cold start's weights in ``sft/final`` plus the kept RL adapter in ``rl/final``), and compares three readings of it:
the greedy move (decoded as the exact evaluation decodes it), the most likely whole reply, and the probability of
a value-preserving reply when sampling at temperature 1. They disagree when the greedy decoding of a two-token
cell picks its row first, or when the good moves share their mass while one bad move is the single most likely.

    python examples/rewards_only/reply_mass.py runs/rewards_only/move-s0            # the kept RL policy
    python examples/rewards_only/reply_mass.py runs/rewards_only/move-s0 --stage sft  # the cold start alone

Measured on ``probe-replay094-15min-s0`` (docs/studies.md): 56.4 / 56.1 / 55.1% value-preserving, the greedy
move equal to the most likely reply on 98.8% of the positions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from pathlib import Path


def reply_mass(run_dir: Path, stage: str = "rl") -> dict[str, float]:
    import torch

    import ludic.tictactoe.board as ttt
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.tictactoe.position_rl import View, greedy_moves
    from ludic.tictactoe.prompts import ANSWER_TOKENS
    from ludic.tictactoe.synth import teacher_position_records, teacher_positions
    from ludic.tokenization import render_ids
    from ludic.training.lora import load_policy

    cfg = json.loads((run_dir / "config.json").read_text())
    if cfg.get("answer", "cell") != "cell":
        raise SystemExit(f"{run_dir}: answer style {cfg.get('answer')!r}; this script scores bare cells only")
    whole = stage == "rl" and not cfg.get("lora_rank", 16)  # --lora-rank 0: rl/final is the whole model
    model, tok = load_policy(str(run_dir / ("rl" if whole else "sft") / "final"), dtype="float32", seed=0)
    if stage == "rl" and not whole:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(run_dir / "rl" / "final"))
    model.eval()
    view = View(cfg["system_prompt"], compact=cfg["compact"], show_moves=cfg["show_moves"],
                max_tokens=ANSWER_TOKENS["cell"], answer="cell")
    boards = teacher_positions()
    greedy = asyncio.run(greedy_moves(TransformersEngine(model, tok), boards, view))
    n = len(boards)
    sums = {"greedy_value_preserving": 0.0, "argmax_value_preserving": 0.0, "sampled_value_preserving": 0.0,
            "sampled_legal": 0.0, "greedy_is_argmax": 0.0}
    # the prompts SFT, RL and the exact evaluation all use
    # (tests/test_recipe_tictactoe.py::test_recipe_prompts_are_the_same_in_sft_data_rl_and_exact_evaluation)
    records = teacher_position_records(view.system_prompt, compact=view.compact, style="cell",
                                       show_moves=view.show_moves)
    for board, g, record in zip(boards, greedy, records):
        prompt = render_ids(tok, record["messages"])
        legal = ttt.legal_moves(board)
        replies = [tok.encode(ttt.coord(m), add_special_tokens=False) + [tok.eos_token_id] for m in legal]
        width = max(len(r) for r in replies)
        ids = torch.tensor([prompt + r + [tok.eos_token_id] * (width - len(r)) for r in replies])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
        start = len(prompt) - 1
        scores = [sum(float(logp[i, start + j, t]) for j, t in enumerate(r)) for i, r in enumerate(replies)]
        good = set(ttt.optimal_moves(board))
        best = legal[max(range(len(legal)), key=scores.__getitem__)]
        sums["greedy_value_preserving"] += g in good
        sums["argmax_value_preserving"] += best in good
        sums["sampled_value_preserving"] += sum(math.exp(s) for m, s in zip(legal, scores) if m in good)
        sums["sampled_legal"] += sum(math.exp(s) for s in scores)
        sums["greedy_is_argmax"] += g == best
    return {"positions": float(n), **{k: v / n for k, v in sums.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--stage", choices=("rl", "sft"), default="rl", help="the kept RL policy or the cold start alone")
    args = ap.parse_args()
    out = reply_mass(args.run_dir, args.stage)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
