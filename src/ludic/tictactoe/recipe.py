"""``ludic recipe tictactoe``: perfect tic-tac-toe from a small LLM on a CPU.

    0. base: exact evaluation (greedy policy vs minimax and vs random, both seats, every
       opponent branch) and the policy's move on the 335 teacher positions
    1. cold start: SFT of the top half of the layers (the rest frozen) on the solver's move on every position it
       can ever face (``--teacher solver``), or on uniformly random legal cells (``--teacher none``: rewards only,
       no good move shown); the per-position accuracy is traced as it trains; then its exact evaluation
    2. RL: a LoRA adapter on the top half of the layers, trained in rounds of position-level GRPO with the solver's
       score of each sampled move, on the decisions the exact evaluations find wrong and a replay of others
    3. exact evaluation; report.md, report.json, learning_curves.png and games.jsonl (the games, replayed)

``--budget-minutes`` fits the run to a wall-time budget: SFT and RL steps are set from
step times measured in this run. Everything runs in one process on one model object (no
reloads), with the in-process batched engine for rollouts and evaluations.

``--ctx truncated`` runs the seed's own workflow instead (``tictactoe.seed_recipe``):
multi-turn prompts with ``[TRUNCATED]`` thoughts, ``<think>...</think><move>...</move>``
answers, rejection-sampled episodes and GRPO on games.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from ludic.recipes.blocks import ModelBlock, RunBlock, load_policy_for
from ludic.tictactoe.prompts import ANSWER_TOKENS, ColdStartBlock
from ludic.recipes.common import Clock, machine
from ludic.tictactoe.recipe_eval import Evaluator, load_trainable_state, trainable_state
from ludic.tictactoe.recipe_report import precision, write_report
from ludic.tictactoe.rewards_only import rewards_only_defaults
from ludic.tictactoe.showcase import write_games
from ludic.training.signal import TrainingStopped

CALIBRATION_STEPS = 6
"""SFT steps timed before the step count is fitted to the budget, and RL batches before a decaying step is planned
over it (their median, the first left out)."""


@dataclass
class RecipeConfig(ModelBlock, ColdStartBlock, RunBlock):
    """Cold start + RL recipe for tic-tac-toe on the packaged SmolLM2-135M-Instruct."""

    teacher: str = "solver"
    """solver: SFT on the solver's move on every position it can face, then RL polishes (imitation first);
    none: rewards only: no good move shown anywhere, a format cold start on uniformly random legal cells
    (``cold_start_epochs``), then RL from the solver's scores of the policy's own samples."""
    reward: str = "move"
    """RL's reward. move: the solver scores each sampled move (best, value-preserving, value given away,
    illegal) on positions the policy gets wrong; outcome: whole games against an opponent ladder
    (``opponent_ladder``), each worth its result only (win 1, draw 0.5, loss 0, forfeit -1), credit over
    the game's turns (``tictactoe.game_rl``)."""
    opponent_ladder: str = "random,mixed:0.5,minimax"
    """--reward outcome: opponents, weakest first (random, mixed:EPS with EPS the share of random moves,
    minimax with random tie-breaks); the policy moves up when its sampled games against the current
    one are non-losses at least ``promote_at`` of the time."""
    promote_at: float = 0.9
    """--reward outcome: the sampled non-loss rate against the current rung that moves the policy up the ladder."""
    cold_start_epochs: float = 1.0
    """--teacher none: passes over the random-cell records (4 random legal cells per position) in the cold start."""
    budget_minutes: float = 27.0
    """Wall-time budget of the whole recipe, evaluations included: SFT and RL steps are set
    from the step times measured in this run (0: use --sft-steps / --rl-rounds as given)."""
    sft_epochs: float = 15.0
    """SFT length, in passes over the teacher positions (with a budget: capped by ``sft_share``; how many it takes:
    docs/studies.md, "Tic-tac-toe: the make train recipe", and docs/precision.md)."""
    sft_share: float = 0.4
    """Most of the budget left after the base evaluation that SFT may take (fewer epochs when
    ``sft_epochs`` would not fit); RL and the evaluations get the rest."""
    ctx: str = "last"
    """Prompt view: last (latest board only) for this recipe; truncated runs the seed's workflow."""
    system_prompt: str = "Tic-tac-toe."
    """Every prompt token is paid at every step: the board says the rest."""
    answer: str = "cell"
    """Teacher answer style: cell (B2: 2 tokens + end of turn), move (<move>B2</move>), kind
    (<think>block</think><move>B2</move>) or think (a templated sentence, then the move)."""
    compact: bool = True
    """Compact board rendering (fewer prompt tokens)."""
    show_moves: bool = False
    """List the free cells in the prompt (costs ~18 tokens per prompt)."""
    sft_steps: int = 0
    """SFT optimizer steps (0: ``sft_epochs``, fitted to the budget)."""
    sft_frozen_share: float = 0.5
    """Share of the decoder layers, from the bottom, frozen in SFT with the embeddings: no
    backward through them (0.5 of SmolLM2-135M's 30 layers: a step costs about a third less)."""
    curve_points: int = 4
    """Per-position accuracy measurements during SFT (each answers the 335 teacher positions)."""
    rl_rounds: int = 0
    """RL rounds (0: as many as the budget allows, the last one cut to the batches that fit, at most max_rl_rounds;
    they stop early only when the goal is met: no losing decision against minimax and every teacher position
    value-preserving)."""
    max_rl_rounds: int = 0
    """Most RL rounds when rl_rounds is 0 (0: no cap but the budget; without a budget, 12)."""
    rl_steps_per_round: int = 4
    """GRPO steps between two exact evaluations (which refresh the failure pool)."""
    positions_per_step: int = 16
    """Distinct positions (GRPO groups) per RL step, drawn from the failure pool and replayed ones
    (--reward outcome: groups of games per step)."""
    group_size: int = 8
    """Sampled answers per position."""
    rl_replay_fraction: float = 0.25
    """--reward move: share of each RL batch given to positions already right (replayed: a sampled mistake
    there is corrected too, which guards against forgetting)."""
    rl_replay: str = "teacher"
    """--reward move: where the replayed positions come from: teacher (the teacher positions the last evaluation
    found right: the failures are the pool's), all (all 335, right or wrong), played (all 335 and every position
    the policy met in its exact games so far: its own states, off the teacher's line too), failed (all 335 and every
    position an evaluation found wrong so far, off the teacher's line too), tree (all 335, the policy's own
    positions in its last evaluation's games against minimax and every one found wrong against minimax so far), or
    trained (the decisions earlier rounds trained on as losing against minimax: a fix survives rounds that skip it;
    ``PositionRLConfig.replay``)."""
    rl_replay_priority: float = 0.0
    """--reward move: share of the replayed positions drawn by how far the policy's samples there fell short of the
    best reward lately, not uniformly (``PositionRLConfig.replay_priority``)."""
    rl_focus_share: float = 0.0
    """--reward move: least share of each RL batch given to the positions the last evaluation found wrong against
    minimax, repeated when fewer, within what the replay share leaves (``PositionRLConfig.focus_share``)."""
    rl_focus_by: str = "uniform"
    """--reward move: how the batch's slots for those positions are drawn when they do not all fit: uniform, or
    reach (in proportion to how likely the evaluation's games against minimax reach each, so to what a wrong
    decision there costs its seat; ``PositionRLConfig.focus_by``)."""
    rl_lr: float = 2e-4
    rl_lr_schedule: str = "constant"
    """The RL step over the stage: constant, or a cosine or linear decay to ``rl_lr_floor`` at its last batch (with
    a budget, over the batches it holds, re-planned from the measured batch and evaluation times after the first
    batches and each round; ``Clock.batches_left``)."""
    rl_lr_floor: float = 0.0
    """Where the RL step's decay ends, as a fraction of --rl-lr (0: at 0; ``TrainerConfig.lr_floor``)."""
    rl_ppo_epochs: int = 1
    """Optimizer passes over each sampled RL batch (``TrainerConfig.ppo_epochs``; the later passes are clipped
    against the sampling policy): more learned from each visit to a position, for the cost of the training alone."""
    rl_scale_lr_by_signal: bool = False
    """Scale each RL step's lr by the share of its trained tokens with a nonzero advantage
    (``TrainerConfig.scale_lr_by_signal``): positions the policy already answers right add no step."""
    rl_temperature: float = 1.0
    rl_explore_samples: int = 0
    """--reward move: the last samples of each group explore (``rl_explore``), so a position whose samples all
    agree still has alternatives to compare (``PositionRLConfig.explore_samples``)."""
    rl_explore: str = "hotter"
    """How they explore: hotter (the policy at ``rl_explore_temperature``) or uniform (a uniformly random legal
    cell, trained with an importance ratio of 1 and only when it beat its group; no move preferred, so no
    strategy shown)."""
    rl_explore_temperature: float = 2.0
    rl_algorithm: str = "grpo"
    """The RL stage's algorithm (grpo, dr_grpo, rloo, ...)."""
    rl_kl_coef: float = 0.0
    """KL penalty to the policy RL starts from (after --teacher none: the random-cell cold start)."""
    rl_entropy_coef: float = 0.0
    """Entropy bonus of the RL loss."""
    lora_rank: int = 16
    """Rank of the RL adapter (alpha = 2 x rank); 0: no adapter, RL trains the layers themselves
    (--lora-layer-share)."""
    lora_layer_share: float = 0.5
    """Share of the decoder layers, from the top, that RL trains (1: all): they carry the adapter, or under
    --lora-rank 0 they train themselves (at most the layers SFT trained)."""
    eval_base: bool = True
    """Evaluate the base model first (exact, every branch), for the report's first row."""
    fast_path: bool = True
    """Ludic's hand-written CPU fast path (``ludic.fastpath``); --no-fast-path: stock transformers, peft, SDPA."""


