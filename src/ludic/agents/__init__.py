"""Agents: an LLM policy with a context and a parser (``Agent``), and tool users (``ToolAgent``, ``ReActAgent``)."""

from ludic._lazy import lazy_exports

_EXPORTS = {
    "Agent": "ludic.agents.agent", "AgentTurn": "ludic.agents.agent",
    "ToolAgent": "ludic.agents.tools", "ReActAgent": "ludic.agents.tools", "Tool": "ludic.agents.tools",
    "ToolCall": "ludic.agents.tools", "ToolCallFormat": "ludic.agents.tools",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
