"""``ludic datagen tictactoe``: SFT cold-start data by rejection sampling or from the solver teacher.

    --source model     roll out --model with FullDialog, keep wins (or wins and draws), write records
    --source teacher   the perfect solver plays, with templated thoughts (no capable model needed)

Earlier assistant turns are rewritten to the ``[TRUNCATED]`` convention unless
``--no-transform`` (what TruncatedThinkingContext will show during RL).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ludic.recipes.blocks import EvalInferenceBlock, ModelBlock


@dataclass
class DatagenConfig(ModelBlock, EvalInferenceBlock):
    """Generate tic-tac-toe SFT data (rejection sampling or solver teacher)."""

    source: str = "teacher"
    """teacher (perfect solver with templated thoughts) or model (rejection sampling)."""
    episodes: int = 5000
    output: str = "data/tictactoe_sft_train_data.jsonl"
    transform: bool = True
    """Rewrite earlier assistant turns to <think>[TRUNCATED]</think>answer (--no-transform keeps them raw)."""
    placeholder: str = "[TRUNCATED]"
    keep: str = "win"
    """Episode results to keep, comma-separated: win, or win,draw."""
    opponent: str = "random"
    """Opponent for --source model: random, minimax or mixed."""
    epsilon: float = 0.3
    ctx: str = "full"
    """Prompt view written into the records: full (history) or last (latest observation only)."""
    compact: bool = False
    """Compact board rendering."""
    temperature: float = 0.8
    max_tokens: int = 250
    max_steps: int = 5
    concurrency: int = 32
    seed: int = 0


def datagen(cfg: DatagenConfig) -> dict[str, Any]:
    from ludic.data.jsonl import write_jsonl
    from ludic.tictactoe.synth import teacher_records
    from ludic.tictactoe.prompts import SYSTEM_PROMPT

    t0 = time.perf_counter()
    keep = tuple(k.strip() for k in cfg.keep.split(",") if k.strip())
    if cfg.source == "teacher":
        records = teacher_records(cfg.episodes, SYSTEM_PROMPT, ctx=cfg.ctx, transform=cfg.transform, keep=keep,
                                  seed=cfg.seed, compact=cfg.compact)
        kept = len({json.dumps(r["meta"]) for r in records})
    elif cfg.source == "model":
        records, kept = asyncio.run(_rejection_sample(cfg, keep))
    else:
        raise ValueError(f"source must be teacher or model, got {cfg.source!r}")
    write_jsonl(cfg.output, records)
    stats = {"episodes": cfg.episodes, "records": len(records), "seconds": time.perf_counter() - t0,
             "output": str(Path(cfg.output))}
    if cfg.source == "model":
        stats["kept_episodes"] = kept
        stats["keep_rate"] = kept / max(cfg.episodes, 1)
    return stats


async def _rejection_sample(cfg: DatagenConfig, keep: tuple[str, ...]) -> tuple[list[dict], int]:
    from ludic.recipes.backends import make_eval_client

    client, close = await make_eval_client(cfg)
    try:
        return await rejection_sample(client, cfg.episodes, keep, opponent=cfg.opponent, epsilon=cfg.epsilon,
                                      ctx=cfg.ctx, transform=cfg.transform, placeholder=cfg.placeholder,
                                      compact=cfg.compact, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                                      max_steps=cfg.max_steps, concurrency=cfg.concurrency, seed=cfg.seed)
    finally:
        await close()


async def rejection_sample(
    client: Any, episodes: int, keep: tuple[str, ...] = ("win",), *, opponent: str = "random", epsilon: float = 0.3,
    ctx: str = "full", transform: bool = True, placeholder: str = "[TRUNCATED]", compact: bool = False,
    temperature: float = 0.8, max_tokens: int = 250, max_steps: int = 5, concurrency: int = 32, seed: int = 0,
) -> tuple[list[dict], int]:
    """Roll out the policy behind ``client`` with FullDialog (half the episodes as X), keep the
    episodes whose result is in ``keep``; returns their SFT records (as context ``ctx`` shows
    them) and the number of episodes kept."""
    from ludic.tictactoe.synth import filter_rollouts, keep_results, rollouts_to_records
    from ludic.tictactoe.prompts import SYSTEM_PROMPT, make_protocol_factory
    from ludic.rollouts.engine import RolloutEngine
    from ludic.types import EnvSpec, RolloutRequest

    engine = RolloutEngine({"single_agent": make_protocol_factory(client, "full", temperature, max_tokens)},
                           concurrency=concurrency)
    reqs = [RolloutRequest(EnvSpec("tictactoe", {"opponent": opponent, "epsilon": epsilon,
                                                 "agent_starts": i % 2 == 0, "compact": compact}),
                           env_seed=seed * 1_000_003 + i, sampling_seed=seed * 1_000_003 + i, max_steps=max_steps)
            for i in range(episodes)]
    rollouts = await engine.generate_rollouts(reqs, progress="datagen")
    kept = filter_rollouts(rollouts, keep_results(*keep))
    return rollouts_to_records(kept, SYSTEM_PROMPT, ctx=ctx, transform=transform, placeholder=placeholder), len(kept)
