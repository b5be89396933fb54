"""Ludic: a hackable library for reinforcement learning of LLM agents in multi-turn environments.

The spine, one folder per arrow:
    envs/ -> agents/ (+ context/, parsers.py) -> interaction/ -> rollouts/ (engine, credit, batch)
    -> training/ (losses, algorithms, trainer, checkpoint, loggers) -> inference/ (engines, publishers)
``import ludic`` is light: torch, transformers and vLLM load only when a module that needs them is used.
"""

__version__ = "0.1.0"

from ludic._lazy import lazy_exports

_EXPORTS = {
    "train": "ludic.recipes.env", "TrainResult": "ludic.recipes.env",
    "LudicEnv": "ludic.envs.base", "SingleAgentEnv": "ludic.envs.base", "register_env": "ludic.envs.registry",
    "StepOutcome": "ludic.types", "EnvSpec": "ludic.types", "RolloutRequest": "ludic.types", "Rollout": "ludic.types",
    "SAWItem": "ludic.types",
    "Agent": "ludic.agents.agent", "ToolAgent": "ludic.agents.tools", "ReActAgent": "ludic.agents.tools",
    "SingleAgentProtocol": "ludic.interaction.single_agent", "MultiAgentProtocol": "ludic.interaction.multi_agent",
    "RolloutEngine": "ludic.rollouts.engine", "GRPORequestStrategy": "ludic.rollouts.engine",
    "RolloutBatchSource": "ludic.rollouts.batch",
    "Trainer": "ludic.training.trainer", "TrainerConfig": "ludic.training.config",
    "make_algorithm": "ludic.training.algorithms", "LoraSettings": "ludic.training.lora",
    "load_policy": "ludic.training.lora", "TransformersEngine": "ludic.inference.transformers_engine",
    "SamplingParams": "ludic.inference.client", "InProcessPublisher": "ludic.inference.publish",
}
"""The names a newcomer needs, importable from ``ludic`` itself (each module loads on first use)."""
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["__version__", *sorted(_EXPORTS)]