def bottom_cache_pays(frozen_layers: int, samples: int, items: int) -> bool:
    """Whether SFT should cache the frozen bottom's output (``FrozenBottomCache``): only when some item is drawn
    twice (``samples`` drawn from ``items`` is more than one pass). The cache computes every item up front, so at
    one pass or less it only adds work: the rewards-only cold start's half pass over 1,340 records spent 135-160 s
    filling it, for items half of which no step ever drew."""
    return frozen_layers > 0 and samples > items


def rewards_only_config(**overrides: Any) -> RecipeConfig:
    """A ``RecipeConfig`` for ``--teacher none`` with the mode's defaults (``rewards_only_defaults`` of the
    reward), then ``overrides``."""
    return RecipeConfig(**{"teacher": "none", **rewards_only_defaults(overrides.get("reward", "move")), **overrides})


def counted_rounds(cfg: RecipeConfig) -> int:
    """The RL rounds a run without a budget runs (0 with one: the budget decides)."""
    return cfg.rl_rounds or (0 if cfg.budget_minutes else cfg.max_rl_rounds or 12)


def rl_learner(model: Any, cfg: RecipeConfig) -> Any:
    """What RL trains after the SFT stage: with ``cfg.lora_rank`` a fresh adapter (alpha twice the rank) on the top
    ``cfg.lora_layer_share`` of the layers, everything else frozen; else the model itself, its top
    ``cfg.lora_layer_share`` of the layers (at most the layers SFT trained: the others stay frozen)."""
    from ludic.training.lora import (LoraSettings, apply_lora, decoder_layers, freeze_bottom, frozen_bottom_layers,
                                     top_layer_count)

    n = len(decoder_layers(model))
    top = top_layer_count(cfg.lora_layer_share, n)
    if not cfg.lora_rank:
        freeze_bottom(model, max(frozen_bottom_layers(model), n - top))
        return model
    for p in model.parameters():
        p.requires_grad_(False)
    return apply_lora(model, LoraSettings(rank=cfg.lora_rank, alpha=2.0 * cfg.lora_rank, top_layers=top))


