"""The few core types that flow along Ludic's spine.

    Env -> Agent -> InteractionProtocol -> Rollout(Steps with TokenTraces)
        -> CreditAssigner -> SAWItem -> Loss -> Trainer -> weights

Everything here is plain data: frozen dataclasses (or TypedDicts for chat
messages), JSON-serialisable through ``to_dict`` / ``from_dict``. Nothing in
Ludic sends pickle over a wire; these dicts are what travels.

Shape letters used in docstrings across the library:
    B  sequences in a (micro-)batch     T  tokens in a padded sequence
    N  action (completion) tokens, flattened over a micro-batch
    S  action segments (one per trained completion) in a micro-batch
    V  vocabulary size
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, TypedDict

JSON = dict[str, Any]


class Message(TypedDict, total=False):
    """An OpenAI-style chat message (the wire format for chat templates)."""

    role: str
    content: str


class FinishReason(str, Enum):
    """Why a completion ended."""

    STOP = "stop"
    """The model emitted a stop token or stop string."""
    LENGTH = "length"
    """The completion hit ``max_tokens`` (it is incomplete)."""
    ERROR = "error"
    """The inference request failed (server down, timeout); no tokens."""


@dataclass(frozen=True)
class TokenTrace:
    """The exact tokens of one model call, as the sampler saw and produced them.

    This is the single source of truth for training: a completion is never
    decoded and re-encoded. ``prompt_ids + completion_ids`` is the training
    sequence; only ``completion_ids`` are trained on.
    """

    prompt_ids: tuple[int, ...]
    """Token ids the sampler conditioned on (chat template applied)."""
    completion_ids: tuple[int, ...]
    """Sampled token ids, including the stop token when the model emitted one."""
    logprobs: tuple[float, ...]
    """Sampler log-probability of each completion token, in the distribution it was drawn from:
    softmax(logits / temperature), renormalised over the top-p / top-k set when those are on.
    NaN: unknown (a reply the policy did not sample; the loss uses an importance ratio of 1)."""
    policy_versions: tuple[int, ...]
    """Policy (weights) version that sampled each completion token."""
    finish_reason: FinishReason = FinishReason.STOP
    """Why the completion ended."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy: the log-probs are then those of temperature 1)."""
    top_p: float = 1.0
    """Nucleus mass the sampler kept (1 = off)."""
    top_k: int = 0
    """Top-k the sampler kept (0 = off)."""

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if len(self.logprobs) != n or len(self.policy_versions) != n:
            raise ValueError(
                f"TokenTrace: {n} completion ids but {len(self.logprobs)} logprobs "
                f"and {len(self.policy_versions)} policy versions"
            )

    @property
    def min_policy_version(self) -> int:
        """Oldest policy version that contributed a token (-1 if empty)."""
        return min(self.policy_versions) if self.policy_versions else -1

    def to_dict(self) -> JSON:
        return {
            "prompt_ids": list(self.prompt_ids),
            "completion_ids": list(self.completion_ids),
            "logprobs": list(self.logprobs),
            "policy_versions": list(self.policy_versions),
            "finish_reason": self.finish_reason.value,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
        }

    @classmethod
    def from_dict(cls, d: JSON) -> "TokenTrace":
        return cls(
            prompt_ids=tuple(int(x) for x in d["prompt_ids"]),
            completion_ids=tuple(int(x) for x in d["completion_ids"]),
            logprobs=tuple(float(x) for x in d["logprobs"]),
            policy_versions=tuple(int(x) for x in d["policy_versions"]),
            finish_reason=FinishReason(d.get("finish_reason", "stop")),
            temperature=float(d.get("temperature", 1.0)),
            top_p=float(d.get("top_p", 1.0)),
            top_k=int(d.get("top_k", 0)),
        )

    @property
    def scoring_temperature(self) -> float:
        """The temperature the log-probs belong to (1 for greedy decoding)."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass(frozen=True)
class StepOutcome:
    """What an environment returns to one agent after a step (Gymnasium style)."""

    obs: str
    """Next observation, as text for the agent."""
    reward: float = 0.0
    """Reward for this agent for this step."""
    terminated: bool = False
    """The episode reached a task-defined end (win, loss, illegal move, ...)."""
    truncated: bool = False
    """The episode was cut off by a limit (time, steps), not by the task."""
    info: JSON = field(default_factory=dict)
    """Free-form, JSON-serialisable diagnostics (outcome, move quality, ...)."""


@dataclass(frozen=True)
class Step:
    """One agent turn: an observation, the model's raw action, and what followed.

    A parse failure is also a Step: ``info["parse_error"] = True``, the
    parser's penalty as reward, the parser's feedback as ``next_obs``, and the
    environment was not stepped.
    """

    index: int
    """Position of this step in its rollout (0-based)."""
    prev_obs: str
    """Observation the agent acted on."""
    action: str
    """Raw model text (what was sampled)."""
    parsed_action: str | None
    """Action handed to the env, or None when parsing failed."""
    next_obs: str | None
    """Observation after the step (None on a terminal step)."""
    reward: float
    """Env reward plus parser (format) reward for this step."""
    terminated: bool = False
    """Task-defined end of the episode for this agent."""
    truncated: bool = False
    """Cut off by a limit (max steps, env time limit)."""
    trace: TokenTrace | None = None
    """Exact tokens of the model call behind this step."""
    info: JSON = field(default_factory=dict)
    """Env info merged with agent info (parse_error, finish_reason, ...)."""

    @property
    def parse_error(self) -> bool:
        return bool(self.info.get("parse_error", False))

    @property
    def no_turn(self) -> bool:
        """An outcome with no model turn behind it: the episode ended before the agent's first turn
        (``interaction.base.no_turn_step``)."""
        return bool(self.info.get("no_turn", False))

    def to_dict(self) -> JSON:
        d = {k: v for k, v in asdict(self).items() if k != "trace"}
        d["trace"] = self.trace.to_dict() if self.trace is not None else None
        return d

    @classmethod
    def from_dict(cls, d: JSON) -> "Step":
        d = dict(d)
        trace = d.pop("trace", None)
        return cls(**d, trace=TokenTrace.from_dict(trace) if trace else None)


@dataclass
class Rollout:
    """One agent's view of one episode.

    A multi-agent episode yields one Rollout per agent. ``meta`` carries the
    request (env seed, sampling seed, group id), the agent id and the outcome.
    """

    steps: list[Step] = field(default_factory=list)
    """Turns of this agent, in order."""
    meta: JSON = field(default_factory=dict)
    """env_kind, env_seed, sampling_seed, group_id, agent_id, truncation_reason, ..."""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Unique id of this rollout."""

    @property
    def total_reward(self) -> float:
        return float(sum(s.reward for s in self.steps))

    @property
    def length(self) -> int:
        return len(self.steps)

    def to_dict(self) -> JSON:
        return {
            "id": self.id,
            "meta": self.meta,
            "total_reward": self.total_reward,
            "steps": [s.to_dict() for s in self.steps],
        }

    @classmethod
    def from_dict(cls, d: JSON) -> "Rollout":
        return cls(
            steps=[Step.from_dict(s) for s in d["steps"]],
            meta=dict(d.get("meta", {})),
            id=str(d.get("id") or uuid.uuid4().hex),
        )


