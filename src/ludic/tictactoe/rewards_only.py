"""The rewards-only mode's defaults (``ludic recipe tictactoe --teacher none``, ``tictactoe.recipe``): where they
differ from the solver path's, each measured in this mode (docs/studies.md, "Tic-tac-toe from rewards alone"), and
which of them only the move reward takes.
"""

from __future__ import annotations

from typing import Any

REWARDS_ONLY_DEFAULTS: dict[str, Any] = {
    "show_moves": True, "cold_start_epochs": 0.5, "curve_points": 0, "rl_steps_per_round": 64, "lora_rank": 0,
    "lora_layer_share": 1 / 3, "budget_minutes": 29.0,
    "group_size": 4, "rl_explore_samples": 1, "rl_explore": "uniform", "rl_lr_schedule": "cosine", "rl_replay": "tree",
    "rl_replay_fraction": 0.94, "rl_replay_priority": 0.5, "rl_temperature": 0.7}
"""The defaults of ``--teacher none`` where they differ from the solver path's (``ludic recipe tictactoe
--teacher none`` parses with them; flags given still win; ``rewards_only_config`` in Python), each measured against
the solver path's value in this mode (docs/studies.md, "Tic-tac-toe from rewards alone"):

- the free cells in the prompt make the random-cell cold start 100% legal in half an epoch; with no SFT curve to
  draw, its evaluations are skipped;
- RL trains the top third of the layers themselves (``lora_rank`` 0, ``lora_layer_share`` 1/3: 10 of the 15 the
  cold start trained) at the solver path's 2e-4, decaying (cosine) to 0 at the last batch the budget holds. The
  layers themselves learned faster per batch than the LoRA r16 that ran before (at 1e-3; at 2e-4 it barely moved);
  the top third learns slower per batch than the top half but makes 1.31 s batches against 1.61 s, and in 29
  minutes on an AMD EPYC without AMX seeds 0-2 kept X 100 / O 97.5, 100 / 100 and 100 / 93.1% (832-928 batches)
  where the top half in 27 kept O 94.4, 89.7 and 86.7% (640-681);
- batches of 16 positions, 15 of them replayed from the 335 and the policy's own tree against minimax (``rl_replay``
  "tree"), half of those drawn by shortfall (where the policy's own samples earned less lately), sampled at 0.7,
  in groups of 4 samples of which one is a uniformly random legal cell (learned from only when it beats the
  group: it keeps signal where the policy answers alike), 64 batches between exact evaluations;
- a 29-minute budget: the goal allows 30 minutes in all, and runs end within 0.1 minutes of the budget."""


MOVE_REWARD_ONLY = ("rl_explore_samples", "rl_explore", "lora_rank", "lora_layer_share", "rl_lr_schedule", "group_size",
                    "rl_replay", "rl_replay_fraction", "rl_replay_priority", "rl_temperature")
"""Defaults of the mode that only the move reward takes: a position's group explores, a game's does not; the
outcome reward keeps the solver path's LoRA at 2e-4, what its studies ran (the LoRA at 1e-3 collapsed its groups
within 20 batches, every game of a group alike, so RL stopped for lack of signal at 21 of 57 minutes; the layers
themselves, and how many of them, were measured with the move reward only) (docs/studies.md); the batch shape and
the uniform replay were measured with the move reward only, so the outcome reward keeps 16 batches a round
(``OUTCOME_REWARD_DEFAULTS``) of groups of 8."""

OUTCOME_REWARD_DEFAULTS: dict[str, Any] = {"rl_steps_per_round": 16}
"""Where the outcome reward's defaults differ from the move reward's in this mode (what its studies ran with)."""


def rewards_only_defaults(reward: str = "move") -> dict[str, Any]:
    """``REWARDS_ONLY_DEFAULTS`` for ``reward``: under ``outcome`` without ``MOVE_REWARD_ONLY`` (the exploring
    samples, the layers themselves as the learner, the batch shape), so the outcome reward takes the solver path's values of those, and
    with ``OUTCOME_REWARD_DEFAULTS``."""
    if reward == "move":
        return dict(REWARDS_ONLY_DEFAULTS)
    return {**{k: v for k, v in REWARDS_ONLY_DEFAULTS.items() if k not in MOVE_REWARD_ONLY}, **OUTCOME_REWARD_DEFAULTS}
