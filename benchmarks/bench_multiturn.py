"""Multi-turn training cost: one merged sequence per episode against one item per turn, one run.

Workload: 16 tic-tac-toe episodes (4 GRPO groups of 4) with ``FullDialog`` (token-in), the
solver teacher as the policy (real templated ``<think>...</think><move>..</move>`` replies,
tokenised with the packaged SmolLM2 chat template, so episodes run 3-5 agent turns against a
mixed opponent), then a GRPO optimizer step on SmolLM2-135M-Instruct with LoRA r16:

    merged     build_saw_items(..., merge_turns=True)   one sequence per episode (FullDialog)
    per-turn   build_saw_items(..., merge_turns=False)  one item per turn, each re-reading the history

    python benchmarks/bench_multiturn.py [--repeats 2] [--dtype auto] [--episodes 16] [--quick]
                                         [--workload tictactoe|textarena]

``--workload textarena``: 16 TextArena ``GuessTheNumber-v0`` games (secret 1-20, up to 10 turns), a
scripted guesser (half the games count up from 1, half guess at random inside what the hints allow: 2
to 10 turns), the same games seen two ways (``TextArenaEnv(observations=...)``):

    new        what the game added each turn, in a dialog (FullDialog): one sequence per episode
    full       the whole game text each turn (TextArena's view, LastObservationContext): one item per turn

Prints trained (sampled) tokens and sequence tokens (what the trainer's forward pass reads)
per episode, and the optimizer step time (median of the repeats, after one warm-up each),
with the CPU's bf16 support and the dtype. Compare only within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class TeacherClient:
    """A ChatClient that plays the perfect solver's move on its env's board, as real tokens.

    Prompt ids come from the agent (token-in); the reply is the teacher's templated text,
    tokenised and closed with EOS, with placeholder log-probs (-1.0) and policy version 0.
    """

    def __init__(self, env, tokenizer, seed: int) -> None:
        self.env, self._tok, self.rng = env, tokenizer, random.Random(seed)

    @property
    def tokenizer(self):
        return self._tok

    async def complete(self, request):
        from ludic.tictactoe.synth import teacher_reply
        from ludic.inference.client import ChatResponse
        from ludic.tokenization import render_ids
        from ludic.types import TokenTrace

        text = teacher_reply(self.env.board, self.rng)
        prompt = request.prompt_ids or tuple(render_ids(self._tok, request.messages))
        ids = self._tok(text, add_special_tokens=False)["input_ids"] + [self._tok.eos_token_id]
        return ChatResponse(text, TokenTrace(tuple(prompt), tuple(ids), (-1.0,) * len(ids), (0,) * len(ids)))


async def teacher_rollouts(tok, n: int = 16, group: int = 4):
    from ludic.agents.agent import Agent
    from ludic.context import FullDialog
    from ludic.tictactoe.env import TicTacToeEnv
    from ludic.interaction import SingleAgentProtocol
    from ludic.parsers import think_move_parser
    from ludic.tictactoe.prompts import SYSTEM_PROMPT

    async def one(i: int):
        env = TicTacToeEnv(opponent="mixed", epsilon=0.5, agent_starts=i % 2 == 0)
        agent = Agent(TeacherClient(env, tok, seed=i), FullDialog(SYSTEM_PROMPT), think_move_parser())
        [r] = await SingleAgentProtocol(agent).run(env, max_steps=5, env_seed=i)
        r.meta["group_id"] = f"g{i // group}"
        return r

    return await asyncio.gather(*(one(i) for i in range(n)))


def guesser(seed: int):
    """A ``FunctionClient`` reply guessing TextArena's number from the hints in its dialog: game ``seed``
    counts up from the lowest number the hints allow (even seeds) or picks at random in that range."""
    import re

    rng, count_up = random.Random(seed), seed % 2 == 0

    def reply(messages) -> str:
        text = "\n".join(m["content"] for m in messages if m["role"] != "system")
        lo, hi = 1, 20
        for guess, hint in re.findall(r"(\d+)\D{0,60}?\b(higher|lower)\b", text):
            lo, hi = (max(lo, int(guess) + 1), hi) if hint == "higher" else (lo, min(hi, int(guess) - 1))
        guess = lo if count_up else rng.randint(lo, max(lo, hi))
        return f"I will guess {guess}. [{guess}]"

    return reply


async def textarena_rollouts(tok, observations: str, n: int = 16, group: int = 4):
    """``n`` GuessTheNumber games (``group`` per secret) seen as ``observations`` ("new" or "full")."""
    from ludic.agents.agent import Agent
    from ludic.context import make_context
    from ludic.envs.textarena_env import TextArenaEnv
    from ludic.inference.client import FunctionClient
    from ludic.interaction import SingleAgentProtocol

    async def one(i: int):
        env = TextArenaEnv("GuessTheNumber-v0", observations=observations)
        agent = Agent(FunctionClient(tok, guesser(i)), make_context(env.preferred_context))
        [r] = await SingleAgentProtocol(agent).run(env, max_steps=10, env_seed=i // group)
        r.meta["group_id"] = f"g{i // group}"
        return r

    return await asyncio.gather(*(one(i) for i in range(n)))


def cpu_bf16() -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "avx512_bf16" in flags or "amx_bf16" in flags


def run(repeats: int | None = None, dtype: str = "auto", episodes: int | None = None, *,
        quick: bool = False, workload: str = "tictactoe") -> dict:
    """Both modes on the same episodes and the same trainer; part (e) of the runner
    (--quick: 4 episodes, 1 repeat)."""
    from benchmarks.common import row

    from ludic.inference.models import packaged_model_dir, resolve_dtype
    from ludic.rollouts.batch import build_saw_items
    from ludic.training.algorithms import make_algorithm
    from ludic.training.lora import LoraSettings, load_policy
    from ludic.training.trainer import Trainer, TrainerConfig

    repeats, episodes = repeats or (1 if quick else 2), episodes or (4 if quick else 16)
    model_dir, dtype = str(packaged_model_dir()), resolve_dtype(dtype)
    model, tok = load_policy(model_dir, lora=LoraSettings(rank=16, alpha=32), dtype=dtype, seed=0)
    if workload == "tictactoe":
        rollouts = asyncio.run(teacher_rollouts(tok, episodes))
        modes = (("merged", rollouts, True), ("per-turn", rollouts, False))
    elif workload == "textarena":
        rollouts = asyncio.run(textarena_rollouts(tok, "new", episodes))
        modes = (("merged", rollouts, True),
                 ("per-turn", asyncio.run(textarena_rollouts(tok, "full", episodes)), True))
        if [len(r.steps) for r in rollouts] != [len(r.steps) for r in modes[1][1]]:
            raise RuntimeError("the two views of the same games took different turns")
    else:
        raise ValueError(f"workload must be tictactoe or textarena, got {workload!r}")
    turns = sum(len(r.steps) for r in rollouts) / len(rollouts)
    algo = make_algorithm("grpo")
    trainer = Trainer(model, algo, None, TrainerConfig(lr=1e-5, micro_token_budget=4096, max_seq_len=2048),
                      pad_token_id=tok.pad_token_id)
    rows = {}
    for name, eps, merge in modes:
        items = build_saw_items(eps, algo.credit, merge_turns=merge)
        trainer.optimize(items)  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            trainer.optimize(items)
            times.append(time.perf_counter() - t0)
        rows[name] = (len(items), sum(it.num_action_tokens for it in items), sum(it.num_tokens for it in items),
                      statistics.median(times))
    n = len(rollouts)
    print(f"[multiturn] {workload}: cpu native bf16: {cpu_bf16()}; dtype {dtype}; {n} episodes, {turns:.1f} agent turns each; "
          f"GRPO step, LoRA r16, SmolLM2-135M; median of {repeats}")
    print(f"[multiturn] {'mode':9} {'items':>6} {'trained tok/ep':>15} {'sequence tok/ep':>16} {'step s':>8}")
    for name, (k, trained, seq, t) in rows.items():
        print(f"[multiturn] {name:9} {k:6d} {trained / n:15.1f} {seq / n:16.1f} {t:8.2f}")
    m, p = rows["merged"], rows["per-turn"]
    print(f"[multiturn] ratio per-turn / merged: sequence tokens {p[2] / m[2]:.2f}x, step time {p[3] / m[3]:.2f}x")
    keys = ("items", "trained_tokens", "sequence_tokens", "step_s")
    tag = "" if workload == "tictactoe" else f" {workload}"
    return {
        "config": {"workload": workload, "episodes": n, "turns_per_episode": turns, "repeats": repeats, "dtype": dtype},
        "merged": dict(zip(keys, m)), "per_turn": dict(zip(keys, p)),
        "rows": [row("e", f"multi-turn{tag} GRPO step s (per-turn items / merged)", m[3], p[3], p[3] / m[3], unit="s"),
                 row("e", f"multi-turn{tag} sequence tokens (per-turn items / merged)", m[2], p[2], p[2] / m[2],
                     unit="tok")],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=None, help="default 2; 1 with --quick")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--episodes", type=int, default=None, help="default 16; 4 with --quick")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workload", default="tictactoe", choices=("tictactoe", "textarena"),
                    help="textarena: GuessTheNumber seen as what each turn added (one sequence) or the whole text")
    args = ap.parse_args()
    run(args.repeats, args.dtype, args.episodes, quick=args.quick, workload=args.workload)


if __name__ == "__main__":
    main()