def rl_config(cfg: RecipeConfig) -> Any:
    """The RL stage's settings from the recipe's flags: a ``PositionRLConfig`` (``--reward move``) or an
    ``OutcomeRLConfig`` (``--reward outcome``: whole games against the opponent ladder), with the same step."""
    from ludic.tictactoe.position_rl import PositionRLConfig
    from ludic.training.config import TrainerConfig

    trainer = TrainerConfig(lr=cfg.rl_lr, lr_schedule=cfg.rl_lr_schedule, lr_floor=cfg.rl_lr_floor,
                            max_grad_norm=1.0, total_steps=counted_rounds(cfg) * cfg.rl_steps_per_round,
                            ppo_epochs=cfg.rl_ppo_epochs,
                            scale_lr_by_signal=cfg.rl_scale_lr_by_signal, micro_token_budget=cfg.micro_token_budget)
    if cfg.reward == "outcome":
        from ludic.tictactoe.game_rl import OutcomeRLConfig

        return OutcomeRLConfig(games_per_step=cfg.positions_per_step, group_size=cfg.group_size,
                               ladder=tuple(r.strip() for r in cfg.opponent_ladder.split(",") if r.strip()),
                               promote_at=cfg.promote_at, temperature=cfg.rl_temperature, seed=cfg.seed,
                               algorithm=cfg.rl_algorithm, kl_coef=cfg.rl_kl_coef,
                               entropy_coef=cfg.rl_entropy_coef, trainer=trainer)
    return PositionRLConfig(positions_per_step=cfg.positions_per_step, group_size=cfg.group_size,
                            temperature=cfg.rl_temperature, seed=cfg.seed, algorithm=cfg.rl_algorithm,
                            explore_samples=cfg.rl_explore_samples, explore=cfg.rl_explore,
                            explore_temperature=cfg.rl_explore_temperature,
                            replay_fraction=cfg.rl_replay_fraction, replay=cfg.rl_replay,
                            replay_priority=cfg.rl_replay_priority, focus_share=cfg.rl_focus_share,
                            focus_by=cfg.rl_focus_by,
                            kl_coef=cfg.rl_kl_coef, entropy_coef=cfg.rl_entropy_coef, trainer=trainer)