@dataclass(frozen=True)
class EnvSpec:
    """A serialisable recipe for an environment: registry kind plus kwargs."""

    kind: str
    kwargs: JSON = field(default_factory=dict)


DEFAULT_MAX_STEPS = 10
"""Turn limit of a request that sets none, for an env that declares none (``LudicEnv.max_turns``)."""


@dataclass(frozen=True)
class RolloutRequest:
    """Intent for one episode: which env, which seeds, which group.

    GRPO groups are made by expanding one request into several that share
    ``env_seed`` and differ in ``sampling_seed`` (see ``GRPORequestStrategy``).
    """

    env: EnvSpec
    """Environment to build (fresh for every episode)."""
    protocol: str = "single_agent"
    """Key into the engine's protocol registry."""
    env_seed: int | None = None
    """Seed for ``env.reset``; None lets the engine pick the episode index."""
    sampling_seed: int | None = None
    """Seed for the model's sampling in this episode."""
    group_id: str | None = None
    """Requests sharing a group id are normalised together by group credit."""
    max_steps: int | None = None
    """Turn limit for the protocol; hitting it truncates the episode. None: the env's own
    ``max_turns``, else ``DEFAULT_MAX_STEPS``."""
    meta: JSON = field(default_factory=dict)
    """Free-form metadata copied into the rollout meta (curriculum stage, ...)."""


