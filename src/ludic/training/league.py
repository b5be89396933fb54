"""A league of frozen policy snapshots, and a sampler of opponents from a mixture.

Self-play against the current policy alone can chase its own tail (it forgets how to beat
what it used to play); a league keeps earlier versions of the policy as frozen opponents.
Nothing here knows the game: which env and protocol a drawn opponent becomes is the
recipe's business (``ludic.tictactoe.opponents`` for tic-tac-toe).

    league = League(run_dir / "league", max_size=4, every=10,
                    make_client=frozen_copy_clients(model, tokenizer))
    league.maybe_snapshot(model, step)     # at the start and after every optimizer step
    sampler = OpponentSampler("self:0.4,league:0.3,minimax:0.2,random:0.1", league, seed=0)
    draw = sampler.draw()                  # OpponentDraw(kind, seat, snapshot): one per GRPO group
    client = league.client(draw.snapshot)  # a ChatClient that plays that snapshot

On disk, ``<root>/``::

    step_000010/   the snapshot's weights as ``model.save_pretrained`` writes them
                   (the LoRA adapter of a peft model, else the full model)
    league.json    {"snapshots": [{"name": "step_000010", "step": 10}, ...]}, oldest first

Resuming: ``OpponentSampler.state_dict()`` holds the league's ``state_dict()`` (its snapshot
list) and travels in the trainer checkpoint (``RolloutBatchSource`` saves its
``requests_fn``'s state). ``load_state_dict`` keeps the listed snapshots that are still on
disk and deletes the folders of snapshots taken after that checkpoint; calling
``maybe_snapshot(model, trainer.step)`` after resuming re-takes the snapshot of the resumed
step if the checkpoint was written before it.

Serving: ``make_client(snapshot) -> ChatClient`` is called once per snapshot (cached until
the snapshot is dropped). ``frozen_copy_clients`` builds an in-process one: a frozen copy of
the policy with the snapshot's weights behind its own ``TransformersEngine`` (fine for a
small model on CPU; it costs one model copy per live snapshot). A vLLM server could serve
the same folders as named LoRA adapters (``/v1/load_lora_adapter`` with the snapshot's name
and path, then a ``VLLMChatClient(url, model=snapshot.name)``) behind the same callable.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from ludic.inference.client import ChatClient
from ludic.rollouts.engine import rng_state, set_rng_state
from ludic.training.checkpoint import load_model_weights, write_json_atomic

INDEX = "league.json"


@dataclass(frozen=True)
class Snapshot:
    """One frozen policy of the league."""

    name: str
    """Folder name under the league root, e.g. ``step_000010``."""
    step: int
    """Optimizer step of the policy when it was taken."""
    path: Path
    """Folder with the weights (``save_pretrained`` layout)."""


SnapshotClientFactory = Callable[[Snapshot], ChatClient]


class League:
    """Frozen snapshots of the policy on disk, at most ``max_size`` (the oldest is dropped).

    Args:
        root: folder of the league (created; an existing ``league.json`` is read, so a league
            reopened on the same run folder has its snapshots).
        max_size: snapshots kept.
        every: ``maybe_snapshot`` takes one when ``step % every == 0`` (step 0, the starting
            policy, included); 0 never.
        make_client: builds the ChatClient that plays a snapshot (``frozen_copy_clients``).
    """

    def __init__(
        self, root: str | Path, *, max_size: int = 4, every: int = 10, make_client: SnapshotClientFactory | None = None
    ) -> None:
        if max_size < 1:
            raise ValueError(f"League: max_size must be >= 1, got {max_size}")
        if every < 0:
            raise ValueError(f"League: every must be >= 0 (0: never), got {every}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_size = max_size
        self.every = every
        self.make_client = make_client
        self.snapshots: list[Snapshot] = []
        """Live snapshots, oldest first."""
        self._clients: dict[str, ChatClient] = {}
        index = self.root / INDEX
        if index.exists():
            self.load_state_dict(json.loads(index.read_text()))

    def __len__(self) -> int:
        return len(self.snapshots)

    def _snapshot(self, name: str, step: int) -> Snapshot:
        return Snapshot(name, int(step), self.root / name)

    def maybe_snapshot(self, model: Any, step: int) -> Snapshot | None:
        """Take a snapshot if one is due at ``step`` and not taken yet; returns it (else None)."""
        if not self.every or step % self.every or any(s.step == step for s in self.snapshots):
            return None
        return self.add(model, step)

    def add(self, model: Any, step: int) -> Snapshot:
        """Save ``model``'s weights as the snapshot of ``step`` and drop the oldest beyond ``max_size``.

        Written to a temporary folder and renamed, so a crash never leaves a half-written snapshot.
        """
        snap = self._snapshot(f"step_{step:06d}", step)
        tmp = self.root / f".tmp_{snap.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        shutil.rmtree(snap.path, ignore_errors=True)
        tmp.rename(snap.path)
        self.snapshots = sorted([s for s in self.snapshots if s.step != step] + [snap], key=lambda s: s.step)
        self._clients.pop(snap.name, None)
        for old in self.snapshots[: -self.max_size]:
            self._drop(old)
        self.snapshots = self.snapshots[-self.max_size:]
        self._write_index()
        return snap

    def _drop(self, snap: Snapshot) -> None:
        self._clients.pop(snap.name, None)
        shutil.rmtree(snap.path, ignore_errors=True)

    def _write_index(self) -> None:
        write_json_atomic(self.root / INDEX, self.state_dict())

    def client(self, snapshot: Snapshot) -> ChatClient:
        """The ChatClient playing ``snapshot`` (built on first use, then cached)."""
        if snapshot.name not in {s.name for s in self.snapshots}:
            raise KeyError(f"snapshot {snapshot.name!r} is not in the league at {self.root} "
                           f"(live: {[s.name for s in self.snapshots]})")
        if self.make_client is None:
            raise RuntimeError("League: no make_client given, so snapshots cannot play (see frozen_copy_clients)")
        if snapshot.name not in self._clients:
            self._clients[snapshot.name] = self.make_client(snapshot)
        return self._clients[snapshot.name]

    def state_dict(self) -> dict[str, Any]:
        """The live snapshots (names and steps), oldest first."""
        return {"snapshots": [{"name": s.name, "step": s.step} for s in self.snapshots]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep the listed snapshots still on disk (missing ones are dropped with a warning) and
        delete snapshot folders not listed (taken after the checkpoint this state comes from)."""
        listed = [self._snapshot(s["name"], s["step"]) for s in state.get("snapshots", [])]
        missing = [s.name for s in listed if not s.path.is_dir()]
        if missing:
            warnings.warn(f"League at {self.root}: snapshots {missing} are listed but gone from disk; dropped them",
                          stacklevel=2)
        self.snapshots = [s for s in listed if s.path.is_dir()]
        keep = {s.name for s in self.snapshots}
        for folder in self.root.glob("step_*"):
            if folder.is_dir() and folder.name not in keep:
                shutil.rmtree(folder, ignore_errors=True)
        self._clients = {k: v for k, v in self._clients.items() if k in keep}
        self._write_index()