def check_config(cfg: RecipeConfig) -> None:
    """The flags' errors, before anything loads: a ``ValueError`` that names the flag."""
    from ludic.tictactoe.position_rl import EXPLORE_MODES, FOCUS_BY, REPLAY_FROM
    from ludic.training.config import LR_SCHEDULES
    from ludic.training.loggers import logger_names

    if cfg.answer not in ANSWER_TOKENS:
        raise ValueError(f"--answer must be one of {sorted(ANSWER_TOKENS)}, got {cfg.answer!r}")
    if cfg.teacher not in ("solver", "none"):
        raise ValueError(f"--teacher must be solver or none, got {cfg.teacher!r}")
    if cfg.reward not in ("move", "outcome"):
        raise ValueError(f"--reward must be move or outcome, got {cfg.reward!r}")
    if cfg.teacher == "none" and cfg.answer not in ("cell", "move"):
        raise ValueError(f"--teacher none answers with a bare cell or <move>: --answer cell or move, not {cfg.answer!r}")
    if cfg.rl_replay not in REPLAY_FROM:
        raise ValueError(f"--rl-replay must be one of {REPLAY_FROM}, got {cfg.rl_replay!r}")
    if cfg.rl_lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"--rl-lr-schedule must be one of {LR_SCHEDULES}, got {cfg.rl_lr_schedule!r}")
    if not 0.0 <= cfg.rl_lr_floor < 1.0:
        raise ValueError(f"--rl-lr-floor must be in [0, 1), got {cfg.rl_lr_floor}")
    if not 0.0 <= cfg.rl_replay_fraction < 1.0:
        raise ValueError(f"--rl-replay-fraction must be in [0, 1), got {cfg.rl_replay_fraction}")
    if not 0.0 <= cfg.rl_replay_priority <= 1.0 or (cfg.rl_replay_priority and cfg.reward != "move"):
        raise ValueError(f"--rl-replay-priority must be in [0, 1], --reward move, got {cfg.rl_replay_priority}")
    if not 0.0 <= cfg.rl_focus_share <= 1.0 or (cfg.rl_focus_share and cfg.reward != "move"):
        raise ValueError(f"--rl-focus-share must be in [0, 1], --reward move, got {cfg.rl_focus_share}")
    if cfg.rl_focus_by not in FOCUS_BY or (cfg.rl_focus_by != "uniform" and cfg.reward != "move"):
        raise ValueError(f"--rl-focus-by must be one of {FOCUS_BY}, --reward move, got {cfg.rl_focus_by!r}")
    if cfg.rl_explore not in EXPLORE_MODES:
        raise ValueError(f"--rl-explore must be one of {EXPLORE_MODES}, got {cfg.rl_explore!r}")
    if cfg.rl_explore_samples and cfg.reward != "move":
        raise ValueError("--rl-explore-samples explores within a position's group: it works with --reward move only")
    if not 0 <= cfg.rl_explore_samples < cfg.group_size:
        raise ValueError(f"--rl-explore-samples must be in [0, --group-size={cfg.group_size}), "
                         f"got {cfg.rl_explore_samples}")
    logger_names(cfg.logger)  # a typo fails now, not after the base evaluation
    if not cfg.system_prompt:
        raise ValueError("--system-prompt must be non-empty (an empty one would fall back to the env's long rules)")


