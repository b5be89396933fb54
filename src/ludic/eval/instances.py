"""Held out means instances, not seeds.

An env seed picks an *instance* (a question, a secret number, a deal of cards), but many seeds can pick the same
one: reasoning-gym's ``products`` with one-digit factors has 100 distinct questions in 100,000 entries, GEM's easy
guess-the-number 10 secrets, one-round Kuhn poker 6 deals. A test set of "other seeds" is then a set of trained
instances. This module names instances and builds evaluation sets of distinct ones:

- ``instance_of(reset)``: the key of the instance a ``reset`` started: the ``"instance"`` its info gives (every
  Ludic adapter sets one: the question, the game's hidden state), else the first observation text. An env of your
  own whose hidden state (a secret) is not in its first observation should put ``info["instance"]`` in ``reset``.
- ``estimate_space(keys)``: the instance space's size from keys drawn at random (Chao1; exact once every key was
  seen twice).
- ``HeldOut``: the test and validation sets of distinct instances, disjoint from each other by content; the
  training draw skips their instances (``HeldOut.excludes``) when the space leaves room for that, and otherwise
  the result is labelled "trained instances", loudly; ``HeldOut.report`` counts how many test instances a run
  trained on.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

PROBE_RESETS = 2000
"""Training seeds reset to measure the instance space (``probe_space``), within ``PROBE_SECONDS``."""
PROBE_SECONDS = 20.0
ROOM = 2.0
"""The test and validation sets are held out only when the space holds ``ROOM`` times their instances: else
training would be left with too little (``products``: 96 of 100 questions held out would leave 4)."""


def state_key(state: Any) -> str:
    """A canonical text of the plain values (numbers, strings, booleans, and lists, sets and dicts of them) in
    ``state``: the key of an env's hidden state (a TextArena game's ``game_state``, a GEM env's attributes)."""

    def plain(v: Any) -> Any:
        if isinstance(v, (bool, int, float, str)) or v is None:
            return v
        if isinstance(v, (list, tuple)):
            items = [plain(x) for x in v]
            return None if any(x is _SKIP for x in items) else items
        if isinstance(v, (set, frozenset)):
            items = [plain(x) for x in v]
            return None if any(x is _SKIP for x in items) else sorted(items, key=repr)
        if isinstance(v, dict):
            out = {str(k): plain(x) for k, x in v.items()}
            return {k: x for k, x in out.items() if x is not _SKIP}
        return _SKIP

    mapping = state if isinstance(state, dict) else vars(state)
    return json.dumps({str(k): v for k, v in plain(mapping).items() if not str(k).startswith("_")}, sort_keys=True)


_SKIP = object()


def instance_of(reset: dict[str, tuple[str, Any]]) -> str:
    """The instance key of one ``env.reset(seed)`` result: the agents' ``info["instance"]`` (one shared key, or
    each agent's joined), else their first observations."""
    keys = sorted({str(info["instance"]) if isinstance(info, dict) and "instance" in info else str(obs)
                   for obs, info in reset.values()})
    return keys[0] if len(keys) == 1 else json.dumps(keys)


def estimate_space(keys: Sequence[str]) -> dict[str, Any]:
    """The instance space's size from ``keys`` drawn at random: ``distinct`` seen, and the Chao1 ``estimate``
    (distinct + f1^2 / (2 f2), f1 and f2 the keys seen once and twice), ``exact`` when no key was seen once."""
    counts = Counter(keys).values()
    f1, f2 = sum(c == 1 for c in counts), sum(c == 2 for c in counts)
    d = len(counts)
    est = d if f1 == 0 else d + (f1 * f1 / (2 * f2) if f2 else f1 * (f1 - 1) / 2)
    return {"probed": len(keys), "distinct": d, "estimate": int(round(est)), "exact": f1 == 0}


def probe_space(key_of: Callable[[int], str], rng: random.Random, limit: int = PROBE_RESETS,
                seconds: float = PROBE_SECONDS, high: int = 1_000_000_000) -> dict[str, Any]:
    """``estimate_space`` over up to ``limit`` training seeds below ``high`` drawn from ``rng`` (at most
    ``seconds`` of resets)."""
    keys, t0 = [], time.monotonic()
    while len(keys) < limit and (len(keys) < 50 or time.monotonic() - t0 < seconds):
        keys.append(key_of(rng.randrange(high)))
    return estimate_space(keys)


