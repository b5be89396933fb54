"""The pipeline's wire format: a SAWItem as one Redis stream entry, no pickle.

An entry is a flat map of byte fields (what ``XADD`` stores):

* ``schema``: the format version (``SCHEMA``); a reader refuses any other.
* ``head``: JSON with the scalar fields (weight, episode_share, sampling settings, meta) and
  which per-token arrays follow.
* one field per array, raw little-endian bytes: ``prompt_ids`` / ``completion_ids`` /
  ``policy_versions`` as int32, ``logprobs`` / ``token_weights`` as float32, ``action_mask``
  as uint8.

Nothing in an entry can run code when read (JSON and fixed-width numbers only), and a broken
entry raises ``MalformedEntry`` naming the field, so a learner can skip and count it. Broken means
meaning as well as shape: a non-finite float, a positive log-prob, a token id outside [0, vocab),
an empty prompt or completion, a mask value other than 0 / 1 or a mask that trains nothing, a
sampling setting out of range, a meta field of the wrong type or range (``META_FIELDS``: those the
learner reads, e.g. ``filtered_tokens_per_token``, and those ``build_saw_items`` and the actor write;
other meta keys, a user's own, pass as the JSON they are). The learner reads an unacknowledged entry
first after every restart, so one that decoded but could not train would crash it again on every resume.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping

import numpy as np

from ludic.types import SAWItem

SCHEMA = b"ludic.saw/1"

_ARRAYS: dict[str, str] = {  # field -> little-endian numpy dtype
    "prompt_ids": "<i4",
    "completion_ids": "<i4",
    "logprobs": "<f4",
    "policy_versions": "<i4",
    "action_mask": "<u1",
    "token_weights": "<f4",
}
_SCALARS = ("weight", "episode_share", "temperature", "top_p", "top_k")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


META_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    # read by the learner (PipelineBatchSource's batch meta, the value loss)
    "filtered_tokens_per_token": ("a finite number >= 0", lambda x: _finite(x) and x >= 0),
    "zero_var_group_share": ("a finite number in [0, 1]", lambda x: _finite(x) and 0 <= x <= 1),
    "total_reward": ("a finite number", _finite),
    "value_old": ("a finite number", _finite),
    "value_target": ("a finite number", _finite),
    # written by build_saw_items and the actor
    "reward": ("a finite number", _finite),
    "parse_error": ("true or false", lambda x: isinstance(x, bool)),
    "truncated": ("true or false", lambda x: isinstance(x, bool)),
    "terminated": ("true or false", lambda x: isinstance(x, bool)),
    "step_index": ("an integer >= 0", _count),
    "turns": ("an integer >= 1", lambda x: _count(x) and x >= 1),
    "rollout_id": ("a string", lambda x: isinstance(x, str)),
    "finish_reason": ("a string", lambda x: isinstance(x, str)),
    "actor": ("a string", lambda x: isinstance(x, str)),
    "group_id": ("a string or null", lambda x: x is None or isinstance(x, str)),
    "agent_id": ("a string or null", lambda x: x is None or isinstance(x, str)),
}
"""Meta field -> (what it must be, its check), for the fields an entry may carry; each present one is checked."""


class MalformedEntry(ValueError):
    """A stream entry that is not a SAWItem of this schema (the message names what is wrong)."""


def encode_item(item: SAWItem) -> dict[bytes, bytes]:
    """SAWItem -> stream entry fields."""
    head: dict[str, Any] = {k: getattr(item, k) for k in _SCALARS}
    head["meta"] = item.meta
    head["arrays"] = [k for k in _ARRAYS if getattr(item, k) is not None]
    out = {b"schema": SCHEMA, b"head": json.dumps(head, separators=(",", ":")).encode()}
    for k in head["arrays"]:
        out[k.encode()] = np.asarray(getattr(item, k), dtype=_ARRAYS[k]).tobytes()
    return out


def decode_item(fields: Mapping[bytes | str, bytes | str], vocab_size: int | None = None) -> SAWItem:
    """Stream entry fields -> SAWItem; raises MalformedEntry for anything else (see the module
    docstring; token ids are checked against ``vocab_size`` when given)."""
    f = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
    schema = f.get("schema")
    schema = schema.encode() if isinstance(schema, str) else schema
    if schema != SCHEMA:
        raise MalformedEntry(f"schema is {schema!r}, expected {SCHEMA!r}")
    try:
        head = json.loads(f["head"])
    except (KeyError, ValueError, TypeError) as e:
        raise MalformedEntry(f"head is missing or not JSON: {e}") from None
    if not isinstance(head, dict) or not isinstance(head.get("arrays"), list):
        raise MalformedEntry("head is not an object with an 'arrays' list")
    kw: dict[str, Any] = {}
    for k in head["arrays"]:
        if k not in _ARRAYS:
            raise MalformedEntry(f"unknown array field {k!r}")
        raw = f.get(k)
        if not isinstance(raw, bytes):
            raise MalformedEntry(f"array field {k!r} is missing")
        width = np.dtype(_ARRAYS[k]).itemsize
        if len(raw) % width:
            raise MalformedEntry(f"array field {k!r} has {len(raw)} bytes, not a multiple of {width}")
        kw[k] = tuple(np.frombuffer(raw, dtype=_ARRAYS[k]).tolist())
    for k in ("prompt_ids", "completion_ids"):
        if k not in kw:
            raise MalformedEntry(f"array field {k!r} is missing")
        if not kw[k]:
            raise MalformedEntry(f"array field {k!r} is empty")
        bad = [x for x in kw[k] if x < 0 or (vocab_size is not None and x >= vocab_size)]
        if bad:
            raise MalformedEntry(f"array field {k!r} has token id {bad[0]} outside [0, {vocab_size or 'vocab'})")
    for k in ("logprobs", "token_weights"):
        if k in kw and not all(math.isfinite(x) for x in kw[k]):
            raise MalformedEntry(f"array field {k!r} holds a non-finite value")
    if "logprobs" in kw and any(x > 1e-4 for x in kw["logprobs"]):
        raise MalformedEntry(f"array field 'logprobs' holds a positive log-probability {max(kw['logprobs'])}")
    if "action_mask" in kw:
        if any(x not in (0, 1) for x in kw["action_mask"]):
            raise MalformedEntry("array field 'action_mask' holds a value other than 0 and 1")
        if not any(kw["action_mask"]):
            raise MalformedEntry("array field 'action_mask' trains no token")
    try:
        scalars = {k: head[k] for k in _SCALARS}
    except KeyError as e:
        raise MalformedEntry(f"head has no {e.args[0]!r}") from None
    checks = {"weight": lambda x: _finite(x), "episode_share": lambda x: _finite(x) and 0 < x <= 1,
              "temperature": lambda x: _finite(x) and x > 0, "top_p": lambda x: _finite(x) and 0 < x <= 1,
              "top_k": lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 0}
    for k, ok in checks.items():
        if not ok(scalars[k]):
            raise MalformedEntry(f"head field {k!r} is out of range: {scalars[k]!r}")
    meta = head.get("meta") or {}
    if not isinstance(meta, dict):
        raise MalformedEntry(f"head field 'meta' is not an object: {type(meta).__name__}")
    for k, (what, ok) in META_FIELDS.items():
        if k in meta and not ok(meta[k]):
            raise MalformedEntry(f"meta field {k!r} must be {what}, got {meta[k]!r}")
    try:
        return SAWItem(**kw, **scalars, meta=meta)
    except (TypeError, ValueError) as e:
        raise MalformedEntry(f"not a valid SAWItem: {type(e).__name__}: {e}") from None