def recipe(cfg: RecipeConfig) -> dict[str, Any]:
    from ludic import fastpath

    with fastpath.scoped(cfg.fast_path):
        if cfg.ctx != "last":
            from ludic.tictactoe.seed_recipe import SeedRecipeConfig, seed_recipe

            return seed_recipe(SeedRecipeConfig.from_recipe(cfg))
        return asyncio.run(_recipe(cfg))


async def _recipe(cfg: RecipeConfig) -> dict[str, Any]:
    from ludic.config import dump_config
    from ludic.data.offline import OfflineBatchSource, sft_item
    from ludic.tictactoe.synth import random_cell_records, teacher_position_records, teacher_positions
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.tictactoe.position_rl import PositionGRPO, View, no_signal_why
    from ludic.training.algorithms import make_sft
    from ludic.training.config import TrainerConfig
    from ludic.training.loggers import make_logger
    from ludic.training.lora import decoder_layers, freeze_bottom, frozen_bottom_layers
    from ludic.training.trainer import Trainer

    check_config(cfg)
    run_dir = cfg.resolve_run_dir("recipe-tictactoe")
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.json")
    clock = Clock(cfg.budget_minutes)
    view = View(cfg.system_prompt, compact=cfg.compact, show_moves=cfg.show_moves,
                max_tokens=ANSWER_TOKENS[cfg.answer], answer=cfg.answer)
    model, tok = load_policy_for(cfg)
    engine = TransformersEngine(model, tok)
    teacher = teacher_positions()
    ev = Evaluator(engine, view, teacher, run_dir)

    if cfg.eval_base:
        t0 = time.perf_counter()
        await ev.evaluate("base")
        clock.add("eval_base", time.perf_counter() - t0)

    # ------------------------------------------------------------------ 1. teacher data (or random cells)
    t0 = time.perf_counter()
    if cfg.teacher == "solver":
        records = teacher_position_records(cfg.system_prompt, compact=cfg.compact, style=cfg.answer,
                                           show_moves=cfg.show_moves)
    else:  # rewards only: the format, no strategy
        records = random_cell_records(cfg.system_prompt, compact=cfg.compact, style=cfg.answer,
                                      show_moves=cfg.show_moves, seed=cfg.seed)
    (run_dir / "sft").mkdir(exist_ok=True)
    with open(run_dir / "sft" / "records.jsonl", "w") as f:  # exactly what SFT trains on
        f.writelines(json.dumps(r) + "\n" for r in records)
    items = [sft_item(r, tok) for r in records]
    clock.add("datagen", time.perf_counter() - t0)
    prompt_tokens = sum(len(i.prompt_ids) for i in items) / len(items)
    answer_tokens = sum(len(i.completion_ids) for i in items) / len(items)
    print(f"[recipe] teacher data: {len(items)} records on {len(teacher)} positions, {prompt_tokens:.0f} prompt + "
          f"{answer_tokens:.0f} answer tokens each", flush=True)

    # ------------------------------------------------------------------ 2. SFT
    t_sft = time.perf_counter()
    sft_dir = run_dir / "sft"
    n_layers = len(decoder_layers(model))
    frozen = min(n_layers - 1, round(cfg.sft_frozen_share * n_layers))
    trainable = freeze_bottom(model, frozen)
    print(f"[recipe] SFT trains {trainable / 1e6:.1f}M parameters ({frozen} of {n_layers} layers "
          f"{'and the embeddings ' if frozen else ''}frozen)", flush=True)
    source = OfflineBatchSource(items, cfg.sft_batch_size, seed=cfg.seed)
    epochs = cfg.sft_epochs if cfg.teacher == "solver" else cfg.cold_start_epochs
    fixed = cfg.sft_steps or math.ceil(epochs * len(items) / cfg.sft_batch_size)
    tcfg = TrainerConfig(lr=cfg.sft_lr, lr_schedule="cosine", micro_token_budget=cfg.micro_token_budget,
                         total_steps=fixed, warmup_steps=3,
                         cache_frozen_bottom="item" if bottom_cache_pays(frozen, fixed * cfg.sft_batch_size, len(items))
                         else "off")
    trainer = Trainer(model, make_sft(), source, tcfg, checkpoint_dir=None, tokenizer=tok,
                      pad_token_id=tok.pad_token_id)
    if trainer.bottom_cache is not None:  # every step then runs the trainable top only, from the first
        t0 = time.perf_counter()
        trainer.bottom_cache.fill(model, items, tok.pad_token_id)
        print(f"[recipe] SFT: the frozen bottom's output for {len(items)} positions in "
              f"{time.perf_counter() - t0:.1f} s ({trainer.bottom_cache.bytes / 2**20:.0f} MiB)", flush=True)
    calibrate = bool(cfg.budget_minutes and not cfg.sft_steps)  # the step count is known after a few steps
    sft_logger = make_logger(cfg.logger, sft_dir, asdict(tcfg), total_steps=None if calibrate else fixed)
    sft_budget = cfg.sft_share * clock.left()
    def curve_steps(total: int) -> set[int]:
        return {max(1, round(total * (k + 1) / cfg.curve_points)) for k in range(cfg.curve_points - 1)}

    steps, step, curve_at, step_times = fixed, 0, curve_steps(fixed), []
    while step < steps:
        m = await trainer.train_step()
        step = trainer.step
        sft_logger.log(step, {"loss": m["loss"], "learning_rate": m["lr"], "step_s": m["step_s"],
                              "epoch": step * cfg.sft_batch_size / len(items)})
        step_times.append(m["step_s"])
        if step == CALIBRATION_STEPS and calibrate:  # fit the steps to the budget
            per_step = statistics.median(step_times[1:])  # the first step warms up
            per_curve = ev.positions_seconds or 20.0
            left = sft_budget - (time.perf_counter() - t_sft) - cfg.curve_points * per_curve
            steps = max(step, min(fixed, step + int(left / per_step)))
            trainer.cfg.total_steps = steps
            curve_at = curve_steps(steps)
            sft_logger.log(step, {"planned_steps": steps})
            print(f"[recipe] SFT: {per_step:.2f} s/step -> {steps} steps "
                  f"({steps * cfg.sft_batch_size / len(items):.1f} of {epochs:g} epochs; at most "
                  f"{sft_budget / 60:.1f} min)", flush=True)
        if step in curve_at:
            t0 = time.perf_counter()
            await ev.positions("sft", step)
            clock.add("eval_curve", time.perf_counter() - t0)
    sft_logger.close()
    model.save_pretrained(sft_dir / "final")
    tok.save_pretrained(sft_dir / "final")
    clock.add("sft", time.perf_counter() - t_sft - clock.seconds.get("eval_curve", 0.0))
    t0 = time.perf_counter()
    sft_eval = await ev.evaluate("sft", step)
    clock.add("eval_sft", time.perf_counter() - t0)

    # ------------------------------------------------------------------ 4. RL
    t_rl = time.perf_counter()
    model = rl_learner(model, cfg)
    engine.model = model
    rl_dir = run_dir / "rl"
    rl_cfg = rl_config(cfg)
    if frozen_bottom_layers(model):  # RL revisits its prompts: their frozen bottom is computed once, in both passes
        rl_cfg.trainer.cache_frozen_bottom = "prompt"
    rl_logger = make_logger(cfg.logger, rl_dir, asdict(rl_cfg), total_steps=None)
    if cfg.reward == "outcome":  # whole games, their results only
        from ludic.tictactoe.game_rl import GameGRPO

        rl_class: Any = GameGRPO
    else:
        rl_class = PositionGRPO
    rl = rl_class(model, tok, engine, view, rl_cfg, rl_dir, logger=rl_logger)
    rounds = counted_rounds(cfg) or cfg.max_rl_rounds or 10**9
    final_eval_s = clock.seconds["eval_sft"]  # what the closing full evaluation will take, about
    focus, pool, batch_s, round_eval_s = sft_eval.focus, sft_eval.pool, 0.0, 0.0
    met, tree = sft_eval.met, sft_eval.tree  # positions met in its exact games so far (played), vs minimax last (tree)
    reach = sft_eval.reach  # how likely the last games against minimax reach each position (--rl-focus-by reach)
    best = (sft_eval.score(), 0, trainable_state(model))  # (score, RL batches, adapter) of the best round
    last_round: dict[str, Any] = {}  # the last round's evaluation (minimax and teacher positions)
    stopped = "rounds" if cfg.rl_rounds or cfg.max_rl_rounds or not cfg.budget_minutes else "budget"
    stopped_why = ""  # a stop without signal: what the last batch's samples were (no_signal_why)
    decays, timed = cfg.rl_lr_schedule != "constant" and bool(cfg.budget_minutes) and not cfg.rl_rounds, []

    def plan_decay(step_s: float, eval_s: float, in_round: int = 0) -> None:  # the decay ends at the last batch
        left = clock.left() - (in_round * step_s + eval_s if in_round else 0.0)  # after this round, if in one
        rl.trainer.cfg.total_steps = rl.trainer.step + in_round + clock.batches_left(
            step_s, eval_s, final_eval_s, cfg.rl_steps_per_round, left)

    def on_step(_: int, m: dict) -> None:  # round 1: plan from its first batches (its evaluation ~ the closing one)
        timed.append(m.get("step_s", 0.0))
        if decays and len(timed) == CALIBRATION_STEPS < steps:
            plan_decay(statistics.median(timed[1:]), final_eval_s, steps - CALIBRATION_STEPS)
    for r in range(rounds):
        if not focus and not pool:
            stopped = "goal"
            print(f"[recipe] RL round {r + 1}: goal met, stopping with {clock.left() / 60:.1f} min of the budget "
                  "left: no losing decision against minimax and every teacher position value-preserving", flush=True)
            break
        steps = cfg.rl_steps_per_round
        if cfg.budget_minutes and not cfg.rl_rounds and r:  # the last round: the batches that still fit
            steps = clock.round_that_fits(batch_s, round_eval_s + final_eval_s, cfg.rl_steps_per_round)
            if not steps:
                break  # too few for a round and its evaluation: the closing evaluation comes
        t0, steps_before = time.perf_counter(), rl.steps
        try:
            replay = list(dict.fromkeys(teacher + {"played": met, "tree": tree}.get(cfg.rl_replay, [])))
            await rl.run(steps, pool, replay=replay, focus=focus, on_step=on_step, focus_weights=reach)
        except TrainingStopped as e:
            if e.reason not in ("empty_batches", "no_signal", "saturated"):
                raise
            stopped = "saturated" if e.reason == "saturated" else "no_signal"
            stopped_why = no_signal_why(stopped, e.metrics)
            print(f"[recipe] RL round {r + 1}: {rl.trainer.cfg.max_no_signal_steps} batches in a row carried no "
                  f"signal ({stopped_why}), so RL stops here; the best round is kept", flush=True)
            break
        t_eval = time.perf_counter()
        batch_s = (t_eval - t0) / max(1, rl.steps - steps_before)
        # between rounds: minimax only (the failures that lose games), the teacher positions once it loses nothing
        round_eval = await ev.evaluate("rl", rl.steps, opponents=("minimax",), positions="if_no_loss")
        clock.add("eval_rl", time.perf_counter() - t_eval)
        last_round = {"step": rl.steps, **round_eval.metrics}
        if round_eval.score() > best[0]:
            best = (round_eval.score(), rl.steps, trainable_state(model))
        focus, met, tree = round_eval.focus, list(dict.fromkeys(met + round_eval.met)), round_eval.tree
        reach = round_eval.reach
        # perfect on what this round measured: nothing left to train (the goal; the pool keeps old
        # mistakes as replay otherwise)
        pool = [] if not focus and not round_eval.pool else list(
            dict.fromkeys(round_eval.pool + [b for b in pool if b not in set(round_eval.focus)]))
        round_eval_s = time.perf_counter() - t_eval
        if decays:
            plan_decay(batch_s, round_eval_s)
        print(f"[recipe] RL round {r + 1}: {len(focus)} wrong vs minimax + {len(pool)} others left, "
              f"{time.perf_counter() - t0:.0f} s ({steps} batches), {clock.left() / 60:.1f} min left", flush=True)
    rl_logger.close()
    kept = best[1]
    if kept != rl.steps:  # a later round lost ground: keep the best round's adapter
        load_trainable_state(model, best[2])
        engine.weights_changed()  # the decode view copies the kept adapter in before the next batch
        print(f"[recipe] RL: keeping the weights after batch {kept} (the best exact evaluation)", flush=True)
    model.save_pretrained(rl_dir / "final")
    if not cfg.lora_rank:  # the layers themselves: rl/final is a whole model, loadable on its own
        tok.save_pretrained(rl_dir / "final")
    clock.add("rl", time.perf_counter() - t_rl - clock.seconds.get("eval_rl", 0.0))
    t0 = time.perf_counter()
    await ev.evaluate("rl", kept)
    clock.add("eval_rl", time.perf_counter() - t0)
    write_games(run_dir, ev.stage_results)  # a few games per stage against minimax, replayed from its decisions

    report = {"teacher": cfg.teacher, "reward": cfg.reward,
              "promotions": getattr(rl, "promotions", None), "results": ev.stage_results, "seconds": clock.seconds, "total_seconds": clock.elapsed(),
              "budget_seconds": clock.budget_s, "sft_steps": step, "sft_epochs": step * cfg.sft_batch_size / len(items),
              "rl_steps": rl.steps, "rl_kept_step": kept, "rl_last_round": last_round, "rl_stopped": stopped,
              "rl_stopped_why": stopped_why, "precision": precision(model, cfg.dtype, bool(cfg.lora_rank)), "sft_records": len(items),
              "teacher_positions": len(teacher), "prompt_tokens": prompt_tokens,
              "answer_tokens": answer_tokens, "curve": ev.curve, "machine": machine(), "config": asdict(cfg)}
    (run_dir / "report.json").write_text(json.dumps(report, indent=2))
    write_report(run_dir, report)
    from ludic.report import build_report

    print(f"[recipe] report: {run_dir / 'report.md'} and {build_report(run_dir)}", flush=True)
    return report

