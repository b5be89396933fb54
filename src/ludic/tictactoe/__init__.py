"""Tic-tac-toe, in one folder: the game, its solver, its prompts, its datasets, its exact evaluation and
its recipes. Everything here stands on the generic spine (``envs`` -> ``agents`` -> ``interaction`` ->
``rollouts`` -> ``training``) and on the generic recipe parts (``recipes.blocks``, ``recipes.pipeline``);
nothing outside this folder imports it except the CLI and the registries, which name it by string.

The game
    board.py        rules, rendering and parsing, the perfect solver, move kinds, the bots
    env.py          TicTacToeEnv (one agent against a bot) and TicTacToeGame (two seats, self-play)
    positions.py    TicTacToePositionEnv: one decision from a given position, scored by the solver
    prompts.py      the recipes' system prompt, strict answer parsers, agent, eval requests, metrics
Data
    synth.py        SFT records by rejection sampling or from the solver teacher ([TRUNCATED] thinking)
    thinktactoe.py  the ThinkTacToe dataset schemas (SFT, DPO, GRPO, minimax) and the move-quality reward
    datagen.py      ``ludic datagen tictactoe``
Evaluation
    exact.py        the greedy policy against every opponent branch: exact win / draw / loss rates
Training
    train.py        ``ludic train tictactoe`` / ``ludic eval tictactoe``: GRPO + LoRA against bots,
                    self-play or a league
    opponents.py    opponent mixtures and the league of frozen snapshots per GRPO group
    pipeline.py     ``ludic actor / learner tictactoe`` and ``--pipeline N`` / ``--overlap``
    position_rl.py  GRPO on single decisions from a failure pool (the recipe's RL stage)
    recipe.py       ``ludic recipe tictactoe``: teacher SFT cold start, then rounds of position RL, timed
    rewards_only.py the defaults of its rewards-only mode (``--teacher none``), each measured
    seed_recipe.py  the seed's workflow: teacher data, SFT, rejection sampling, GRPO with ctx truncated
    tinker.py       GRPO on tic-tac-toe through the Tinker API (a hosted trainer, or Ludic's stand-in)
"""
