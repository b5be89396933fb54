"""The pipeline's wire format: a SAWItem as one Redis stream entry, no pickle.

An entry is a flat map of byte fields (what ``XADD`` stores):

* ``schema``: the format version (``SCHEMA``); a reader refuses any other.
* ``head``: JSON with the scalar fields (weight, episode_share, sampling settings, meta) and
  which per-token arrays follow.
* one field per array, raw little-endian bytes: ``prompt_ids`` / ``completion_ids`` /
  ``policy_versions`` as int32, ``logprobs`` / ``token_weights`` as float32, ``action_mask``
  as uint8.

Nothing in an entry can run code when read (JSON and fixed-width numbers only), and a broken
entry raises ``MalformedEntry`` naming the field, so a learner can skip and count it.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

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


def decode_item(fields: Mapping[bytes | str, bytes | str]) -> SAWItem:
    """Stream entry fields -> SAWItem; raises MalformedEntry for anything else."""
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
    try:
        scalars = {k: head[k] for k in _SCALARS}
        return SAWItem(**kw, **scalars, meta=head.get("meta") or {})
    except (KeyError, TypeError, ValueError) as e:
        raise MalformedEntry(f"not a valid SAWItem: {type(e).__name__}: {e}") from None