@dataclass(frozen=True)
class SAWItem:
    """A State-Action-Weight sample: trained completion tokens in their context.

    ``prompt_ids`` is the state, ``completion_ids`` the action, ``weight`` the
    credit (advantage) for the action. ``logprobs`` and ``policy_versions``
    come from the sampler, for importance correction and staleness checks.

    A whole multi-turn episode can be one item (see ``build_saw_items``): then
    ``completion_ids`` runs from the first sampled token to the last, and the
    chat-template, environment and opponent tokens between turns are in it
    with ``action_mask`` 0 (context, not trained). Each sampled token keeps its
    own turn's credit (``token_weights``), sampler log-prob and policy version.
    Per-token fields hold placeholders (0.0, -1) at masked positions.
    """

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    weight: float
    """Credit for the whole item (advantage, return, or 1.0 for SFT); the mean over turns when merged."""
    logprobs: tuple[float, ...] | None = None
    """Sampler log-probs of the completion tokens (None for offline data)."""
    policy_versions: tuple[int, ...] | None = None
    """Policy version per completion token (None for offline data)."""
    meta: JSON = field(default_factory=dict)
    """rollout_id, step_index, group_id, reward, finish_reason, turns, ..."""
    action_mask: tuple[int, ...] | None = None
    """1 where a completion token was sampled (trained), 0 for context between turns; None = all 1."""
    token_weights: tuple[float, ...] | None = None
    """Credit per completion token (each turn's tokens carry that turn's weight); None = ``weight``."""
    episode_share: float = 1.0
    """This item's share of its episode in per-sequence loss normalisers: 1 for a whole episode
    (or a single-turn one), 1/n for each of the n per-turn items of an episode."""
    temperature: float = 1.0
    """Temperature the sampler's log-probs belong to; the trainer scores at the same one."""
    top_p: float = 1.0
    """Sampler's nucleus (1 = off); truncated distributions cannot be importance-weighted."""
    top_k: int = 0
    """Sampler's top-k (0 = off)."""

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        for name in ("logprobs", "policy_versions", "action_mask", "token_weights"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(f"SAWItem: {n} completion ids but {len(v)} {name}")
        if not self.temperature > 0:
            raise ValueError(f"SAWItem: temperature must be > 0 (score greedy samples at 1), got {self.temperature}")
        if not 0 < self.episode_share <= 1:
            raise ValueError(f"SAWItem: episode_share must be in (0, 1], got {self.episode_share}")

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def num_action_tokens(self) -> int:
        """Trained (sampled) tokens."""
        return len(self.completion_ids) if self.action_mask is None else sum(self.action_mask)

    @property
    def min_policy_version(self) -> int | None:
        """Oldest policy version among the sampled tokens (None for offline data)."""
        if not self.policy_versions:
            return None
        if self.action_mask is None:
            return min(self.policy_versions)
        sampled = [v for v, m in zip(self.policy_versions, self.action_mask) if m]
        return min(sampled) if sampled else None

    def to_dict(self) -> JSON:
        d: JSON = {
            "prompt_ids": list(self.prompt_ids),
            "completion_ids": list(self.completion_ids),
            "weight": self.weight,
            "logprobs": None if self.logprobs is None else list(self.logprobs),
            "policy_versions": None if self.policy_versions is None else list(self.policy_versions),
            "meta": self.meta,
        }
        if self.action_mask is not None:
            d["action_mask"] = list(self.action_mask)
        if self.token_weights is not None:
            d["token_weights"] = list(self.token_weights)
        for name, default in (("episode_share", 1.0), ("temperature", 1.0), ("top_p", 1.0), ("top_k", 0)):
            if getattr(self, name) != default:
                d[name] = getattr(self, name)
        return d

    @classmethod
    def from_dict(cls, d: JSON) -> "SAWItem":
        def tup(key: str, conv: type) -> tuple | None:
            v = d.get(key)
            return None if v is None else tuple(conv(x) for x in v)

        return cls(
            prompt_ids=tuple(int(x) for x in d["prompt_ids"]),
            completion_ids=tuple(int(x) for x in d["completion_ids"]),
            weight=float(d["weight"]),
            logprobs=tup("logprobs", float),
            policy_versions=tup("policy_versions", int),
            meta=dict(d.get("meta", {})),
            action_mask=tup("action_mask", int),
            token_weights=tup("token_weights", float),
            episode_share=float(d.get("episode_share", 1.0)),
            temperature=float(d.get("temperature", 1.0)),
            top_p=float(d.get("top_p", 1.0)),
            top_k=int(d.get("top_k", 0)),
        )


@dataclass
class SAWBatch:
    """The items of one optimizer step, with batch-level metadata."""

    items: list[SAWItem]
    meta: JSON = field(default_factory=dict)
    """num_rollouts, avg_total_reward, generation time, rollout metrics, ..."""
