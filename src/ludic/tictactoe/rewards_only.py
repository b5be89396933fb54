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
--teacher none`` parses with them; flags given still win; ``rewards_only_config`` in Python). Each was measured
against the solver path's value in this mode (docs/studies.md, "Tic-tac-toe from rewards alone"): the free cells
in the prompt make the random-cell cold start 100% legal in half an epoch; with no SFT curve to draw, its
evaluations are skipped; RL trains the top layers themselves (``lora_rank`` 0: the half the cold start trained,
the bottom half stays frozen) at the solver path's 2e-4: given the solver's moves, they reached 89% of the 335
value-preserving in 12 passes where the LoRA that ran before (rank 16 at 1e-3; at 2e-4 it barely moved) reached
81%, and through RL they kept X 100 / O 100% at seeds 0 (on its second, faster hour) and 1 and X 87.5 / O 98.7% at
seed 2 on an Intel Xeon with AMX, where the LoRA kept 75-100 / 75-100% ("The learner, not the visits"); as the
default on an AMD EPYC without AMX (640-681 batches in 27 minutes) X 100 / O 86.7-94.4% ("The layers themselves as
the default"). Batches of 16 positions, 15 of them
replayed, in groups of 4 samples of which one is a uniformly random legal cell (learned from only when it beats
the group: it keeps signal where the policy answers alike), 64 batches between exact evaluations (against a
failure pool, groups of 8 with 2 random and 16 batches a round, seeds 0-2 kept 60-64% value-preserving moves
instead of 47-58%; all measured with the LoRA). The step decays (cosine, to 0 at the last batch the budget holds):
with the LoRA at a constant 1e-3 the moves plateaued at about 65% value-preserving, with the decay they went on to 88%; ending it at a tenth instead
(``--rl-lr-floor 0.1``, with a 28-minute budget) met the goal at one seed of three, not two, so it is a flag. Half
of the replayed positions are drawn by shortfall (``PositionRLConfig.replay_priority``: where the policy's own
samples earned less lately): O 67.9-72.7% kept against 42.3-53.8% with all uniform. The replay is the policy's
own tree against minimax (``replay="tree"``) and samples are drawn at 0.7: in 27 minutes seeds 1 and 2 kept X
100 / O 100% and X 100 / O 99.3%, seed 0 X 0 / O 95.8% and, on a slower hour, X 75 / O 88.5%, where the 335 alone
at 1.0 kept O 68-83%; with the frozen bottom cached per prompt seed 1 played perfectly and seeds 0 and 2 kept O 75-77%
(docs/studies.md, "A cooler sampler and the policy tree replayed", "The tree as the default", "A floor under the
decay", "The frozen bottom cached per prompt")."""


MOVE_REWARD_ONLY = ("rl_explore_samples", "rl_explore", "lora_rank", "lora_layer_share", "rl_lr_schedule", "group_size", "rl_replay",
                    "rl_replay_fraction", "rl_replay_priority", "rl_temperature")
"""Defaults of the mode that only the move reward takes: a position's group explores, a game's does not; the
outcome reward keeps the solver path's LoRA at 2e-4, what its studies ran (the LoRA at 1e-3 collapsed its groups
within 20 batches, every game of a group alike, so RL stopped for lack of signal at 21 of 57 minutes; the layers
themselves were measured with the move reward only) (docs/studies.md); the batch shape and the uniform replay were measured with the move reward only, so the outcome
reward keeps 16 batches a round (``OUTCOME_REWARD_DEFAULTS``) of groups of 8."""

OUTCOME_REWARD_DEFAULTS: dict[str, Any] = {"rl_steps_per_round": 16}
"""Where the outcome reward's defaults differ from the move reward's in this mode (what its studies ran with)."""


def rewards_only_defaults(reward: str = "move") -> dict[str, Any]:
    """``REWARDS_ONLY_DEFAULTS`` for ``reward``: under ``outcome`` without ``MOVE_REWARD_ONLY`` (the exploring
    samples, the layers themselves as the learner, the batch shape), so the outcome reward takes the solver path's values of those, and
    with ``OUTCOME_REWARD_DEFAULTS``."""
    if reward == "move":
        return dict(REWARDS_ONLY_DEFAULTS)
    return {**{k: v for k, v in REWARDS_ONLY_DEFAULTS.items() if k not in MOVE_REWARD_ONLY}, **OUTCOME_REWARD_DEFAULTS}