def distinct_seeds(key_of: Callable[[int], str], seeds: Iterable[int], n: int, exclude: set[str] = frozenset(),
                   max_tries: int = 0, seats: int = 1) -> list[tuple[int, str]]:
    """Up to ``n`` (seed, key) of distinct instances from ``seeds`` in order, none in ``exclude`` (at most
    ``max_tries`` seeds looked at, default 20 n). ``seats``: the episode at position i plays seat ``i % seats``
    (a two-player evaluation alternates the policy's seat), and an instance is distinct per seat: a game with
    one start (tic-tac-toe) gives one episode per seat."""
    out: list[tuple[int, str]] = []
    seen = {(k, s) for k in exclude for s in range(seats)}
    for tries, seed in enumerate(seeds, 1):
        if len(out) >= n or tries > (max_tries or 20 * n + 100):
            break
        key = key_of(seed)
        if (key, len(out) % seats) not in seen:
            seen.add((key, len(out) % seats))
            out.append((seed, key))
    return out


@dataclass
class HeldOut:
    """The held-out sets of a run: the test and validation seeds of distinct instances, their keys, the space."""

    test: list[tuple[int, str]]
    """(env seed, instance key) of each test episode."""
    val: list[tuple[int, str]]
    space: dict[str, Any]
    """``estimate_space`` of the training draw."""
    held_out: bool
    """Whether the training draw skips the test and validation instances (the space has room)."""
    asked: tuple[int, int] = (0, 0)
    """The test and validation episodes asked for."""
    trained: set[str] = field(default_factory=set)
    """The instances the run's training drew (``TrainingSeeds``)."""

    @property
    def excludes(self) -> set[str]:
        """The instances training must not draw (none when the space is too small to hold them out)."""
        return {k for _, k in self.test + self.val} if self.held_out else set()

    def report(self) -> dict[str, Any]:
        """``summary.json``'s ``instances``: the sets' sizes, the test instances trained on, the space, the label."""
        test = {k for _, k in self.test}
        out = {"test_distinct": len(test), "val_distinct": len({k for _, k in self.val}),
               "train_distinct": len(self.trained), "test_trained": len(test & self.trained),
               "space": self.space, "held_out": self.held_out,
               "label": "held out" if self.held_out and not test & self.trained else "trained instances"}
        out["note"] = self.note()
        return out

    def note(self) -> str:
        s, (n_test, n_val) = self.space, self.asked
        size = f"{s['estimate']} distinct instances{'' if s['exact'] else ' (estimated)'}"
        if not self.held_out:
            return (f"the instance space is too small to hold out {n_test} test + {n_val} validation instances: "
                    f"{size}, so training draws the test instances too (and a validation set short of distinct "
                    "instances repeats them); the result is on trained instances, not held out (fewer "
                    "--eval-episodes / --val-episodes, or a larger space, hold instances out)")
        short = [f"{name} {len(got)} of {want}" for name, got, want in (("test", self.test, n_test),
                                                                          ("validation", self.val, n_val))
                 if len(got) < want]
        return (f"{len(self.test)} test and {len(self.val)} validation instances, distinct and never trained on "
                f"({size})" + (f"; the eval split had fewer distinct instances than asked: {', '.join(short)}"
                               if short else ""))


def build_held_out(key_of: Callable[[int], str], train_key_of: Callable[[int], str], *, n_test: int, n_val: int,
                   test_seeds: Iterable[int], val_seeds: Iterable[int], rng: random.Random, seats: int = 1) -> HeldOut:
    """Test and validation sets of distinct instances (disjoint by content; ``key_of`` on the eval split's seeds;
    ``seats``: ``distinct_seeds``), and whether training (``train_key_of`` on its seeds) can skip them."""
    test = distinct_seeds(key_of, test_seeds, n_test, seats=seats)
    val = distinct_seeds(key_of, val_seeds, n_val, exclude={k for _, k in test}, seats=seats)
    space = probe_space(train_key_of, rng)
    room = space["estimate"] >= ROOM * (len(test) + len(val)) and not (space["exact"] and space["distinct"] <= len(test) + len(val))
    if not room and len(val) < n_val:  # nothing is held out; keep-best still needs its validation episodes: the
        val = [(s, key_of(s)) for s in itertools.islice(val_seeds, n_val)]  # asked ones, repeating instances
    # (the test set stays distinct: a repeated greedy episode of a deterministic game is no new measurement)
    return HeldOut(test, val, space, room, asked=(n_test, n_val))