def frozen_copy_clients(model: Any, tokenizer: Any, **engine_kwargs: Any) -> SnapshotClientFactory:
    """``make_client`` for a League: each snapshot plays through its own ``TransformersEngine`` on
    a frozen copy of ``model`` (same architecture and base weights, LoRA or not) into which the
    snapshot's weights are loaded. The copy's tokens are tagged with the snapshot's step."""

    def make(snapshot: Snapshot) -> ChatClient:
        from ludic.inference.models import unwrap
        from ludic.inference.transformers_engine import TransformersEngine

        frozen = copy.deepcopy(unwrap(model))
        for p in frozen.parameters():
            p.requires_grad_(False)
            p.grad = None
        load_model_weights(frozen, snapshot.path)
        frozen.eval()
        engine = TransformersEngine(frozen, tokenizer, **engine_kwargs)
        engine.policy_version = snapshot.step
        return engine

    return make


def parse_mixture(text: str, allowed: Iterable[str] | None = None) -> dict[str, float]:
    """``"self:0.4,league:0.3,minimax:0.2,random:0.1"`` -> normalised weights (a bare name weighs 1).

    Raises ValueError naming the bad entry: an unknown name (when ``allowed`` is given), a
    repeated name, a weight that is not a non-negative number, or weights summing to 0.
    """
    allowed = None if allowed is None else set(allowed)
    weights: dict[str, float] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, _, w = entry.partition(":")
        name = name.strip()
        try:
            weight = float(w) if w.strip() else 1.0
        except ValueError:
            raise ValueError(f"opponent mixture {text!r}: weight of {name!r} is not a number: {w!r}") from None
        if weight < 0 or weight != weight:
            raise ValueError(f"opponent mixture {text!r}: weight of {name!r} must be >= 0, got {w!r}")
        if allowed is not None and name not in allowed:
            raise ValueError(f"opponent mixture {text!r}: unknown opponent {name!r}; choose from {sorted(allowed)}")
        if name in weights:
            raise ValueError(f"opponent mixture {text!r}: {name!r} is given twice")
        weights[name] = weight
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"opponent mixture {text!r}: no opponent has a positive weight")
    return {k: v / total for k, v in weights.items() if v > 0}


