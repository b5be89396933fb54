"""Tic-tac-toe GRPO on the Tinker backend: Ludic's envs, agents, protocols and credit; the service's
sampling and LoRA training (``ludic.inference.tinker_client``, ``ludic.training.tinker``).

    TINKER_API_KEY=... python examples/tic_tac_toe/train_tic_tac_toe_tinker.py --train-steps 20 --wandb-name ttt-tinker
    python examples/tic_tac_toe/train_tic_tac_toe_tinker.py --standin --train-steps 5   # offline: the local stand-in

Each step: the rollout source plays ``rollouts_per_update`` games (GRPO groups) with the current
sampler, credit turns them into SAW items, one ``forward_backward`` + ``optim_step`` runs on the
service, and ``save_weights_and_get_sampling_client`` gives the next version's sampler. The run
directory holds config.json, metrics.jsonl, rollouts.jsonl (token traces, policy version per token)
and report.html, as for any Ludic run.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HOSTED_DEFAULT_MODEL = "meta-llama/Llama-3.2-1B"


@dataclass
class TinkerTicTacToeConfig:
    """GRPO + LoRA on tic-tac-toe with sampling and training on a Tinker service."""

    train_steps: int = 20
    wandb_name: str | None = None
    """Log to Weights & Biases under this run name (the run directory is runs/<name>)."""
    base_url: str | None = None
    """Tinker endpoint (None: the SDK's default, the hosted service)."""
    standin: bool = False
    """Start Ludic's local Tinker stand-in (not Tinker: ludic.inference.tinker_standin) on CPU and use it."""
    base_model: str | None = None
    """Model the service trains (default: the packaged SmolLM2-135M with --standin, else a hosted model)."""
    lora_rank: int = 16
    learning_rate: float = 4e-5
    loss_fn: str = "importance_sampling"
    """importance_sampling | ppo."""
    group_size: int = 8
    rollouts_per_update: int = 32
    opponent: str = "random"
    max_completion_tokens: int = 64
    temperature: float = 1.0
    eval_episodes: int = 20
    """Greedy games vs the opponent before and after training (0: none)."""
    run_dir: str | None = None
    logger: str = "rich"
    seed: int = 0


def train_tinker(cfg: TinkerTicTacToeConfig) -> dict[str, Any]:
    return asyncio.run(_train(cfg))


def standin_process(model: str, run_dir: Path) -> Any:
    """Ludic's Tinker stand-in as a subprocess (a ``ServerProcess``), not yet started."""
    import sys

    from ludic.inference.vllm_launcher import ServerProcess, free_port

    port = free_port()
    server = ServerProcess([sys.executable, "-m", "ludic.inference.tinker_standin", "--model", model,
                            "--port", str(port)], port, run_dir / "tinker_standin.log")
    server.name, server.health = "the Tinker stand-in", "/api/v1/get_server_capabilities"
    return server


async def _train(cfg: TinkerTicTacToeConfig) -> dict[str, Any]:
    import tinker

    from ludic.config import dump_config
    from ludic.inference.models import DEFAULT_MODEL, load_tokenizer, resolve_model
    from ludic.inference.tinker_client import TinkerChatClient
    from ludic.tictactoe.train import TrainTicTacToeConfig, rollout_source
    from ludic.tictactoe.prompts import eval_requests, make_protocol_factory, run_eval
    from ludic.recipes.common import default_run_dir
    from ludic.rollouts.engine import RolloutEngine
    from ludic.training.loggers import logger_names, make_logger
    from ludic.training.tinker import TinkerLearner

    spec = cfg.logger + (",wandb" if cfg.wandb_name and "wandb" not in cfg.logger else "")
    logger_names(spec)
    run_dir = Path(cfg.run_dir or (Path("runs") / cfg.wandb_name if cfg.wandb_name else default_run_dir("tinker")))
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.json")
    proc = None
    base_model = cfg.base_model
    if cfg.standin:
        base_model = resolve_model(base_model or DEFAULT_MODEL)
        proc = standin_process(base_model, run_dir).start(timeout_s=150)
        url = proc.url
        os.environ.setdefault("TINKER_API_KEY", "tml-ludic-standin")  # the SDK wants one; the stand-in ignores it
        print(f"[tinker] using Ludic's local Tinker STAND-IN at {url} (not the Tinker service)", flush=True)
    else:
        url = cfg.base_url
        base_model = base_model or HOSTED_DEFAULT_MODEL
        if not os.environ.get("TINKER_API_KEY"):
            raise SystemExit("set TINKER_API_KEY (or use --standin for the local stand-in)")
    tok = load_tokenizer(base_model)
    results: dict[str, Any] = {}
    logger = None
    try:
        service = tinker.ServiceClient(base_url=url)
        training = await service.create_lora_training_client(base_model=base_model, rank=cfg.lora_rank, seed=cfg.seed)
        client = TinkerChatClient(tok)
        learner = TinkerLearner(training, client, loss_fn=cfg.loss_fn, lr=cfg.learning_rate)
        await learner.publish()  # version 1: the starting adapter
        ttt = TrainTicTacToeConfig(model=base_model, group_size=cfg.group_size, rollouts_per_update=cfg.rollouts_per_update,
                                   opponent=cfg.opponent, max_completion_tokens=cfg.max_completion_tokens,
                                   train_temperature=cfg.temperature, seed=cfg.seed, concurrency=cfg.rollouts_per_update)
        source, _, _ = rollout_source(ttt, client, None, tok, run_dir)
        evaluator = RolloutEngine({"single_agent": make_protocol_factory(client, ttt.ctx, 0.0, cfg.max_completion_tokens)},
                                  concurrency=max(1, cfg.eval_episodes))

        async def evaluate(stage: str) -> None:
            if cfg.eval_episodes:
                m, _ = await run_eval(evaluator, eval_requests(cfg.eval_episodes, cfg.opponent))
                results[stage] = {k: m[k] for k in ("win_rate", "draw_rate", "loss_rate", "illegal_rate",
                                                    "parse_error_rate") if k in m}
                print(f"[tinker] {stage}: " + "  ".join(f"{k}={v:.2f}" for k, v in results[stage].items()), flush=True)

        await evaluate("before")
        logger = make_logger(spec, run_dir, asdict(cfg), total_steps=cfg.train_steps)
        for step in range(1, cfg.train_steps + 1):
            t0 = time.perf_counter()
            batch = await source.next_batch()
            metrics = {**batch.meta, **await learner.step(batch.items), "step_s": time.perf_counter() - t0}
            logger.log(step, metrics)
        await evaluate("after")
        (run_dir / "tinker_results.json").write_text(json.dumps(results, indent=2))
        return {**results, "run_dir": str(run_dir), "policy_version": learner.version}
    finally:
        if logger is not None:
            logger.close()
        if proc is not None:
            proc.stop()
