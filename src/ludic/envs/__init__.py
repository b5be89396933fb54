"""Environments: the ``LudicEnv`` kernel, ``SingleAgentEnv``, the registry of env kinds, the built-in
envs and the adapters to TextArena, reasoning-gym, verifiers and Gymnasium-style text envs (``registry``
lists the spec strings)."""

from ludic._lazy import lazy_exports

_EXPORTS = {
    "LudicEnv": "ludic.envs.base", "SingleAgentEnv": "ludic.envs.base",
    "register_env": "ludic.envs.registry", "make_env": "ludic.envs.registry", "ENVS": "ludic.envs.registry",
    "TextArenaEnv": "ludic.envs.textarena_env", "ReasoningGymEnv": "ludic.envs.reasoning_gym_env",
    "GymTextEnv": "ludic.envs.gym_text", "VerifiersEnv": "ludic.envs.verifiers_env",
    "TicTacToeEnv": "ludic.tictactoe.env", "OpenSpielEnv": "ludic.envs.openspiel",
    "QAEnv": "ludic.envs.qa", "DatasetQAEnv": "ludic.envs.qa", "PromptEnv": "ludic.envs.prompt_env",
    "TraceEnv": "ludic.envs.trace",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