@dataclass(frozen=True)
class OpponentDraw:
    """Who the policy plays in one episode (or GRPO group)."""

    kind: str
    """``"self"``, ``"league"`` or another name of the mixture (a built-in bot, by the recipe)."""
    seat: int
    """Index of the trained seat among the game's seats: successive draws of one kind cycle
    through them (0, 1, 0, ...), so every opponent kind meets the policy in every seat."""
    snapshot: Snapshot | None = None
    """The league member to play (kind ``"league"`` only)."""


class OpponentSampler:
    """Draws opponents from a mixture; ``"league"`` picks a snapshot uniformly.

    Args:
        mixture: weights by name, or text for ``parse_mixture``.
        league: needed when the mixture has ``"league"``; while it is empty, a ``"league"``
            draw is played as ``"self"``.
        seats: seats of the game (the trained seat cycles through them, per opponent kind).
        seed: seeds the draws (``state_dict`` keeps the RNG, so a resumed run draws the same).
    """

    def __init__(self, mixture: dict[str, float] | str, league: League | None = None, *, seats: int = 2,
                 seed: int = 0) -> None:
        self.mixture = parse_mixture(mixture) if isinstance(mixture, str) else dict(mixture)
        if "league" in self.mixture and league is None:
            raise ValueError("OpponentSampler: the mixture has 'league' but no League was given")
        self.league = league
        self.seats = seats
        self.rng = random.Random(seed)
        self.draws: dict[str, int] = {}
        """Draws so far, by kind (the next seat of a kind is its count modulo ``seats``)."""

    def draw(self) -> OpponentDraw:
        names = list(self.mixture)
        kind = self.rng.choices(names, weights=[self.mixture[n] for n in names])[0]
        seat = self.draws.get(kind, 0) % self.seats
        self.draws[kind] = self.draws.get(kind, 0) + 1
        if kind != "league":
            return OpponentDraw(kind, seat)
        assert self.league is not None
        if not self.league.snapshots:
            return OpponentDraw("self", seat)
        return OpponentDraw("league", seat, self.rng.choice(self.league.snapshots))

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rng": rng_state(self.rng), "draws": dict(self.draws)}
        if self.league is not None:
            state["league"] = self.league.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(self.rng, state["rng"])
        self.draws = {str(k): int(v) for k, v in state.get("draws", {}).items()}
        if self.league is not None and "league" in state:
            self.league.load_state_dict(state["league"])
