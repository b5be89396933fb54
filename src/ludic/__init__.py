"""Ludic: a hackable library for reinforcement learning of LLM agents in multi-turn environments.

The spine, one folder per arrow:
    envs/ -> agents/ (+ context/, parsers.py) -> interaction/ -> rollouts/ (engine, credit, batch)
    -> training/ (losses, algorithms, trainer, checkpoint, loggers) -> inference/ (engines, publishers)
``import ludic`` is light: torch, transformers and vLLM load only when a module that needs them is used.
"""

__version__ = "0.1.0"
