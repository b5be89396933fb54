"""Interaction protocols: the explicit agent-env loop, emitting one Rollout per agent."""

from ludic.interaction.base import InteractionProtocol
from ludic.interaction.multi_agent import MultiAgentProtocol
from ludic.interaction.single_agent import SingleAgentProtocol

SingleAgentSyncProtocol = SingleAgentProtocol  # name used in the original Ludic docs

__all__ = ["InteractionProtocol", "SingleAgentProtocol", "SingleAgentSyncProtocol", "MultiAgentProtocol"]
